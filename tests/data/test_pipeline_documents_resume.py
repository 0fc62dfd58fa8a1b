"""`fp4lm train` with document masking on a raw JSONL corpus: an interrupted and resumed run is bit-identical
to an uninterrupted one, and masking changes what the model computes (so the batches did carry the layout)."""

from __future__ import annotations

import json
import random

import jax
import numpy as np
import pytest

from tests.reliability.helpers_reliability import (
    TINY_MODEL,
    assert_states_bit_equal,
    eval_records,
    restore_checkpoint,
    run_cli_in_process,
    train_records,
)

pytestmark = pytest.mark.slow

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "cats", "sing"]


def _corpus(path):
    rng = random.Random(0)
    lines = [json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 25)))}) for _ in range(400)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def compile_cache(tmp_path):
    """A persistent compilation cache that keeps even small programs, so only the first run compiles."""
    saved = {name: getattr(jax.config, name) for name in _CACHE_SETTINGS}
    for name in _CACHE_SETTINGS:
        jax.config.update(name, 0)
    yield tmp_path / "jax_cache"
    for name, value in saved.items():
        jax.config.update(name, value)


_CACHE_SETTINGS = ("jax_persistent_cache_min_compile_time_secs", "jax_persistent_cache_min_entry_size_bytes")


def _train(tmp_path, run_dir, steps, masking="true"):
    result = run_cli_in_process(
        "train",
        f"train.compilation_cache_dir={tmp_path / 'jax_cache'}",
        *TINY_MODEL,
        "data.tokenizer=byte",  # with its end-of-text token: documents end with it
        "data.seq_len=32",
        "train.batch_size=4",
        f"data.path={_corpus(tmp_path / 'docs.jsonl')}",
        f"data.document_masking={masking}",
        "precision.recipe=bf16",
        "metrics.log_every=1",
        "metrics.tensorboard=false",
        "metrics.progress=plain",
        "eval.batches=1",
        "eval.every=3",
        "eval.sample_tokens=0",
        "optimizer.warmup_steps=2",
        "checkpoint.every=3",
        f"train.run_dir={run_dir}",
        f"train.steps={steps}",
    )
    assert result.code == 0, result.stderr[-3000:]


def test_resume_with_document_masking_is_bit_exact(tmp_path, compile_cache):
    whole, halves, unmasked = tmp_path / "whole", tmp_path / "halves", tmp_path / "unmasked"
    _train(tmp_path, whole, 6)
    _train(tmp_path, halves, 3)
    _train(tmp_path, halves, 6)
    assert [r["step"] for r in train_records(halves)] == list(range(1, 7))
    assert train_records(halves) == train_records(whole)
    assert eval_records(halves) == eval_records(whole)
    a, b = restore_checkpoint(whole, 6), restore_checkpoint(halves, 6)
    assert_states_bit_equal(a["state"], b["state"])
    assert a["data_iter"] == b["data_iter"]

    _train(tmp_path, unmasked, 3, masking="false")
    masked_losses = [r["loss"] for r in train_records(whole)[:3]]
    assert not np.array_equal(masked_losses, [r["loss"] for r in train_records(unmasked)])
