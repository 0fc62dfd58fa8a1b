"""One decoder block: RMSNorm -> grouped-query attention with RoPE -> residual, RMSNorm -> SwiGLU -> residual.

The seven projections (attn q, k, v, o and mlp gate, up, down) are QuantLinear layers whose matmul the
precision policy picks by path (`blocks.{i}.attn.q`, ...). The attention score (QKᵀ) and value
(scores·V) matmuls stay in bfloat16 with float32 accumulation; softmax is float32.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lm.config import ModelConfig
from fp4lm.model.layers import COMPUTE_DTYPE, QuantLinear, RMSNorm, apply_rope, rope_angles

ATTENTION_PROJECTIONS = ("q", "k", "v", "o")
MLP_PROJECTIONS = ("gate", "up", "down")


def head_dim_of(cfg: ModelConfig) -> int:
    return cfg.head_dim or cfg.d_model // cfg.num_heads


def output_init_std(cfg: ModelConfig) -> float:
    """GPT-2's scaling for projections that write into the residual stream: std / sqrt(2 * layers)."""
    return cfg.init_std / math.sqrt(2 * cfg.num_layers)


def _merge_stats(into: dict, path: str, stats: dict | None) -> None:
    if stats is not None:
        into[path] = stats


class Attention(nnx.Module):
    """Causal grouped-query attention: H query heads share K key/value heads in groups of G = H / K."""

    def __init__(self, cfg: ModelConfig, *, prefix: str, policy: Any, rngs: nnx.Rngs):
        assert cfg.num_heads % cfg.num_kv_heads == 0, (cfg.num_heads, cfg.num_kv_heads)
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = head_dim_of(cfg)
        self.rope_theta = cfg.rope_theta
        query_width = cfg.num_heads * self.head_dim
        kv_width = cfg.num_kv_heads * self.head_dim

        def linear(name, n_in, n_out, axes, std):
            return QuantLinear(
                n_in, n_out, path=f"{prefix}.{name}", policy=policy, logical_axes=axes, init_std=std, rngs=rngs
            )

        self.q = linear("q", cfg.d_model, query_width, ("embed", "heads"), cfg.init_std)
        self.k = linear("k", cfg.d_model, kv_width, ("embed", "kv_heads"), cfg.init_std)
        self.v = linear("v", cfg.d_model, kv_width, ("embed", "kv_heads"), cfg.init_std)
        self.o = linear("o", query_width, cfg.d_model, ("heads", "embed"), output_init_std(cfg))

    def __call__(self, x_BTD: jax.Array, *, quant_key=None, collect_stats: bool = False) -> tuple[jax.Array, dict]:
        batch, length, _ = x_BTD.shape
        H, K, E = self.num_heads, self.num_kv_heads, self.head_dim
        G = H // K
        stats: dict = {}
        q_BTN, s = self.q(x_BTD, quant_key=quant_key, collect_stats=collect_stats)
        _merge_stats(stats, self.q.path, s)
        k_BSN, s = self.k(x_BTD, quant_key=quant_key, collect_stats=collect_stats)
        _merge_stats(stats, self.k.path, s)
        v_BSN, s = self.v(x_BTD, quant_key=quant_key, collect_stats=collect_stats)
        _merge_stats(stats, self.v.path, s)

        angles_TF = rope_angles(jnp.arange(length), E, self.rope_theta)
        q_BTHE = apply_rope(q_BTN.reshape(batch, length, H, E), angles_TF)
        k_BSKE = apply_rope(k_BSN.reshape(batch, length, K, E), angles_TF)
        v_BSKE = v_BSN.reshape(batch, length, K, E)

        # Query head h = k * G + g uses key/value head k.
        q_BTKGE = q_BTHE.reshape(batch, length, K, G, E)
        scores_BKGTS = jnp.einsum("btkge,bske->bkgts", q_BTKGE, k_BSKE, preferred_element_type=jnp.float32)
        scores_BKGTS = scores_BKGTS / math.sqrt(E)
        causal_TS = jnp.tril(jnp.ones((length, length), dtype=bool))
        scores_BKGTS = jnp.where(causal_TS, scores_BKGTS, jnp.finfo(jnp.float32).min)
        probs_BKGTS = jax.nn.softmax(scores_BKGTS, axis=-1).astype(COMPUTE_DTYPE)
        out_BTKGE = jnp.einsum("bkgts,bske->btkge", probs_BKGTS, v_BSKE, preferred_element_type=jnp.float32)
        out_BTN = out_BTKGE.astype(COMPUTE_DTYPE).reshape(batch, length, H * E)

        y_BTD, s = self.o(out_BTN, quant_key=quant_key, collect_stats=collect_stats)
        _merge_stats(stats, self.o.path, s)
        return y_BTD, stats


class SwiGLU(nnx.Module):
    """down( silu(x @ gate) * (x @ up) ); the product is formed in float32 and rounded to bfloat16."""

    def __init__(self, cfg: ModelConfig, *, prefix: str, policy: Any, rngs: nnx.Rngs):
        def linear(name, n_in, n_out, axes, std):
            return QuantLinear(
                n_in, n_out, path=f"{prefix}.{name}", policy=policy, logical_axes=axes, init_std=std, rngs=rngs
            )

        self.gate = linear("gate", cfg.d_model, cfg.mlp_dim, ("embed", "mlp"), cfg.init_std)
        self.up = linear("up", cfg.d_model, cfg.mlp_dim, ("embed", "mlp"), cfg.init_std)
        self.down = linear("down", cfg.mlp_dim, cfg.d_model, ("mlp", "embed"), output_init_std(cfg))

    def __call__(self, x_BTD: jax.Array, *, quant_key=None, collect_stats: bool = False) -> tuple[jax.Array, dict]:
        stats: dict = {}
        gate_BTF, s = self.gate(x_BTD, quant_key=quant_key, collect_stats=collect_stats)
        _merge_stats(stats, self.gate.path, s)
        up_BTF, s = self.up(x_BTD, quant_key=quant_key, collect_stats=collect_stats)
        _merge_stats(stats, self.up.path, s)
        hidden_BTF = jax.nn.silu(gate_BTF.astype(jnp.float32)) * up_BTF.astype(jnp.float32)
        y_BTD, s = self.down(hidden_BTF.astype(COMPUTE_DTYPE), quant_key=quant_key, collect_stats=collect_stats)
        _merge_stats(stats, self.down.path, s)
        return y_BTD, stats


class Block(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, index: int, *, policy: Any, rngs: nnx.Rngs):
        prefix = f"blocks.{index}"
        self.attn_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg, prefix=f"{prefix}.attn", policy=policy, rngs=rngs)
        self.mlp_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg, prefix=f"{prefix}.mlp", policy=policy, rngs=rngs)

    def linear_paths(self) -> list[str]:
        return [getattr(self.attn, n).path for n in ATTENTION_PROJECTIONS] + [
            getattr(self.mlp, n).path for n in MLP_PROJECTIONS
        ]

    def __call__(self, x_BTD: jax.Array, *, quant_key=None, collect_stats: bool = False) -> tuple[jax.Array, dict]:
        attn_BTD, attn_stats = self.attn(self.attn_norm(x_BTD), quant_key=quant_key, collect_stats=collect_stats)
        x_BTD = x_BTD + attn_BTD
        mlp_BTD, mlp_stats = self.mlp(self.mlp_norm(x_BTD), quant_key=quant_key, collect_stats=collect_stats)
        x_BTD = x_BTD + mlp_BTD
        return x_BTD, {**attn_stats, **mlp_stats}
