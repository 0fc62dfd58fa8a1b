"""NVFP4's two-level scale arithmetic (docs/numerics.md §2.3-2.5): the global scales from an amax, the E4M3
block-scale bytes, and each block's encode scale. nvfp4.py quantizes with them, four_over_six.py forms its
two candidates with them; both import this module, which imports neither.
"""

import jax.numpy as jnp
import numpy as np

from fp4lm.numerics import formats
from fp4lm.numerics.division import divide_correctly_rounded, reciprocal_correctly_rounded

BLOCK_SIZE = 16
GLOBAL_SCALE_RANGE = np.float32(formats.E2M1_MAX * formats.E4M3_MAX)  # 6 · 448 = 2688
ONE_SIXTH = np.float32(1.0 / 6.0)  # 0x3E2AAAAB


def global_range(e4m3_max=448):
    """6 · e4m3_max as float32 (exact): 2688, or 1536 for 4over6's 256."""
    return np.float32(formats.E2M1_MAX * e4m3_max)


def global_scales(amax, e4m3_max=448):
    """(S_enc, S_dec, m = S_enc·fp32(1/6)) from the float32 tensor (or row) amax (docs/numerics.md §2.3)."""
    s_enc = jnp.minimum(divide_correctly_rounded(global_range(e4m3_max), amax), formats.FLT_MAX)  # x/0 -> FLT_MAX
    s_enc = jnp.where(s_enc == 0, np.float32(1.0), s_enc)  # only when amax = +inf
    s_dec = reciprocal_correctly_rounded(s_enc)
    return s_enc, s_dec, s_enc * ONE_SIXTH


def block_scale_bytes(block_amax, amax):
    """E4M3 block-scale bytes (uint8) from block and tensor amaxes: e4m3(clip(amax_b·m, 0, 448))."""
    _, _, multiplier = global_scales(amax)
    return formats.to_bytes(formats.to_e4m3(jnp.clip(block_amax * multiplier, 0.0, formats.E4M3_MAX)))


def block_encode_scale(scale_f32, amax, e4m3_max=448):
    """enc_b = min(1 / fp32(s_b · S_dec), FLT_MAX): the product is rounded first (docs/numerics.md §2.5)."""
    _, s_dec, _ = global_scales(amax, e4m3_max)
    return encode_scale(scale_f32, s_dec)


def encode_scale(scale_f32, s_dec):
    """`block_encode_scale` from the decode scale S_dec, for a caller that has the global scales already."""
    return jnp.minimum(reciprocal_correctly_rounded(scale_f32 * s_dec), formats.FLT_MAX)
