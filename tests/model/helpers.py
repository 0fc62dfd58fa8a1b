"""Shared fixtures for the model tests: a tiny config and a plain (never quantizing) policy."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from fp4lm.config import ModelConfig
from fp4lm.model import Llama, collect_layer_stats, pop_layer_stats

TINY = ModelConfig(num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, mlp_dim=128, init_std=0.05)
VOCAB = 96


@dataclasses.dataclass(frozen=True)
class _NotQuantized:
    is_quantized: bool = False


@dataclasses.dataclass(frozen=True)
class PlainPolicy:
    """Every projection uses `lax.dot_general` itself: the reference unquantized model."""

    shared_weight_scale: bool = False
    attention: str = "bf16"  # precision.attention
    fp4_param_gather: bool = False

    def dot_general_for(self, path):
        def plain_dot(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, *, key=None):
            return lax.dot_general(
                lhs, rhs, dimension_numbers, precision=precision, preferred_element_type=preferred_element_type
            )

        return plain_dot

    def layer_seed(self, path):
        return 0

    def recipe_for(self, path):
        return _NotQuantized()


def tiny_model(policy, cfg: ModelConfig = TINY, seed: int = 0, vocab: int = VOCAB) -> Llama:
    """Llama(cfg, vocab, policy, rngs=nnx.Rngs(seed)); the parameters are drawn once per (cfg, seed, vocab)
    and reused, since they do not depend on the policy (initialisation compiles its RNG, slow on CPU)."""
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: Llama(cfg, vocab, policy, rngs=nnx.Rngs(seed))))
    return nnx.merge(graphdef, _initial_state(cfg, seed, vocab))


@functools.cache
def _initial_state(cfg: ModelConfig, seed: int, vocab: int):
    return nnx.state(Llama(cfg, vocab, PlainPolicy(), rngs=nnx.Rngs(seed)))


@nnx.jit
def forward(model: Llama, tokens_BT, quant_key=None):
    """The model's forward pass, jitted (eager op-by-op dispatch is far slower on CPU)."""
    return model(tokens_BT, quant_key=quant_key)


@nnx.jit
def forward_with_stats(model: Llama, tokens_BT, quant_key=None):
    """(logits, {layer path: telemetry}): the forward pass with the quantized layers' telemetry."""
    collect_layer_stats(model)
    logits = model(tokens_BT, quant_key=quant_key)
    stats = pop_layer_stats(model)
    collect_layer_stats(model, enabled=False)
    return logits, stats


def tokens(batch: int = 2, length: int = 16, seed: int = 0, vocab: int = VOCAB):
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, vocab, dtype=jnp.int32)
