"""NVFP4's two-level scale arithmetic (docs/numerics.md §2.3-2.5): the global scales from an amax, the E4M3
block-scale bytes, and each block's encode scale. nvfp4.py quantizes with them, four_over_six.py forms its
two candidates with them; both import this module, which imports neither.
"""

from typing import NamedTuple

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


class GlobalScales(NamedTuple):
    """The float32 global scales of one amax (docs/numerics.md §2.3): computed once per quantize."""

    enc: jnp.ndarray  # S_enc = min((6 · e4m3_max) / amax, FLT_MAX), 1 where that is 0
    dec: jnp.ndarray  # S_dec = 1 / S_enc
    multiplier: jnp.ndarray  # m = S_enc · fp32(1/6), what a block amax is multiplied by for its scale


def global_scales(amax, e4m3_max=448):
    """`GlobalScales` from the float32 tensor (or row) amax, every division correctly rounded."""
    s_enc = jnp.minimum(divide_correctly_rounded(global_range(e4m3_max), amax), formats.FLT_MAX)  # x/0 -> FLT_MAX
    s_enc = jnp.where(s_enc == 0, np.float32(1.0), s_enc)  # only when amax = +inf
    return GlobalScales(s_enc, reciprocal_correctly_rounded(s_enc), s_enc * ONE_SIXTH)


def block_scale_bytes(block_amax, scales):
    """E4M3 block-scale bytes (uint8) from the block amaxes: e4m3(clip(amax_b · m, 0, 448))."""
    return formats.to_bytes(formats.to_e4m3(jnp.clip(block_amax * scales.multiplier, 0.0, formats.E4M3_MAX)))


def block_encode_scale(scale_f32, scales):
    """enc_b = min(1 / fp32(s_b · S_dec), FLT_MAX): the product is rounded first (docs/numerics.md §2.5)."""
    return jnp.minimum(reciprocal_correctly_rounded(scale_f32 * scales.dec), formats.FLT_MAX)
