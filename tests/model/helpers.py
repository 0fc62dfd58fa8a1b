"""Shared fixtures for the model tests: a tiny config and a plain (never quantizing) policy."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from fp4lm.config import ModelConfig
from fp4lm.model import Llama

TINY = ModelConfig(num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, mlp_dim=128, init_std=0.05)
VOCAB = 96


@dataclasses.dataclass(frozen=True)
class _NotQuantized:
    is_quantized: bool = False


@dataclasses.dataclass(frozen=True)
class PlainPolicy:
    """Every projection uses `lax.dot_general` itself: the reference unquantized model."""

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


@nnx.jit(static_argnames=("collect_stats",))
def forward(model: Llama, tokens_BT, quant_key=None, activation_poison=None, collect_stats=False):
    """The model's forward pass, jitted (eager op-by-op dispatch is far slower on CPU)."""
    return model(tokens_BT, quant_key=quant_key, activation_poison=activation_poison, collect_stats=collect_stats)


def tokens(batch: int = 2, length: int = 16, seed: int = 0, vocab: int = VOCAB):
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, vocab, dtype=jnp.int32)


# --- TEMPORARY stand-in until fp4lm.quant.dot lands (replaced by the real Policy) -----------------
import zlib  # noqa: E402

import jax  # noqa: E402
from jax.ad_checkpoint import checkpoint_name  # noqa: E402


@dataclasses.dataclass(frozen=True)
class _Quantized:
    is_quantized: bool = True


def _fake_quantize(x):
    scale = jnp.max(jnp.abs(x.astype(jnp.float32))) / 6.0
    q = (jnp.round(x.astype(jnp.float32) / scale * 2) / 2 * scale).astype(x.dtype)
    return checkpoint_name(x + lax.stop_gradient(q - x), "fp4lm_quantized")


@dataclasses.dataclass(frozen=True)
class StandInPolicy:
    recipe: str = "nvfp4"
    num_layers: int = 2
    bf16_first_layers: int = 0

    def _quantized(self, path):
        return self.recipe != "bf16" and int(path.split(".")[1]) >= self.bf16_first_layers

    def dot_general_for(self, path):
        quantized = self._quantized(path)

        def dot(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, *, key=None):
            if quantized:
                lhs, rhs = _fake_quantize(lhs), _fake_quantize(rhs)
            return lax.dot_general(lhs, rhs, dimension_numbers, preferred_element_type=preferred_element_type)

        return dot

    def layer_seed(self, path):
        return zlib.crc32(path.encode()) & 0x7FFFFFFF

    def recipe_for(self, path):
        return _Quantized() if self._quantized(path) else _NotQuantized()

    @classmethod
    def bf16(cls, num_layers=0):
        return cls("bf16", num_layers=num_layers)
