"""The model's linear layers as data: one entry per projection, from the model config alone.

This is the one home of the decoder's projections and their shapes. The model builds its QuantLinear
layers from it (fp4lm.model.blocks), and FLOPs, the step-time projection, validation, the precision policy
and the report plots read it, so a change of the model's projections (a fused QKV, say) is made here.

Kept free of jax and flax: fp4lm.flops, fp4lm.project and fp4lm.report import it without the model.

Per block, in execution order (D = d_model, F = mlp_dim, E = head width, H / K query / key-value heads):

    attn.q  D -> H*E      attn.k  D -> K*E      attn.v  D -> K*E      attn.o  H*E -> D
    mlp.gate  D -> F      mlp.up  D -> F        mlp.down  F -> D

A mixture-of-experts block (`cfg.is_moe_block(i)`, fp4lm.model.moe) has, instead of the three MLP
projections, the routed experts' (X = num_experts kernels each, M = moe_mlp_dim) and, with shared experts,
one SwiGLU of their summed width (S = num_shared_experts * moe_mlp_dim):

    mlp.experts.gate  D -> M (X)   mlp.experts.up  D -> M (X)   mlp.experts.down  M -> D (X)
    mlp.shared.gate   D -> S       mlp.shared.up   D -> S       mlp.shared.down   S -> D

The router (D -> X, float32, never quantized) is not a linear layer of the precision policy.

The full path of a projection, as the precision policy and the telemetry name it, is `blocks.{i}.{name}`.

`model_parameters` counts the whole model from the same inventory (the projections, plus the norms, routers,
embeddings and LM head): the parameters held, and those a token uses. The trainer's memory check, the dry run
and the step-time projection all count with it, and a test holds it equal to the built model's parameters.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from fp4lm.config import ModelConfig

# Projection names of one block in execution order; `block_linear_layers` yields exactly these.
BLOCK_LINEAR_NAMES = ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up", "mlp.down")
EXPERT_LINEAR_NAMES = ("mlp.experts.gate", "mlp.experts.up", "mlp.experts.down")
SHARED_EXPERT_LINEAR_NAMES = ("mlp.shared.gate", "mlp.shared.up", "mlp.shared.down")


class LinearLayer(NamedTuple):
    """One projection y = x @ W with W [in_features, out_features]."""

    path: str  # "blocks.3.attn.q"
    in_features: int
    out_features: int
    logical_axes: tuple[str, ...]  # of the kernel, mapped onto the mesh by fp4lm.sharding
    init_std: float
    reads: str  # the activation it multiplies; layers reading the same one share it (q/k/v, gate/up)
    experts: int = 0  # routed experts: the kernel is [experts, in, out]; 0: one [in, out] kernel
    experts_per_token: int = 0  # routed experts: how many of them each token runs through

    @property
    def name(self) -> str:
        """The path within its block: "attn.q"."""
        return self.path.split(".", 2)[2]

    @property
    def params(self) -> int:
        """Weights held: in * out per kernel."""
        return self.in_features * self.out_features * max(self.experts, 1)

    @property
    def active_params(self) -> int:
        """Weights each token multiplies: in * out, times experts_per_token for routed experts."""
        return self.in_features * self.out_features * max(self.experts_per_token, 1)


def output_init_std(cfg: ModelConfig) -> float:
    """GPT-2's scaling for projections that write into the residual stream: std / sqrt(2 * layers)."""
    return cfg.init_std / math.sqrt(2 * cfg.num_layers)


def block_linear_layers(cfg: ModelConfig, index: int) -> tuple[LinearLayer, ...]:
    """The projections of block `index`, in execution order: seven, or with experts those of the module doc."""
    d = cfg.d_model
    query_width = cfg.num_heads * cfg.resolved_head_dim
    kv_width = cfg.num_kv_heads * cfg.resolved_head_dim
    std, out_std = cfg.init_std, output_init_std(cfg)
    prefix = f"blocks.{index}"
    attention = (
        LinearLayer(f"{prefix}.attn.q", d, query_width, ("embed", "heads"), std, "attn_norm"),
        LinearLayer(f"{prefix}.attn.k", d, kv_width, ("embed", "kv_heads"), std, "attn_norm"),
        LinearLayer(f"{prefix}.attn.v", d, kv_width, ("embed", "kv_heads"), std, "attn_norm"),
        LinearLayer(f"{prefix}.attn.o", query_width, d, ("heads", "embed"), out_std, "attention"),
    )
    if not cfg.is_moe_block(index):
        layers = attention + _swiglu(f"{prefix}.mlp", d, cfg.mlp_dim, std, out_std)
        assert tuple(layer.name for layer in layers) == BLOCK_LINEAR_NAMES
        return layers
    m, x, k = cfg.resolved_moe_mlp_dim, cfg.num_experts, cfg.experts_per_token
    experts = (
        LinearLayer(f"{prefix}.mlp.experts.gate", d, m, ("expert", "embed", "mlp"), std, "routed", x, k),
        LinearLayer(f"{prefix}.mlp.experts.up", d, m, ("expert", "embed", "mlp"), std, "routed", x, k),
        LinearLayer(f"{prefix}.mlp.experts.down", m, d, ("expert", "mlp", "embed"), out_std, "expert_swiglu", x, k),
    )
    shared = ()
    if cfg.num_shared_experts:
        shared = _swiglu(f"{prefix}.mlp.shared", d, cfg.num_shared_experts * m, std, out_std)
    return attention + experts + shared


def _swiglu(prefix: str, d: int, f: int, std: float, out_std: float) -> tuple[LinearLayer, ...]:
    """gate and up D -> F reading the normed input, down F -> D reading their SwiGLU product."""
    return (
        LinearLayer(f"{prefix}.gate", d, f, ("embed", "mlp"), std, "mlp_norm"),
        LinearLayer(f"{prefix}.up", d, f, ("embed", "mlp"), std, "mlp_norm"),
        LinearLayer(f"{prefix}.down", f, d, ("mlp", "embed"), out_std, "swiglu"),
    )


def linear_layers(cfg: ModelConfig) -> list[LinearLayer]:
    """Every projection of the model, in execution order (blocks.0.attn.q, ..., blocks.{N-1}.mlp.down)."""
    return [layer for index in range(cfg.num_layers) for layer in block_linear_layers(cfg, index)]


class ParameterCount(NamedTuple):
    held: int  # every parameter
    active: int  # those a token uses: all but the weights of the routed experts it is not sent to


def block_parameters(cfg: ModelConfig, index: int) -> ParameterCount:
    """Parameters of block `index`: its linear layers, its RMSNorms (with model.qk_norm, the per-head q and k
    norms too) and, in a MoE block, the router [D, X] (its selection bias, model.router_bias_update, is train
    state but no parameter: fp4lm.model.routing.RouterBias)."""
    layers = block_linear_layers(cfg, index)
    others = 2 * cfg.d_model + (2 * cfg.resolved_head_dim if cfg.qk_norm else 0)
    if cfg.is_moe_block(index):
        others += cfg.d_model * cfg.num_experts
    return ParameterCount(
        held=sum(layer.params for layer in layers) + others,
        active=sum(layer.active_params for layer in layers) + others,
    )


def model_parameters(cfg: ModelConfig, vocab_size: int) -> ParameterCount:
    """Parameters of the model with a `vocab_size` vocabulary: its blocks (dense ones first, then MoE), the
    embedding, the LM head unless tied, and the final norm; in closed form, for models of any depth."""
    moe = cfg.moe_block_count()
    dense = cfg.num_layers - moe
    dense_block, moe_block = block_parameters(cfg, 0), block_parameters(cfg, cfg.num_layers - 1)
    outside = vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2) + cfg.d_model
    return ParameterCount(
        held=dense * dense_block.held + moe * moe_block.held + outside,
        active=dense * dense_block.active + moe * moe_block.active + outside,
    )
