"""The grain pipeline: packing, seeded shuffling, resumable state, host sharding, eval batches, split."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fp4lm.data import pipeline
from tests.data.helpers_data import user_error

SEQ = 8
TOKENS = np.arange(1000, dtype=np.int32) * 3 + 1  # distinct values, so positions can be recovered


def _take(iterator, n):
    return [next(iterator) for _ in range(n)]


def _position(value):
    return (value - 1) // 3


def test_packing_shapes_dtype_and_target_shift():
    batch = next(pipeline.make_train_iterator(TOKENS, SEQ, 4, seed=0))
    assert set(batch) == {"inputs", "targets"}
    for value in batch.values():
        assert value.shape == (4, SEQ) and value.dtype == np.int32
    np.testing.assert_array_equal(batch["targets"][:, :-1], batch["inputs"][:, 1:])
    starts = _position(batch["inputs"][:, 0])
    assert np.all(starts % SEQ == 0)  # windows start on the packing grid
    np.testing.assert_array_equal(_position(batch["targets"]), starts[:, None] + np.arange(1, SEQ + 1))


def test_an_epoch_covers_every_sequence_once_then_reshuffles():
    count = pipeline.num_sequences(TOKENS.size, SEQ)
    assert count == (1000 - 1) // SEQ
    iterator = pipeline.make_train_iterator(TOKENS, SEQ, 1, seed=3)
    first = [int(_position(next(iterator)["inputs"][0, 0])) // SEQ for _ in range(count)]
    second = [int(_position(next(iterator)["inputs"][0, 0])) // SEQ for _ in range(count)]
    assert sorted(first) == sorted(second) == list(range(count))
    assert first != list(range(count)) and first != second


def test_shuffle_is_determined_by_seed():
    def starts(seed):
        return np.stack([b["inputs"][:, 0] for b in _take(pipeline.make_train_iterator(TOKENS, SEQ, 4, seed), 5)])

    np.testing.assert_array_equal(starts(7), starts(7))
    assert not np.array_equal(starts(7), starts(8))


def test_resume_from_json_state_gives_exactly_the_same_batches():
    uninterrupted = _take(pipeline.make_train_iterator(TOKENS, SEQ, 4, seed=1), 70)  # > one epoch (31 batches)
    first = pipeline.make_train_iterator(TOKENS, SEQ, 4, seed=1)
    _take(first, 37)
    state = json.loads(json.dumps(first.get_state()))
    resumed = pipeline.make_train_iterator(TOKENS, SEQ, 4, seed=1)
    resumed.set_state(state)
    for expected, got in zip(uninterrupted[37:], _take(resumed, 33), strict=False):
        np.testing.assert_array_equal(expected["inputs"], got["inputs"])
        np.testing.assert_array_equal(expected["targets"], got["targets"])


def test_state_from_other_settings_is_refused():
    state = pipeline.make_train_iterator(TOKENS, SEQ, 4, seed=1).get_state()
    other = pipeline.make_train_iterator(TOKENS, SEQ, 8, seed=1)
    user_error(lambda: other.set_state(state), "global_batch_size=4", "global_batch_size=8", "train.run_dir")
    user_error(lambda: other.set_state({"next_index": 3}), "not from fp4lm's pipeline")


@pytest.mark.parametrize("shard_count", [2, 4])
def test_shards_together_give_the_single_process_global_batch(shard_count):
    single = _take(pipeline.make_train_iterator(TOKENS, SEQ, 8, seed=5), 40)
    shards = [
        _take(pipeline.make_train_iterator(TOKENS, SEQ, 8, seed=5, shard_index=s, shard_count=shard_count), 40)
        for s in range(shard_count)
    ]
    for step, expected in enumerate(single):
        for key in ("inputs", "targets"):
            parts = [shards[s][step][key] for s in range(shard_count)]
            assert parts[0].shape == (8 // shard_count, SEQ)
            np.testing.assert_array_equal(np.concatenate(parts), expected[key])


def test_shard_state_is_the_global_position():
    shard = pipeline.make_train_iterator(TOKENS, SEQ, 8, seed=5, shard_index=1, shard_count=2)
    _take(shard, 3)
    assert shard.get_state() == pipeline.make_train_iterator(TOKENS, SEQ, 8, seed=5).get_state() | {
        "grain": shard.get_state()["grain"]
    }
    assert shard.get_state()["grain"] == {"next_index": 3}


def test_batch_not_dividing_over_processes_and_nonpositive_batch():
    user_error(
        lambda: pipeline.make_train_iterator(TOKENS, SEQ, 6, 0, shard_index=0, shard_count=4),
        "batch_size=6",
        "multiple of 4",
    )
    user_error(lambda: pipeline.make_train_iterator(TOKENS, SEQ, 0, 0), "must be positive")


def test_too_few_tokens_for_one_sequence():
    user_error(lambda: pipeline.make_train_iterator(TOKENS[:SEQ], SEQ, 1, 0), "8 tokens", "data.seq_len")
    user_error(lambda: pipeline.make_eval_batches(TOKENS[:SEQ], SEQ, 1, 1), "validation split", "val_fraction")


def test_eval_batches_are_fixed_in_order_and_shardable():
    batches = pipeline.make_eval_batches(TOKENS, SEQ, 4, 3)
    again = pipeline.make_eval_batches(TOKENS, SEQ, 4, 3)
    assert len(batches) == 3
    for a, b in zip(batches, again, strict=True):
        np.testing.assert_array_equal(a["inputs"], b["inputs"])
    starts = np.concatenate([_position(b["inputs"][:, 0]) for b in batches])
    np.testing.assert_array_equal(starts, np.arange(12) * SEQ)
    halves = [pipeline.make_eval_batches(TOKENS, SEQ, 4, 3, shard_index=s, shard_count=2) for s in range(2)]
    for step in range(3):
        np.testing.assert_array_equal(np.concatenate([h[step]["targets"] for h in halves]), batches[step]["targets"])


def test_eval_batches_capped_by_split_and_cycled_when_tiny():
    assert len(pipeline.make_eval_batches(TOKENS, SEQ, 4, 1000)) == pipeline.num_sequences(1000, SEQ) // 4
    tiny = TOKENS[: 3 * SEQ + 1]  # three sequences
    (batch,) = pipeline.make_eval_batches(tiny, SEQ, 5, 8)
    np.testing.assert_array_equal(_position(batch["inputs"][:, 0]) // SEQ, [0, 1, 2, 0, 1])
    assert pipeline.make_eval_batches(TOKENS, SEQ, 4, 0) == []
