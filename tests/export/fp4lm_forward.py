"""fp4lm's own forward pass over a parameter dict, under a given precision policy."""

from __future__ import annotations

import sys

import jax.numpy as jnp
import numpy as np
from flax import nnx

from fp4lm.config import Config
from fp4lm.quant import Policy
from fp4lm.train import model_setup


def logits(config: Config, params: dict, tokens: np.ndarray, policy: Policy | None = None) -> np.ndarray:
    """Logits [T, V] (float32) of one sequence; `policy` None: every layer in bf16."""
    vocab = int(params["embed"]["table"].shape[0])
    policy = policy or Policy.bf16(config.model.num_layers)
    model = model_setup.abstract_model(config, vocab, policy)
    merged = nnx.merge(model_setup.graphdef_of(model), params)
    return np.asarray(merged(jnp.asarray(tokens, jnp.int32)[None]))[0]


def compute_in_float32(monkeypatch) -> list:
    """fp4lm computes in bfloat16; for a float32-exact comparison with a float32 consumer its compute dtype is
    float32 in every model module that reads it (found, so that moving a layer between modules cannot skip one).
    Returns those modules."""
    readers = [m for name, m in sys.modules.items() if name.startswith("fp4lm.model") and hasattr(m, "COMPUTE_DTYPE")]
    for module in readers:
        monkeypatch.setattr(module, "COMPUTE_DTYPE", jnp.float32)
    return readers
