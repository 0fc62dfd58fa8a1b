"""The Llama-family decoder whose projections take their matmul from the precision policy."""

from fp4lm.model.blocks import Attention, Block, SwiGLU
from fp4lm.model.layers import Embedding, QuantLinear, RMSNorm, apply_rope, rope_angles
from fp4lm.model.llama import Llama, param_count, remat_policy, set_policy

__all__ = [
    "Attention",
    "Block",
    "Embedding",
    "Llama",
    "QuantLinear",
    "RMSNorm",
    "SwiGLU",
    "apply_rope",
    "param_count",
    "remat_policy",
    "rope_angles",
    "set_policy",
]
