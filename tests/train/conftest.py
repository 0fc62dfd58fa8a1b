"""Shared settings for trainer tests: a tiny model on the bundled corpus, one compilation cache per session;
and the trained run that the dry run of an existing run reads (tests/trained_runs.py)."""

import pytest

from fp4lm.config.tiny import TINY_DATA, TINY_MODEL
from tests.trained_runs import trained_run

__all__ = ["trained_run"]

# The tiny run (fp4lm.config.tiny) with half its sequence length: the trainer's tests take many short runs.
TINY = [
    *TINY_MODEL,
    *TINY_DATA,
    "data.seq_len=16",
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
