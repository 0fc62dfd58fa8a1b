"""NVFP4 quantize-dequantize in one elementwise pass, for callers that want values, not codes.

`quantize_dequantize(x, ...)` equals `nvfp4.quantize(x, ...).dequantize(dtype)` bit for bit, and
`quantize_block_scaled(x, ...)` equals `(q.block_scaled(dtype), q.amax)`; they skip the 4-bit codes,
the nibble packing and the table lookup of the decode. After the block-amax pass (nvfp4.scaled_blocks,
which also gives v = x · enc_b and the float32 block scale s_b), each element is

    q     = E2M1 grid value of |v|       RNE: a sum of exact step heights (rounding.nearest_magnitude_value);
                                         SR:  rounding.stochastic_magnitude_value with the same 8 bits
    e     = -q if v < 0 else q           (v = -0.0 and NaN give +q, as code 0 does; -q for q = 0 is -0.0,
                                         as code 8 decodes)
    x̂     = fp32(fp32(e · s_b) · fp32(amax / 2688)), then cast to `dtype`

Why this is the same number: the codes path decodes `code` to exactly the grid value e (E2M1 values are
exact in float32), and then performs the same two float32 multiplies in the same order. `e · s_b` is
exact (at most 6 significant bits), so only the last multiply and the final cast round, in both paths.
A NaN q (stochastic rounding of a NaN v, which needs a NaN amax) becomes 0, as the codes path maps it
to code 0; every value is NaN then anyway, through the NaN block scale.

The float32 block scale comes from behind an optimization barrier (nvfp4.scaled_blocks), so XLA reads
one float32 per block instead of re-converting the E4M3 byte for every element, and cannot fold the
f32 -> e4m3 -> f32 round trip.
"""

import jax.numpy as jnp

from fp4lm.numerics import nvfp4
from fp4lm.numerics.hadamard import rht
from fp4lm.numerics.rounding import nearest_magnitude_value, random_bits, stochastic_magnitude_value


def _grid_values(v, rounding, key):
    """Signed E2M1 grid values (float32) of the scaled values v, as e2m1_decode(e2m1_codes(v)) gives them."""
    a = jnp.abs(v)
    if rounding == "nearest":
        magnitude = nearest_magnitude_value(a)
    else:
        magnitude = stochastic_magnitude_value(a, random_bits(key, v.shape))
        magnitude = jnp.where(jnp.isnan(magnitude), jnp.float32(0.0), magnitude)
    return jnp.where(v < 0, -magnitude, magnitude)


def _block_scaled_f32(x, block, rounding, key, hadamard, tensor_amax, options):
    """(e2m1 · s_b as float32 with x's shape, amax: scalar, or x.shape[:-1] when row-scaled); x validated."""
    if hadamard:
        x = rht(x)
    v, _, scale_f32, amax = nvfp4.scaled_blocks(x, block, tensor_amax, options)
    values = _grid_values(v, rounding, key) * scale_f32[..., None]  # exact
    return values.reshape(x.shape), amax.reshape(x.shape[:-1]) if options.row_scaled else amax


def quantize_block_scaled(
    x,
    *,
    block=(1, 16),
    rounding="nearest",
    key=None,
    hadamard=False,
    dtype=jnp.float32,
    tensor_amax=None,
    options=nvfp4.PLAIN,
):
    """(e2m1(code) · s_b in `dtype`, amax) of NVFP4-quantizing x: what a block-scaled GEMM multiplies.

    Equal to `(q.block_scaled(dtype), q.amax)` with q = nvfp4.quantize(x, ...) (same arguments and key,
    `tensor_amax` and the `nvfp4.Options` included). The values are exact in float32 and bfloat16; the
    global decode scale amax / (6 · e4m3_max) is left out.
    """
    block = tuple(block)
    x = nvfp4.check_quantize_arguments(x, block, rounding, key, options, tensor_amax)
    values, amax = _block_scaled_f32(x, block, rounding, key, hadamard, tensor_amax, options)
    return values.astype(dtype), amax


def quantize_dequantize(
    x, *, block=(1, 16), rounding="nearest", key=None, hadamard=False, dtype=jnp.float32, options=nvfp4.PLAIN
):
    """nvfp4.quantize(x, ...).dequantize(dtype), bit for bit, in one elementwise pass after the amax pass."""
    block = tuple(block)
    x = nvfp4.check_quantize_arguments(x, block, rounding, key, options)
    values, amax = _block_scaled_f32(x, block, rounding, key, hadamard, None, options)
    decode = nvfp4.tensor_decode_scale(amax, options.e4m3_max)
    return (values * (decode[..., None] if options.row_scaled else decode)).astype(dtype)
