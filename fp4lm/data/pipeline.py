"""The grain input pipeline: pack a token stream into sequences, shuffle by seed, batch, shard by host.

Sequence k is the window tokens[k*T : k*T + T + 1] (T = seq_len); inputs = window[:-1], targets = window[1:].
With the documents' start offsets, a window also carries segment_ids (1 for the document it starts in, 2 for
the next, ...) and positions (distance from the document's start, or from the window's start), int32 [T], so
attention stays inside each document and RoPE restarts there (fp4lm.model.blocks). Windows are never padded.

Order: `grain.MapDataset.range(n).shuffle(seed).repeat()`, a fresh permutation per epoch; global batch i is
elements [i*B, (i+1)*B) and process s of N takes rows [s*B/N, (s+1)*B/N). Fixed windows rather than grain's
packers because they are a pure function of the sequence index: random access, a resume that is one integer,
and the same global batch however many hosts share it.
"""

from __future__ import annotations

from typing import Any, Protocol, overload

import grain
import numpy as np

from fp4lm.errors import UserError


class TokenStream(Protocol):
    """What the pipeline reads: a 1-D token array, or a view of one (fp4lm.data.prepared.TokenView,
    fp4lm.data.mixture.ConcatenatedTokens)."""

    @property
    def size(self) -> int: ...

    def __getitem__(self, offsets: np.ndarray, /) -> np.ndarray: ...


_STATE_FIELDS = ("seed", "seq_len", "global_batch_size", "num_sequences")
# The setting that changes each recorded field (the number of sequences changes with the corpus).
_STATE_FIELD_SETTINGS = {
    "seed": "seed",
    "seq_len": "seq_len",
    "global_batch_size": "batch_size",
    "num_sequences": "path",
}


def num_sequences(num_tokens: int, seq_len: int) -> int:
    """How many windows of seq_len + 1 tokens (stride seq_len) fit in `num_tokens`."""
    return max(0, (num_tokens - 1) // seq_len)


def check_document_starts(document_starts: np.ndarray, num_tokens: int) -> None:
    """Document start offsets must be 1-D integers, start at 0, increase strictly, and lie in the stream."""
    starts = np.asarray(document_starts)
    if starts.ndim != 1 or starts.size == 0 or not np.issubdtype(starts.dtype, np.integer):
        raise ValueError(f"document_starts must be a non-empty 1-D integer array, got {starts.dtype} {starts.shape}")
    if starts[0] != 0 or starts[-1] >= num_tokens or np.any(np.diff(starts) <= 0):
        raise ValueError(f"document_starts must start at 0 and increase strictly below {num_tokens} tokens")


def document_layout(document_starts: np.ndarray, offsets_NT: np.ndarray) -> dict[str, np.ndarray]:
    """{"segment_ids", "positions"}: int32 [N, T] for windows of stream offsets `offsets_NT` (see module doc)."""
    document_NT = np.searchsorted(document_starts, offsets_NT, side="right") - 1
    segment_ids = document_NT - document_NT[:, :1] + 1
    starts_NT = np.maximum(np.asarray(document_starts)[document_NT], offsets_NT[:, :1])
    return {"segment_ids": segment_ids.astype(np.int32), "positions": (offsets_NT - starts_NT).astype(np.int32)}


def _gather(
    tokens: TokenStream, sequence_ids: np.ndarray, seq_len: int, document_starts: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """{"inputs", "targets"}: int32 [len(ids), seq_len] from windows of tokens at ids * seq_len; with
    `document_starts`, also the inputs' {"segment_ids", "positions"} (int32, same shape)."""
    offsets = sequence_ids.astype(np.int64)[:, None] * seq_len + np.arange(seq_len + 1, dtype=np.int64)
    windows = np.asarray(tokens[offsets], dtype=np.int32)
    batch = {"inputs": windows[:, :-1], "targets": windows[:, 1:]}
    if document_starts is not None:
        batch.update(document_layout(document_starts, offsets[:, :-1]))
    return batch


def _local_batch_size(batch_size: int, shard_index: int, shard_count: int) -> int:
    if batch_size <= 0:
        raise UserError(f"batch_size={batch_size} must be positive; e.g. 16", settings=("batch_size",))
    if shard_count <= 0 or not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index={shard_index} must lie in [0, shard_count={shard_count})")
    if batch_size % shard_count:
        raise UserError(
            f"batch_size={batch_size} does not divide over {shard_count} processes; use a multiple of {shard_count}",
            settings=("batch_size",),
        )
    return batch_size // shard_count


class _ShardOfGlobalBatches(grain.MapDataset[dict[str, np.ndarray]]):
    """Element i: this process's rows of global batch i, gathered from the token stream."""

    def __init__(
        self,
        sequence_ids: grain.MapDataset,
        tokens: TokenStream,
        seq_len: int,
        global_batch_size: int,
        shard_index: int,
        shard_count: int,
        document_starts: np.ndarray | None,
    ):
        super().__init__(sequence_ids)
        self._tokens = tokens
        self._document_starts = document_starts
        self._seq_len = seq_len
        self._global_batch_size = global_batch_size
        self._local_batch_size = global_batch_size // shard_count
        self._first_row = shard_index * self._local_batch_size

    def __len__(self) -> int:
        return len(self._parent) // self._global_batch_size

    def __str__(self) -> str:
        return f"ShardOfGlobalBatches(global={self._global_batch_size}, local={self._local_batch_size})"

    @overload
    def __getitem__(self, index: slice) -> grain.MapDataset[dict[str, np.ndarray]]: ...

    @overload
    def __getitem__(self, index: int) -> dict[str, np.ndarray]: ...

    def __getitem__(self, index: int | slice) -> grain.MapDataset[dict[str, np.ndarray]] | dict[str, np.ndarray]:
        if isinstance(index, slice):
            return self.slice(index)
        first = index * self._global_batch_size + self._first_row
        ids = np.array([self._parent[first + row] for row in range(self._local_batch_size)], dtype=np.int64)
        return _gather(self._tokens, ids, self._seq_len, self._document_starts)


def shard_of_global_batches(
    sequence_ids: grain.MapDataset,
    tokens: TokenStream,
    seq_len: int,
    global_batch_size: int,
    *,
    shard_index: int = 0,
    shard_count: int = 1,
    document_starts: np.ndarray | None = None,
) -> grain.MapDataset[dict[str, np.ndarray]]:
    """Element i: this process's rows of global batch i, the sequences `sequence_ids[i*B : (i+1)*B]` (B =
    `global_batch_size`) gathered from `tokens` (with their document layout given `document_starts`). Refuses
    a batch size that does not divide over the processes."""
    _local_batch_size(global_batch_size, shard_index, shard_count)
    return _ShardOfGlobalBatches(
        sequence_ids, tokens, seq_len, global_batch_size, shard_index, shard_count, document_starts
    )


class TrainIterator:
    """Endless iterator of training batches {"inputs", "targets"} (and, with document starts,
    {"segment_ids", "positions"}): int32 [local_batch, seq_len].

    `get_state()` is a small JSON-serialisable dict (grain's position plus the settings it depends on);
    `set_state(state)` resumes exactly there and refuses a state made with other data settings.
    """

    def __init__(self, dataset: grain.MapDataset, settings: dict[str, int]):
        self._dataset = dataset
        self._settings = dict(settings)
        self._iterator = self._new_grain_iterator()

    def _new_grain_iterator(self):
        # No background threads: a batch is one numpy gather, far cheaper than a training step.
        options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
        return iter(self._dataset.to_iter_dataset(options))

    def __iter__(self) -> TrainIterator:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        return next(self._iterator)

    def get_state(self) -> dict[str, Any]:
        return {"grain": self._iterator.get_state(), **self._settings}

    def set_state(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or "grain" not in state:
            raise UserError(
                "the checkpointed data-iterator state is not from fp4lm's pipeline; use a new run directory",
                settings=("run_dir",),
            )
        for field in _STATE_FIELDS:
            saved, now = state.get(field), self._settings[field]
            if saved != now:
                raise UserError(
                    f"the training data changed since the checkpoint: it gave {saved} sequences of seq_len="
                    f"{self._settings['seq_len']}, now {now}; put back the data the run was trained on to resume, "
                    "or train on this data in a new run directory"
                    if field == "num_sequences"
                    else f"the checkpoint's data position was made with {field}={saved}, but this run has "
                    f"{field}={now}; resume with the same data/batch settings or use a new run directory",
                    settings=(_STATE_FIELD_SETTINGS[field], "run_dir"),
                )
        self._iterator.set_state(state["grain"])


def make_train_iterator(
    tokens: TokenStream,
    seq_len: int,
    batch_size: int,
    seed: int,
    *,
    shard_index: int = 0,
    shard_count: int = 1,
    document_starts: np.ndarray | None = None,
) -> TrainIterator:
    """Shuffled, endlessly repeating training batches of this process's share of `batch_size` (global).

    `document_starts`: pass them (data.document_masking) for batches with segment ids and positions.
    """
    _local_batch_size(batch_size, shard_index, shard_count)  # a refused batch size before the corpus's size
    count = num_sequences(tokens.size, seq_len)
    if count < 1:
        raise UserError(
            f"the training split has {tokens.size} tokens, fewer than one sequence of seq_len+1={seq_len + 1}; "
            "use a larger corpus or a smaller sequence length",
            settings=("seq_len",),
        )
    if document_starts is not None:
        check_document_starts(document_starts, tokens.size)
    shuffle_seed = int(seed) % 2**32
    sequence_ids = grain.MapDataset.range(count).shuffle(seed=shuffle_seed).repeat()
    dataset = shard_of_global_batches(
        sequence_ids,
        tokens,
        seq_len,
        batch_size,
        shard_index=shard_index,
        shard_count=shard_count,
        document_starts=document_starts,
    )
    settings = {"seed": shuffle_seed, "seq_len": seq_len, "global_batch_size": batch_size, "num_sequences": count}
    return TrainIterator(dataset, settings)


def make_eval_batches(
    tokens: TokenStream,
    seq_len: int,
    batch_size: int,
    num_batches: int,
    *,
    shard_index: int = 0,
    shard_count: int = 1,
    document_starts: np.ndarray | None = None,
) -> list[dict[str, np.ndarray]]:
    """The same evaluation batches every time: validation sequences in order, no shuffle.

    Gives min(num_batches, count // batch_size) full global batches of distinct sequences; when the
    split holds fewer than `batch_size` sequences, one batch that cycles through them.
    `document_starts`: as for `make_train_iterator`.
    """
    local = _local_batch_size(batch_size, shard_index, shard_count)
    count = num_sequences(tokens.size, seq_len)
    if count < 1:
        raise UserError(
            f"the validation split has {tokens.size} tokens, fewer than one sequence of seq_len+1={seq_len + 1}; "
            "use a larger validation fraction or a smaller sequence length",
            settings=("val_fraction", "seq_len"),
        )
    if document_starts is not None:
        check_document_starts(document_starts, tokens.size)
    batches = min(num_batches, max(1, count // batch_size))
    out = []
    for batch in range(batches):
        first = batch * batch_size + shard_index * local
        ids = np.arange(first, first + local, dtype=np.int64) % count
        out.append(_gather(tokens, ids, seq_len, document_starts))
    return out
