"""The pipeline's document layout: segment ids and positions from document start offsets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fp4lm.config import DataConfig
from fp4lm.data import corpus, pipeline

SEQ = 8
NUM_TOKENS = 203
TOKENS = np.arange(NUM_TOKENS, dtype=np.int32)  # token value == stream offset, so a window's offsets are its inputs
# Documents of lengths 1..13 (some shorter than a window, some longer), so windows hold 1 to several of them.
STARTS = np.cumsum([0, *(np.arange(60) % 13 + 1)])
STARTS = STARTS[STARTS < NUM_TOKENS].astype(np.int64)


def _expected_layout(offsets_T: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segment ids and positions of one window, token by token from the document starts."""
    segments, positions = [], []
    for t, offset in enumerate(offsets_T):
        document = max(i for i, start in enumerate(STARTS) if start <= offset)
        if t == 0:
            first_document = document
        segments.append(document - first_document + 1)
        positions.append(offset - max(STARTS[document], offsets_T[0]))
    return np.array(segments), np.array(positions)


def _check_batch(batch: dict) -> None:
    assert set(batch) == {"inputs", "targets", "segment_ids", "positions"}
    for value in batch.values():
        assert value.dtype == np.int32 and value.shape == batch["inputs"].shape
    for inputs_T, segments_T, positions_T in zip(
        batch["inputs"], batch["segment_ids"], batch["positions"], strict=True
    ):
        expected_segments, expected_positions = _expected_layout(inputs_T)
        np.testing.assert_array_equal(segments_T, expected_segments)
        np.testing.assert_array_equal(positions_T, expected_positions)
        # positions restart exactly where a new segment begins, and count up by one otherwise
        new_segment = np.diff(segments_T) == 1
        assert np.all(np.diff(segments_T) >= 0)
        np.testing.assert_array_equal(positions_T[1:][new_segment], 0)
        np.testing.assert_array_equal(np.diff(positions_T)[~new_segment], 1)
        assert segments_T[0] == 1 and positions_T[0] == 0


def test_segment_ids_and_positions_follow_document_starts_across_windows_and_epochs():
    count = pipeline.num_sequences(NUM_TOKENS, SEQ)
    iterator = pipeline.make_train_iterator(TOKENS, SEQ, 5, seed=2, document_starts=STARTS)
    batches = [next(iterator) for _ in range(2 * count // 5 + 1)]  # more than two epochs
    for batch in batches:
        _check_batch(batch)
    window_starts = np.concatenate([b["inputs"][:, 0] for b in batches])
    assert set(window_starts[:count]) == set(range(0, count * SEQ, SEQ))  # every window, each epoch
    # some windows hold several documents, some lie inside one
    segments_per_window = np.concatenate([b["segment_ids"].max(axis=1) for b in batches])
    assert segments_per_window.min() == 1 and segments_per_window.max() >= 3


def test_inputs_and_targets_are_unchanged_by_document_starts():
    plain = pipeline.make_train_iterator(TOKENS, SEQ, 4, seed=5)
    documents = pipeline.make_train_iterator(TOKENS, SEQ, 4, seed=5, document_starts=STARTS)
    for _ in range(7):
        a, b = next(plain), next(documents)
        assert set(a) == {"inputs", "targets"}
        np.testing.assert_array_equal(a["inputs"], b["inputs"])
        np.testing.assert_array_equal(a["targets"], b["targets"])


def test_resume_with_documents_is_exact_and_hosts_share_the_global_batch():
    iterator = pipeline.make_train_iterator(TOKENS, SEQ, 4, 1, document_starts=STARTS)
    uninterrupted = [next(iterator) for _ in range(12)]
    first = pipeline.make_train_iterator(TOKENS, SEQ, 4, 1, document_starts=STARTS)
    for _ in range(7):
        next(first)
    resumed = pipeline.make_train_iterator(TOKENS, SEQ, 4, 1, document_starts=STARTS)
    resumed.set_state(json.loads(json.dumps(first.get_state())))
    hosts = [
        pipeline.make_train_iterator(TOKENS, SEQ, 4, 1, shard_index=i, shard_count=2, document_starts=STARTS)
        for i in range(2)
    ]
    for step, expected in enumerate(uninterrupted):
        halves = [next(host) for host in hosts]
        got = next(resumed) if step >= 7 else None
        for key in expected:
            np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), expected[key])
            if got is not None:
                np.testing.assert_array_equal(got[key], expected[key])


def test_eval_batches_carry_the_layout():
    batches = pipeline.make_eval_batches(TOKENS, SEQ, 4, 3, document_starts=STARTS)
    assert len(batches) == 3
    for batch in batches:
        _check_batch(batch)


@pytest.mark.parametrize(
    "starts",
    [np.array([1, 5]), np.array([0, 5, 5]), np.array([0, NUM_TOKENS]), np.array([]), np.array([0.0, 4.0])],
    ids=["not-from-0", "repeated", "past-the-end", "empty", "float"],
)
def test_bad_document_starts_are_refused(starts):
    with pytest.raises(ValueError, match="document_starts"):
        pipeline.make_train_iterator(TOKENS, SEQ, 4, 0, document_starts=starts)


def test_raw_documents_end_with_eos_and_their_starts_survive_the_token_cache(tmp_path):
    texts = [f"document {i}: " + "words " * (i % 5) for i in range(30)]
    source = tmp_path / "docs.jsonl"
    source.write_text("\n".join(json.dumps({"text": text}) for text in texts) + "\n")
    cfg = DataConfig(path=str(source), tokenizer="byte", seq_len=SEQ, val_fraction=0.2)
    loaded = corpus.load_corpus(cfg, run_dir=None)
    eos = loaded.tokenizer.eos_id
    assert eos is not None
    documents = []
    for split, tokens in (("train", loaded.train_tokens), ("val", loaded.val_tokens)):
        tokens = np.asarray(tokens)
        starts = loaded.document_starts(split)
        assert starts is not None
        pipeline.check_document_starts(starts, tokens.size)
        ends = np.append(starts[1:], tokens.size)
        np.testing.assert_array_equal(np.flatnonzero(tokens == eos), ends - 1)  # one EOS, at each document's end
        documents += [loaded.tokenizer.decode(tokens[a : b - 1]) for a, b in zip(starts, ends, strict=True)]
    # every document once, whole: the held-out ones in the validation split (see test_held_out_documents.py)
    assert sorted(documents) == sorted(texts)
    assert loaded.num_val_tokens > 0

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    corpus.save_corpus(loaded, run_dir)
    cached = corpus.load_corpus(cfg, run_dir=run_dir)
    for split in ("train", "val"):
        np.testing.assert_array_equal(cached.document_starts(split), loaded.document_starts(split))


def test_masking_without_an_end_of_text_token_uses_the_document_index(tmp_path):
    """The 256-id byte tokenizer has no EOS, yet data.document_masking=true still separates
    documents: by the starts the prepared shards record, not by an EOS token."""
    import dataclasses

    from fp4lm.data.training_data import build

    source = tmp_path / "docs.jsonl"  # every document starts with "<", which appears nowhere else
    source.write_text("".join(json.dumps({"text": "<" + "word " * (1 + i % 9)}) + "\n" for i in range(400)))
    cfg = dataclasses.replace(
        DataConfig(), path=str(source), tokenizer="byte", vocab_size=256, seq_len=32, document_masking=True
    )
    data = build(cfg, run_dir=None, seed=0, batch_size=4)
    assert data.tokenizer.eos_id is None
    batch = next(iter(data.train_iterator))
    assert batch["segment_ids"].max() > 1  # windows hold several documents, kept apart
    for inputs_T, segments_T, positions_T in zip(
        batch["inputs"], batch["segment_ids"], batch["positions"], strict=True
    ):
        new_document = [t for t in range(1, 32) if segments_T[t] != segments_T[t - 1]]
        assert new_document == [t for t in range(1, 32) if inputs_T[t] == ord("<")]
        assert all(positions_T[t] == 0 for t in new_document)
