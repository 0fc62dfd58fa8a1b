"""Number formats: E2M1 (FP4), E4M3 / E5M2 (FP8), E8M0 (MX scales), and nibble packing.

Everything here is exact bit manipulation or a single correctly rounded cast; the quantizers in
`nvfp4.py`, `microscaling.py` and `fp8.py` are built from these pieces.

Two XLA behaviours shape this file (docs/numerics.md §11.1):
- XLA's f32 -> float8_e4m3fn cast does not saturate (500 becomes NaN), so every cast into a
  narrow float type clips first. `jnp.clip` keeps NaN.
- XLA's CPU max-reduction over floats is slow (it handles NaN one element at a time), so
  `abs_max` reduces the integer bit patterns instead, which orders |x| the same way and still
  lets NaN win (NaN bits are above +inf bits).
"""

import jax.numpy as jnp
import numpy as np
from jax import lax

FLT_MAX = np.float32(np.finfo(np.float32).max)  # 0x7F7FFFFF
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E5M2_MAX = 57344.0

# Value of each 4-bit E2M1 code `s<<3 | e<<1 | m`; code 8 is -0.0.
E2M1_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float32,
)

_ABS_MASK = {
    jnp.dtype(jnp.float32): (jnp.uint32, 0x7FFFFFFF),
    jnp.dtype(jnp.bfloat16): (jnp.uint16, 0x7FFF),
    jnp.dtype(jnp.float16): (jnp.uint16, 0x7FFF),
}
INPUT_DTYPES = tuple(_ABS_MASK)  # what the quantizers accept: widening to float32 is exact


def check_input_dtype(x, fmt):
    """ValueError unless x is float32, bfloat16 or float16."""
    if jnp.dtype(x.dtype) not in INPUT_DTYPES:
        names = ", ".join(d.name for d in INPUT_DTYPES)
        raise ValueError(f"{fmt}: expected a floating-point array ({names}), got dtype {x.dtype}")


def abs_max(x, axis=None):
    """max |x| over `axis` as float32, NaN-propagating, computed on the bit patterns.

    For non-negative IEEE floats the unsigned bit pattern is monotone in the value, and every
    NaN pattern (sign cleared) is larger than +inf, so an integer max is the float max with
    NaN propagation. Supports float32, bfloat16 and float16 inputs (max is exact in any dtype).
    """
    axes = tuple(range(x.ndim)) if axis is None else tuple(a % x.ndim for a in np.atleast_1d(axis))
    if x.dtype == jnp.bfloat16 and x.ndim and x.ndim - 1 in axes and x.shape[-1] % 2 == 0:
        return _abs_max_bf16_words(x, axes)
    uint_dtype, mask = _ABS_MASK[jnp.dtype(x.dtype)]
    bits = lax.bitcast_convert_type(x, uint_dtype) & uint_dtype(mask)
    largest = jnp.max(bits, axis=axis)
    return lax.bitcast_convert_type(largest, x.dtype).astype(jnp.float32)


def _abs_max_bf16_words(x, axes):
    """abs_max of bfloat16 x over `axes` (which include the last, of even length), two values per uint32.

    Adjacent pairs of the last axis are read as one 32-bit word (a bitcast, no copy). Masking the word
    with 0x7FFF0000 keeps one value's |bits| in the high half (zeros below, so the word order is that
    value's order), masking with 0x7FFF keeps the other's in the low half; the max of each over the
    reduced axes, then the larger of the two, is the max over all the values, with the same NaN rule.
    Same result as the 16-bit reduction (max is exact), about twice as fast on CPU: half as many
    elements to reduce, on the machine's native word.
    """
    words = lax.bitcast_convert_type(x.reshape(x.shape[:-1] + (x.shape[-1] // 2, 2)), jnp.uint32)
    high = jnp.max(words & jnp.uint32(0x7FFF0000), axis=axes)
    low = jnp.max(words & jnp.uint32(0x7FFF), axis=axes)
    largest = jnp.maximum(high >> 16, low).astype(jnp.uint16)
    return lax.bitcast_convert_type(largest, jnp.bfloat16).astype(jnp.float32)


# ---------------------------------------------------------------------------------------------
# E2M1
# ---------------------------------------------------------------------------------------------
def e2m1_code(magnitude, negative):
    """4-bit code from a magnitude code 0..7 (uint8) and a sign predicate: `mag | negative << 3`."""
    return magnitude | (negative.astype(jnp.uint8) << 3)


def e2m1_decode(codes):
    """Exact float32 value of each 4-bit code (uint8 array, values 0..15).

    Built from bits: magnitude m = code & 7 is 0 -> 0.0, 1 -> 0.5 (the subnormal), and for
    m >= 2 the normal value 2^(m//2 - 1) * (1 + (m&1)/2), whose float32 bits are
    0x3F000000 + (m << 22). The sign bit (code & 8) moves to bit 31.
    """
    codes = codes.astype(jnp.uint32)
    magnitude = codes & 7
    normal_bits = jnp.uint32(0x3F000000) + (magnitude << 22)
    magnitude_bits = jnp.where(magnitude < 2, magnitude * jnp.uint32(0x3F000000), normal_bits)
    return lax.bitcast_convert_type(magnitude_bits | ((codes & 8) << 28), jnp.float32)


# The two values held by each possible packed byte: [byte] -> (value of low nibble, value of high nibble).
E2M1_PAIR_VALUES = np.stack([E2M1_VALUES[np.arange(256) & 15], E2M1_VALUES[np.arange(256) >> 4]], axis=-1)


def e2m1_decode_packed(packed):
    """Exact float32 values [..., K] of packed bytes [..., K/2], by a 256-entry table lookup.

    Same values as `e2m1_decode(unpack_nibbles(packed))`; the lookup of both nibbles at once is the
    fastest form on CPU, against bit arithmetic and a float4 cast.
    """
    pairs = jnp.asarray(E2M1_PAIR_VALUES)[packed]
    return pairs.reshape(packed.shape[:-1] + (packed.shape[-1] * 2,))


def pack_nibbles(codes):
    """uint8 codes [..., K] -> bytes [..., K/2] with element 2i in the LOW nibble.

    Pairs of codes are read as one little-endian uint16 (`c[2i] | c[2i+1] << 8`), which keeps the
    loop contiguous; the spec's byte is then `(w & 0x0F) | ((w >> 4) & 0xF0)`.
    """
    assert codes.shape[-1] % 2 == 0, codes.shape
    pairs = codes.reshape(codes.shape[:-1] + (codes.shape[-1] // 2, 2))
    word = lax.bitcast_convert_type(pairs, jnp.uint16)
    return ((word & 0x0F) | ((word >> 4) & 0xF0)).astype(jnp.uint8)


def unpack_nibbles(packed):
    """bytes [..., K/2] -> uint8 codes [..., K]; the inverse of `pack_nibbles`."""
    word = packed.astype(jnp.uint16)
    word = (word & 0x0F) | ((word & 0xF0) << 4)  # low nibble -> byte 0, high nibble -> byte 1
    codes = lax.bitcast_convert_type(word, jnp.uint8)
    return codes.reshape(packed.shape[:-1] + (packed.shape[-1] * 2,))


# ---------------------------------------------------------------------------------------------
# FP8 element and scale types
# ---------------------------------------------------------------------------------------------
def to_e4m3(x):
    """float32 -> float8_e4m3fn, RNE, saturating at ±448 (clip first); NaN stays NaN."""
    return jnp.clip(x, -E4M3_MAX, E4M3_MAX).astype(jnp.float8_e4m3fn)


def to_bytes(x):
    """Raw bytes (uint8) of a float8 array."""
    return lax.bitcast_convert_type(x, jnp.uint8)


def from_bytes(raw, dtype):
    """float8 array of `dtype` from its raw bytes (uint8)."""
    return lax.bitcast_convert_type(raw, dtype)


# ---------------------------------------------------------------------------------------------
# E8M0 (MX block scales): 2^(byte - 127), byte 0xFF is NaN, no zero
# ---------------------------------------------------------------------------------------------
E8M0_NAN = 0xFF


def f32_exponent_fields(x):
    """(biased exponent, mantissa) bit fields of non-negative float32 values, as int32."""
    bits = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)
    return (bits >> 23) & 0xFF, bits & 0x7FFFFF


def e8m0_from_exponent(exponent, non_finite):
    """E8M0 bytes (uint8) for integer exponents (clamped to [-127, 127]); NaN byte where `non_finite`."""
    biased = jnp.clip(exponent, -127, 127) + 127
    return jnp.where(non_finite, E8M0_NAN, biased).astype(jnp.uint8)


def e8m0_to_f32(raw):
    """Exact float32 value 2^(byte-127) of E8M0 bytes; 0xFF -> NaN.

    Byte 0 is 2^-127, a float32 subnormal, which XLA on CPU flushes to zero; only blocks whose
    values are all below ~2^-124 use it, and those are outside the bit-exact contract (docs/numerics.md §12).
    """
    raw = raw.astype(jnp.int32)
    value = lax.bitcast_convert_type(raw << 23, jnp.float32)
    return jnp.where(raw == E8M0_NAN, jnp.float32(jnp.nan), value)
