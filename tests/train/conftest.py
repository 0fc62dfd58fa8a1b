"""Shared settings for trainer tests: a tiny model on the bundled corpus, one compilation cache per session."""

import pytest

TINY = [
    "model.num_layers=1",
    "model.d_model=32",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.mlp_dim=64",
    "data.tokenizer=byte",
    "data.vocab_size=256",
    "data.seq_len=16",
    "train.batch_size=4",
    "optimizer.warmup_steps=2",
    "metrics.log_every=1",
    "metrics.tensorboard=false",
    "metrics.progress=plain",
    "eval.batches=2",
    "eval.sample_tokens=4",
]


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory) -> str:
    """A JAX persistent compilation cache shared by this session's runs (and their subprocesses)."""
    return str(tmp_path_factory.mktemp("jax_cache"))


@pytest.fixture
def tiny(compile_cache):
    """Overrides for a tiny, fast training run: TINY plus the session's compilation cache."""
    return [*TINY, f"train.compilation_cache_dir={compile_cache}"]
