"""Per-tensor FP8 with current scaling (E4M3 or E5M2), for the FP8 comparison recipe.

    amax    = max |x| over the tensor                       (NaN propagates)
    encode  = min(F_max / amax, FLT_MAX), 1 when amax = 0   (F_max: 448 for E4M3, 57344 for E5M2)
    data    = fp8(clip(x · encode, ±F_max))                 (RNE)
    x̂       = fp32(data) · (1 / encode)

This is TransformerEngine's "current scaling" without the power-of-two option. Non-finite inputs
stay visible: a NaN gives amax = NaN and every value NaN; an inf gives encode = 0 and a decode
scale of inf, so every dequantized value is NaN or inf. Both divisions are correctly rounded on
every platform (division.py).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4lm.numerics import formats
from fp4lm.numerics.division import divide_correctly_rounded, reciprocal_correctly_rounded

FP8_MAX = {
    jnp.dtype(jnp.float8_e4m3fn): np.float32(formats.E4M3_MAX),
    jnp.dtype(jnp.float8_e5m2): np.float32(formats.E5M2_MAX),
}


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=("data", "scale_inv", "amax"),
    meta_fields=(),
)
@dataclasses.dataclass(frozen=True)
class FP8Array:
    """A per-tensor-scaled FP8 tensor (a pytree).

    data:      float8_e4m3fn or float8_e5m2, same shape as the input.
    scale_inv: float32 scalar decode scale (1 / encode); x̂ = fp32(data) · scale_inv.
    amax:      float32 scalar, max |x| of the input.
    """

    data: jax.Array
    scale_inv: jax.Array
    amax: jax.Array

    @property
    def shape(self):
        return self.data.shape

    def dequantize(self, dtype=jnp.float32):
        return dequantize(self, dtype)


def quantize(x, dtype=jnp.float8_e4m3fn):
    """Quantize x to FP8 `dtype` (float8_e4m3fn or float8_e5m2) with one float32 scale."""
    x = jnp.asarray(x)
    dtype = jnp.dtype(dtype)
    if dtype not in FP8_MAX:
        raise ValueError(f"fp8: dtype must be float8_e4m3fn or float8_e5m2, got {dtype}")
    formats.check_input_dtype(x, "fp8")
    if x.size == 0:
        raise ValueError(f"fp8: cannot quantize an empty array of shape {tuple(x.shape)}")
    fmax = FP8_MAX[dtype]
    amax = formats.abs_max(x)
    encode = jnp.where(amax == 0, np.float32(1.0), jnp.minimum(divide_correctly_rounded(fmax, amax), formats.FLT_MAX))
    scaled = jnp.clip(x.astype(jnp.float32) * encode, -fmax, fmax)
    data = lax.optimization_barrier(scaled.astype(dtype))  # keep the rounding under jit
    return FP8Array(data=data, scale_inv=reciprocal_correctly_rounded(encode), amax=amax)


def dequantize(q, dtype=jnp.float32):
    """fp32(data) · scale_inv, cast to `dtype`."""
    return (q.data.astype(jnp.float32) * q.scale_inv).astype(dtype)
