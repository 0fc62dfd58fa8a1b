"""fp4lm's own forward pass over a parameter dict, under a given precision policy."""

from __future__ import annotations

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
