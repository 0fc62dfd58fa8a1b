"""The model's linear layers as data: one entry per projection, from the model config alone.

This is the one home of the decoder's projections and their shapes. The model builds its QuantLinear
layers from it (fp4lm.model.blocks), and FLOPs, the step-time projection, validation, the precision policy
and the report plots read it, so a change of the model's projections (a fused QKV, say) is made here.

Kept free of jax and flax: fp4lm.flops, fp4lm.project and fp4lm.report import it without the model.

Per block, in execution order (D = d_model, F = mlp_dim, E = head width, H / K query / key-value heads):

    attn.q  D -> H*E      attn.k  D -> K*E      attn.v  D -> K*E      attn.o  H*E -> D
    mlp.gate  D -> F      mlp.up  D -> F        mlp.down  F -> D

The full path of a projection, as the precision policy and the telemetry name it, is `blocks.{i}.{name}`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from fp4lm.config import ModelConfig

# Projection names of one block in execution order; `block_linear_layers` yields exactly these.
BLOCK_LINEAR_NAMES = ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up", "mlp.down")


class LinearLayer(NamedTuple):
    """One projection y = x @ W with W [in_features, out_features]."""

    path: str  # "blocks.3.attn.q"
    in_features: int
    out_features: int
    logical_axes: tuple[str, str]  # of the kernel, mapped onto the mesh by fp4lm.sharding
    init_std: float
    reads: str  # the activation it multiplies; layers reading the same one share it (q/k/v, gate/up)

    @property
    def name(self) -> str:
        """The path within its block: "attn.q"."""
        return self.path.split(".", 2)[2]


def output_init_std(cfg: ModelConfig) -> float:
    """GPT-2's scaling for projections that write into the residual stream: std / sqrt(2 * layers)."""
    return cfg.init_std / math.sqrt(2 * cfg.num_layers)


def block_linear_layers(cfg: ModelConfig, index: int) -> tuple[LinearLayer, ...]:
    """The seven projections of block `index`, in execution order."""
    d, f = cfg.d_model, cfg.mlp_dim
    query_width = cfg.num_heads * cfg.resolved_head_dim
    kv_width = cfg.num_kv_heads * cfg.resolved_head_dim
    std, out_std = cfg.init_std, output_init_std(cfg)
    prefix = f"blocks.{index}"
    layers = (
        LinearLayer(f"{prefix}.attn.q", d, query_width, ("embed", "heads"), std, "attn_norm"),
        LinearLayer(f"{prefix}.attn.k", d, kv_width, ("embed", "kv_heads"), std, "attn_norm"),
        LinearLayer(f"{prefix}.attn.v", d, kv_width, ("embed", "kv_heads"), std, "attn_norm"),
        LinearLayer(f"{prefix}.attn.o", query_width, d, ("heads", "embed"), out_std, "attention"),
        LinearLayer(f"{prefix}.mlp.gate", d, f, ("embed", "mlp"), std, "mlp_norm"),
        LinearLayer(f"{prefix}.mlp.up", d, f, ("embed", "mlp"), std, "mlp_norm"),
        LinearLayer(f"{prefix}.mlp.down", f, d, ("mlp", "embed"), out_std, "swiglu"),
    )
    assert tuple(layer.name for layer in layers) == BLOCK_LINEAR_NAMES
    return layers


def linear_layers(cfg: ModelConfig) -> list[LinearLayer]:
    """Every projection of the model, in execution order (blocks.0.attn.q, ..., blocks.{N-1}.mlp.down)."""
    return [layer for index in range(cfg.num_layers) for layer in block_linear_layers(cfg, index)]


def linear_params_per_block(cfg: ModelConfig) -> int:
    return sum(layer.in_features * layer.out_features for layer in block_linear_layers(cfg, 0))
