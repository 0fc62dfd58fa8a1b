"""OCP microscaling formats MXFP4 and MXFP8 (docs/numerics.md §7), for comparison recipes.

Blocks of 32 consecutive elements of the last axis share one power-of-two scale 2^e stored as an
E8M0 byte (e + 127). Elements are x · 2^-e (exact) rounded to E2M1 (MXFP4) or E4M3 (MXFP8).
There is no per-tensor scale.

Scale rules, with amax_b the block's max |x| and E_max the element format's largest value:
- "nvidia" (round-up; NVIDIA's MXFP4 and TE's MXFP8): e = ceil(log2(amax_b / E_max)), so the
  block max lands in (E_max/2, E_max] and nothing saturates.
- "ocp" (floor; microxcaling `_quantize_mx`): e = floor(log2(amax_b)) - emax, so amax_b / 2^e is
  in [2^emax, 2^(emax+1)) and values above E_max saturate (E2M1: [6, 8) -> 6).
Both clamp e to [-127, 127]. The exponent is read from the float32 bits of amax_b, which equals
ceil/floor of the exact log2 for every normal amax_b. Elements are rounded with RNE (or the
8-bit stochastic rounding for MXFP4); microxcaling's default half-away-from-zero is not used.

Non-finite blocks: a block holding NaN or ±inf gets the NaN scale byte 0xFF and dequantizes to
NaN, so a non-finite input never comes back finite. Scale byte 0 (2^-127) is a float32
subnormal that XLA on CPU flushes to zero; only blocks below ~2^-124 use it.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from fp4lm.numerics import formats
from fp4lm.numerics.hadamard import rht
from fp4lm.numerics.rounding import check_rounding, e2m1_codes

MX_BLOCK_SIZE = 32
SCALE_RULES = ("nvidia", "ocp")
# Element formats: (emax, mantissa bits of E_max above which amax_b needs the next exponent).
# E2M1 max 6 = 1.5·2^2; E4M3 max 448 = 1.75·2^8 (as float32 mantissa fields).
_ELEMENTS = {"e2m1": (2, 0x400000), "e4m3": (8, 0x600000)}


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=("data", "scales"),
    meta_fields=("element", "scale_rule", "hadamard"),
)
@dataclasses.dataclass(frozen=True)
class MXArray:
    """An MX-quantized tensor (a pytree).

    data:   MXFP4: uint8 [..., K/2], packed E2M1 codes (element 2i in the low nibble);
            MXFP8: float8_e4m3fn [..., K].
    scales: float8_e8m0fnu [..., K/32], one power-of-two scale per block of 32.
    element: "e2m1" (MXFP4) or "e4m3" (MXFP8); scale_rule: "nvidia" or "ocp"; hadamard: RHT domain.
    """

    data: jax.Array
    scales: jax.Array
    element: str = "e2m1"
    scale_rule: str = "nvidia"
    hadamard: bool = False

    @property
    def shape(self):
        if self.element == "e2m1":
            return self.data.shape[:-1] + (self.data.shape[-1] * 2,)
        return self.data.shape

    def codes(self):
        """MXFP4 only: the 4-bit codes, uint8 [..., K]."""
        assert self.element == "e2m1", self.element
        return formats.unpack_nibbles(self.data)

    def scale_bytes(self):
        """The raw E8M0 bytes, uint8 [..., K/32]."""
        return formats.to_bytes(self.scales)

    def dequantize(self, dtype=jnp.float32):
        return dequantize(self, dtype)


def _check_input(x, fmt):
    formats.check_input_dtype(x, fmt)
    if x.ndim == 0 or x.size == 0 or x.shape[-1] % MX_BLOCK_SIZE != 0:
        raise ValueError(
            f"{fmt}: shape {tuple(x.shape)} is not divisible by the block (1, {MX_BLOCK_SIZE}) "
            f"(the last axis must be a multiple of {MX_BLOCK_SIZE}); pad or reshape the tensor"
        )


def block_exponent(block_amax, element, scale_rule):
    """Shared exponent e (int32) per block and whether the block is non-finite."""
    emax, mantissa_limit = _ELEMENTS[element]
    biased, mantissa = formats.f32_exponent_fields(block_amax)
    exponent = biased - 127 - emax
    if scale_rule == "nvidia":
        exponent = exponent + (mantissa > mantissa_limit).astype(jnp.int32)
    exponent = jnp.where(biased == 0, -127, exponent)  # zero or subnormal block
    return jnp.clip(exponent, -127, 127), biased == 0xFF


def _quantize_blocks(x, element, scale_rule):
    """(blocks [N, K/32, 32] float32 scaled by 2^-e, E8M0 bytes [N, K/32])."""
    blocks = x.reshape(-1, x.shape[-1] // MX_BLOCK_SIZE, MX_BLOCK_SIZE)
    exponent, non_finite = block_exponent(formats.abs_max(blocks, axis=-1), element, scale_rule)
    scale_bytes = lax.optimization_barrier(formats.e8m0_from_exponent(exponent, non_finite))
    # 2^-e is a normal float32 for every reachable e (>= -127, and e <= 126 here); NaN blocks stay NaN.
    inverse = lax.bitcast_convert_type((127 - exponent) << 23, jnp.float32)
    inverse = jnp.where(non_finite, jnp.float32(jnp.nan), inverse)
    return blocks.astype(jnp.float32) * inverse[..., None], scale_bytes


def quantize_mxfp4(x, *, scale_rule="nvidia", rounding="nearest", key=None, hadamard=False):
    """MXFP4: E2M1 elements, one E8M0 scale per 32 elements of the last axis."""
    x = jnp.asarray(x)
    _check_input(x, "mxfp4")
    if scale_rule not in SCALE_RULES:
        raise ValueError(f"mxfp4: unknown scale_rule {scale_rule!r}; use one of {SCALE_RULES}")
    check_rounding(rounding, key, fmt="mxfp4")
    if hadamard:
        x = rht(x)
    v, scale_bytes = _quantize_blocks(x, "e2m1", scale_rule)
    codes = lax.optimization_barrier(e2m1_codes(v, rounding, key))
    return MXArray(
        data=formats.pack_nibbles(codes.reshape(x.shape)),
        scales=_scales(scale_bytes, x.shape),
        element="e2m1",
        scale_rule=scale_rule,
        hadamard=bool(hadamard),
    )


def quantize_mxfp8(x, *, scale_rule="nvidia", hadamard=False):
    """MXFP8: E4M3 elements (RNE), one E8M0 scale per 32 elements of the last axis."""
    x = jnp.asarray(x)
    _check_input(x, "mxfp8")
    if scale_rule not in SCALE_RULES:
        raise ValueError(f"mxfp8: unknown scale_rule {scale_rule!r}; use one of {SCALE_RULES}")
    if hadamard:
        x = rht(x)
    v, scale_bytes = _quantize_blocks(x, "e4m3", scale_rule)
    data = lax.optimization_barrier(formats.to_e4m3(v))
    return MXArray(
        data=data.reshape(x.shape),
        scales=_scales(scale_bytes, x.shape),
        element="e4m3",
        scale_rule=scale_rule,
        hadamard=bool(hadamard),
    )


def _scales(scale_bytes, shape):
    per_row = shape[:-1] + (shape[-1] // MX_BLOCK_SIZE,)
    return formats.from_bytes(scale_bytes.reshape(per_row), jnp.float8_e8m0fnu)


def dequantize(q, dtype=jnp.float32):
    """element · 2^e in float32 (exact unless the result is subnormal), then cast to `dtype`."""
    shape = q.shape
    if q.element == "e2m1":
        values = formats.e2m1_decode_packed(q.data)
    else:
        values = q.data.astype(jnp.float32)
    values = values.reshape(-1, shape[-1] // MX_BLOCK_SIZE, MX_BLOCK_SIZE)
    scale = formats.e8m0_to_f32(q.scale_bytes()).reshape(-1, shape[-1] // MX_BLOCK_SIZE, 1)
    return (values * scale).reshape(shape).astype(dtype)
