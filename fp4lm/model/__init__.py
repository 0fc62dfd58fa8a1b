"""The Llama-family decoder whose projections take their matmul from the precision policy."""

from fp4lm.model.blocks import Attention, Block, SwiGLU
from fp4lm.model.layers import (
    Embedding,
    LayerStats,
    QuantLinear,
    RMSNorm,
    apply_rope,
    collect_layer_stats,
    pop_layer_stats,
    rope_angles,
)
from fp4lm.model.llama import Llama, param_count, remat_policy, set_policy

__all__ = [
    "Attention",
    "Block",
    "Embedding",
    "LayerStats",
    "Llama",
    "QuantLinear",
    "RMSNorm",
    "SwiGLU",
    "apply_rope",
    "collect_layer_stats",
    "param_count",
    "pop_layer_stats",
    "remat_policy",
    "rope_angles",
    "set_policy",
]
