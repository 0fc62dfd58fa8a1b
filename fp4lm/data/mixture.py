"""Mixtures of several token sources (data.sources), sampled by weight with grain.

Each source's sequences are shuffled and repeated on their own; `grain.MapDataset.mix` interleaves them in
proportion to their weights, deterministically, so the stream is a pure function of the element index (a
resume is one integer) as for one source. The sources are laid end to end in one `ConcatenatedTokens` view,
each starting at a multiple of seq_len, so the pipeline's gather serves a mixture unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import grain
import numpy as np

from fp4lm.data.pipeline import TrainIterator, shard_of_global_batches

# Element k of grain's mix: which parent it comes from. grain's own rule (MixedMapDataset's selection map)
# turns float weights into integer proportions this way; `realised_counts` below repeats its arithmetic.
_GRAIN_SCALE_MIN_TO = 100


class ConcatenatedTokens:
    """Token views laid end to end, each starting at a multiple of `align`: `size`, `view[offsets]`
    (any integer array of offsets, which must fall inside a part) and the parts' `starts`."""

    def __init__(self, parts: Sequence, align: int = 1):
        self.parts = list(parts)
        starts, end = [], 0
        for part in self.parts:
            end = -(-end // align) * align
            starts.append(end)
            end += int(part.size)
        self.starts = np.asarray(starts, dtype=np.int64)
        self.size = end
        self.dtype = np.result_type(*[part.dtype for part in self.parts]) if self.parts else np.dtype(np.int32)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, offsets) -> np.ndarray:
        offsets = np.asarray(offsets, dtype=np.int64)
        out = np.empty(offsets.shape, dtype=self.dtype)
        part_of = np.searchsorted(self.starts, offsets, side="right") - 1
        for index in np.unique(part_of):
            mask = part_of == index
            local = offsets[mask] - self.starts[index]
            if local.size and local.max() >= self.parts[index].size:
                raise IndexError(f"offset beyond part {index} of a concatenated token view")
            out[mask] = self.parts[index][local]
        return out

    def document_starts(self, part_starts: Sequence[np.ndarray | None]) -> np.ndarray | None:
        """Every part's document starts, shifted to this view (None when a part has none)."""
        if any(starts is None for starts in part_starts):
            return None
        return np.concatenate(
            [np.asarray(s, dtype=np.int64) + base for s, base in zip(part_starts, self.starts, strict=True)]
        )


@dataclasses.dataclass(frozen=True)
class Mixture:
    """The sampling plan of a mixture: source names, their weights, and sequence counts."""

    names: tuple[str, ...]
    weights: tuple[float, ...]
    sequences: tuple[int, ...]  # training sequences per source

    @property
    def proportions(self) -> tuple[int, ...]:
        """grain's integer mixing proportions for these weights."""
        scale = _GRAIN_SCALE_MIN_TO / min(self.weights)
        return tuple(int(weight * scale) for weight in self.weights)

    def planned(self) -> dict[str, float]:
        """The fraction of sequences each source contributes, from the mixing plan."""
        total = sum(self.proportions)
        return {name: p / total for name, p in zip(self.names, self.proportions, strict=True)}

    def realised(self, num_elements: int) -> dict[str, int]:
        """How many of the first `num_elements` sequences of the stream came from each source."""
        return dict(zip(self.names, realised_counts(self.proportions, num_elements), strict=True))

    def describe(self, tokens_per_sequence: int) -> str:
        parts = [
            f"{name} {share:.1%} ({count * tokens_per_sequence:,} tokens)"
            for (name, share), count in zip(self.planned().items(), self.sequences, strict=True)
        ]
        return "mixture: " + ", ".join(parts)


def realised_counts(proportions: Sequence[int], num_elements: int) -> list[int]:
    """Per parent, how many of the first `num_elements` elements of grain's mix of parents with integer
    `proportions` it supplies. grain gives parent 0 the elements where floor(k * (R - p0) / R) steps
    (R = sum of proportions), and shares the rest among the other parents the same way, recursively."""
    counts, remaining, k = [], sum(proportions), num_elements
    for p in proportions:
        rest = (k * (remaining - p)) // remaining
        counts.append(k - rest)
        remaining, k = remaining - p, rest
    return counts


def make_mixture_iterator(
    view: ConcatenatedTokens,
    mixture: Mixture,
    seq_len: int,
    batch_size: int,
    seed: int,
    *,
    shard_index: int = 0,
    shard_count: int = 1,
    document_starts: np.ndarray | None = None,
) -> TrainIterator:
    """Endless training batches of this process's share of `batch_size`, sources drawn by `mixture`'s weights;
    `view` holds the sources' training tokens (aligned to seq_len), in the mixture's order."""
    shuffle_seed = int(seed) % 2**32
    parents = []
    for index, count in enumerate(mixture.sequences):
        first = int(view.starts[index]) // seq_len
        source_seed = (shuffle_seed + 7919 * (index + 1)) % 2**32  # a different permutation per source
        ids = grain.MapDataset.range(count).shuffle(seed=source_seed).repeat()
        parents.append(ids.map(lambda k, first=first: k + first))
    sequence_ids = grain.MapDataset.mix(parents, list(mixture.proportions))
    dataset = shard_of_global_batches(
        sequence_ids,
        view,
        seq_len,
        batch_size,
        shard_index=shard_index,
        shard_count=shard_count,
        document_starts=document_starts,
    )
    settings = {
        "seed": shuffle_seed,
        "seq_len": seq_len,
        "global_batch_size": batch_size,
        "num_sequences": sum(mixture.sequences),
    }
    return TrainIterator(dataset, settings)
