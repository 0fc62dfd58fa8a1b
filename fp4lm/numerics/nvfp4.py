"""NVFP4 quantization, bit-exact with TransformerEngine >= 2.14 (docs/numerics.md §2, §6).

A tensor x [..., K] is stored as x ≈ e2m1(code) · s_b · (amax / 2688): a 4-bit E2M1 code per
element, an E4M3 scale s_b per block of 16 consecutive elements of the LAST axis (or per 16x16
tile of the last two axes, for weights) and the float32 amax of the whole tensor.

The algorithm (docs/numerics.md §2.2), all in IEEE float32 with round-to-nearest-even:

    amax   = max |x| over the whole tensor            (NaN propagates)
    S_enc  = min(2688 / amax, FLT_MAX), and 1 if that is 0 (amax = inf)
    S_dec  = 1 / S_enc
    m      = S_enc · fp32(1/6)                         (this product FIRST: the TE >= 2.14 order)
    d_b    = clip(amax_b · m, 0, 448)                  per block
    s_b    = e4m3(d_b)                                 (RNE; the stored scale byte)
    enc_b  = min(1 / (s_b · S_dec), FLT_MAX)           (s_b = 0 gives FLT_MAX)
    code_i = E2M1 rounding of x_i · enc_b              (RNE or stochastic; rounding.py)

Dequantization is (e2m1(code) · s_b) · fp32(amax / 2688), exact up to that last multiply.

Two options of TransformerEngine's 2026 reference (docs/numerics.md §2.7, §2.8):
- row_scaled: one float32 amax per row (all axes but the last) instead of one per tensor; each row gets
  its own S_enc, S_dec and m, so a row of small values keeps its resolution beside a row of outliers.
- four_over_six ("mae" | "mse"): per block, scale its amax to 4 or to 6 (two candidate scale bytes),
  keep the one whose dequantized block errs less (four_over_six.py); e4m3_max = 256 lowers the global
  range to 6 · 256 so the map-to-4 scale, 1.5x the map-to-6 one, never saturates.

Jit safety: codes and scale bytes are produced as integers, and the scale bytes pass an
optimization barrier before they are decoded again, so XLA cannot fold the f32 -> e4m3 -> f32
round trip. Every division goes through `division.divide_correctly_rounded`, which gives the
correctly rounded quotient whatever the platform's divide does (GPUs divide approximately, and XLA
rewrites `x / constant` into a multiply by a rounded reciprocal).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from fp4lm.numerics import formats, four_over_six
from fp4lm.numerics.division import divide_correctly_rounded
from fp4lm.numerics.hadamard import rht
from fp4lm.numerics.nvfp4_scales import (  # noqa: F401  (part of this module's interface)
    BLOCK_SIZE,
    GLOBAL_SCALE_RANGE,
    ONE_SIXTH,
    block_encode_scale,
    block_scale_bytes,
    global_range,
    global_scales,
)
from fp4lm.numerics.rounding import check_rounding, e2m1_codes

BLOCKS = ((1, 16), (16, 16))
E4M3_MAXES = (448, 256)
"""The largest block scale the global scale aims at: 448 (E4M3's largest value) or 256 (4over6's choice)."""
FOUR_OVER_SIX_MODES = ("mae", "mse")


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=("packed", "scales", "amax"),
    meta_fields=("block", "hadamard", "row_scaled", "e4m3_max"),
)
@dataclasses.dataclass(frozen=True)
class NVFP4Array:
    """An NVFP4-quantized tensor (a pytree).

    packed:   uint8 [..., K/2], two E2M1 codes per byte, element 2i in the low nibble.
    scales:   float8_e4m3fn [..., K/16], one per 1x16 block; for 16x16 tiles the tile's scale is
              repeated on each of its 16 rows (TransformerEngine's layout).
    amax:     float32 scalar, max |x| of the quantized tensor; the global decode scale is
              amax / (6 · e4m3_max). Row-scaled: one per row, shape x.shape[:-1].
    block:    (1, 16) or (16, 16) (static).
    hadamard: whether the values are in the RHT domain (static; dequantize stays in that domain).
    row_scaled: whether amax is per row (static).
    e4m3_max: 448, or 256 for 4over6 tensors quantized with the lower global range (static).
    """

    packed: jax.Array
    scales: jax.Array
    amax: jax.Array
    block: tuple[int, int] = (1, 16)
    hadamard: bool = False
    row_scaled: bool = False
    e4m3_max: int = 448

    @property
    def shape(self):
        return self.packed.shape[:-1] + (self.packed.shape[-1] * 2,)

    def codes(self):
        """The 4-bit codes, uint8 [..., K]."""
        return formats.unpack_nibbles(self.packed)

    def scale_bytes(self):
        """The raw E4M3 block-scale bytes, uint8 [..., K/16]."""
        return formats.to_bytes(self.scales)

    def dequantize(self, dtype=jnp.float32):
        return dequantize(self, dtype)

    def block_scaled(self, dtype=jnp.float32):
        return block_scaled_values(self, dtype)


def _check_input(x, block):
    formats.check_input_dtype(x, "nvfp4")
    if tuple(block) not in BLOCKS:
        raise ValueError(f"nvfp4: block must be one of {BLOCKS}, got {block!r}")
    rows, cols = block
    needed_ndim = 2 if rows > 1 else 1
    if x.ndim < needed_ndim or x.size == 0:
        raise ValueError(f"nvfp4: shape {tuple(x.shape)} cannot be split into blocks {tuple(block)}")
    bad_cols = x.shape[-1] % cols != 0
    bad_rows = rows > 1 and x.shape[-2] % rows != 0
    if bad_cols or bad_rows:
        axes = "the last axis must be a multiple" if rows == 1 else "the last two axes must be multiples"
        raise ValueError(
            f"nvfp4: shape {tuple(x.shape)} is not divisible by the block {tuple(block)} "
            f"({axes} of 16); pad or reshape the tensor"
        )


def block_amax(x, block):
    """max |x| per block as float32 [N, K/16] (N = prod of leading axes), tiles repeated per row. A caller that
    needs a statistic of them before `scaled_blocks` computes the same thing, and XLA computes it once."""
    cols = x.shape[-1]
    if block[0] == 1:
        return formats.abs_max(x.reshape(-1, cols // BLOCK_SIZE, BLOCK_SIZE), axis=-1)
    tiles = x.reshape(-1, BLOCK_SIZE, cols // BLOCK_SIZE, BLOCK_SIZE)
    tile_amax = formats.abs_max(tiles, axis=(1, 3))  # [N/16, K/16]
    repeated = jnp.broadcast_to(tile_amax[:, None, :], (tile_amax.shape[0], BLOCK_SIZE, tile_amax.shape[1]))
    return repeated.reshape(-1, cols // BLOCK_SIZE)


@dataclasses.dataclass(frozen=True)
class Options:
    """The 2026 options of `quantize` (module docstring); the defaults are the published recipe's NVFP4."""

    row_scaled: bool = False
    four_over_six: str | None = None  # None, "mae" or "mse"
    e4m3_max: int = 448

    def check(self, block, tensor_amax=None) -> None:
        if self.four_over_six not in (None, *FOUR_OVER_SIX_MODES):
            raise ValueError(f"nvfp4: four_over_six must be None, 'mae' or 'mse', got {self.four_over_six!r}")
        if self.e4m3_max not in E4M3_MAXES:
            raise ValueError(f"nvfp4: e4m3_max must be 448 or 256, got {self.e4m3_max!r}")
        if self.e4m3_max != 448 and self.four_over_six is None:
            raise ValueError("nvfp4: e4m3_max=256 is 4over6's global range; set four_over_six too, or keep 448")
        if self.row_scaled and tuple(block) != (1, 16):
            raise ValueError(f"nvfp4: row_scaled needs 1x16 blocks (a 16x16 tile spans 16 rows), got {block}")
        if self.row_scaled and tensor_amax is not None:
            raise ValueError("nvfp4: row_scaled takes each row's own amax; leave tensor_amax unset")


PLAIN = Options()
"""The published recipe's NVFP4: one amax per tensor, the map-to-6 scale, E4M3 bound 448."""


def check_quantize_arguments(x, block, rounding, key, options=PLAIN, tensor_amax=None):
    """The ValueErrors of `quantize` (dtype, block, shape, rounding, key, options); returns x as a jax array."""
    x = jnp.asarray(x)
    _check_input(x, tuple(block))
    check_rounding(rounding, key, fmt="nvfp4")
    options.check(block, tensor_amax)
    return x


def scaled_blocks(x, block, tensor_amax=None, options=PLAIN):
    """The per-block half of the algorithm: (v, scale bytes, scale f32, amax).

    `tensor_amax` (float32 scalar, at least max |x|) replaces the tensor's own amax in the global scale:
    tensors quantized with one shared amax share one global scale, and each is coded exactly as its part of
    the stacked tensor would be (blocks and tiles never straddle two tensors whose rows are multiples of 16).

    v:           x_i · enc_b as float32 [N, K/16, 16], what the E2M1 rounding reads;
    scale bytes: the E4M3 block-scale bytes (uint8 [N, K/16]), behind an optimization barrier;
    scale f32:   their float32 values, behind a barrier too, so a consumer that multiplies every element
                 by its block's scale reads one float32 per block instead of re-decoding the byte;
    amax:        the float32 tensor amax, or with `options.row_scaled` one per row ([N]).
    With `options.four_over_six` the scale bytes are each block's better candidate (four_over_six.py).
    """
    cols = x.shape[-1]
    # The barrier materialises the block amaxes, so XLA does not fuse the tensor amax into a second
    # read of x (the amax pass is much slower without it: BENCHMARKS.md).
    block_maxima = lax.optimization_barrier(block_amax(x, block))  # [N, K/16] float32
    if tensor_amax is not None:
        amax = jnp.asarray(tensor_amax, jnp.float32)
    elif options.row_scaled:
        amax = formats.abs_max(block_maxima, axis=-1)  # [N]: the max of a row's block maxima
    else:
        amax = formats.abs_max(block_maxima)
    row_amax = amax[:, None] if options.row_scaled else amax  # broadcasts against [N, K/16]
    scales = global_scales(row_amax, options.e4m3_max)
    blocks = x.reshape(-1, cols // BLOCK_SIZE, BLOCK_SIZE).astype(jnp.float32)
    if options.four_over_six is None:
        scale_bytes = block_scale_bytes(block_maxima, scales)
    else:
        scale_bytes = four_over_six.scale_bytes(blocks, block_maxima, row_amax, scales, block[0], options)
    scale_bytes = lax.optimization_barrier(scale_bytes)
    scale_f32 = lax.optimization_barrier(formats.from_bytes(scale_bytes, jnp.float8_e4m3fn).astype(jnp.float32))
    encode = block_encode_scale(scale_f32, scales)
    return blocks * encode[..., None], scale_bytes, scale_f32, amax  # one fp32 multiply per element


def quantize(
    x,
    *,
    block=(1, 16),
    rounding="nearest",
    key=None,
    hadamard=False,
    tensor_amax=None,
    row_scaled=False,
    four_over_six=None,
    e4m3_max=448,
):
    """Quantize x (float32/bfloat16/float16, any leading axes) to NVFP4 along the last axis.

    block:    (1, 16) for activations and gradients, (16, 16) tiles of the last two axes for weights.
    rounding: "nearest" (RNE, saturating) or "stochastic" (8 random bits per element from `key`).
    hadamard: apply the 16-point RHT along the last axis first (rounded to x.dtype); the result
              holds the transformed values.
    The amax is taken over the whole tensor, or is `tensor_amax` when given (a group's shared amax, at
    least this tensor's own; see `scaled_blocks`). Raises ValueError on shapes the block does not divide.
    row_scaled, four_over_six, e4m3_max: the options of the module docstring (`Options`). With
    four_over_six the candidates are compared under RNE; `rounding` then applies to the chosen one.
    """
    block = tuple(block)
    options = Options(row_scaled, four_over_six, e4m3_max)
    x = check_quantize_arguments(x, block, rounding, key, options, tensor_amax)
    if hadamard:
        x = rht(x)

    cols = x.shape[-1]
    v, scale_bytes, _, amax = scaled_blocks(x, block, tensor_amax, options)
    codes = e2m1_codes(v, rounding, key)
    packed = formats.pack_nibbles(lax.optimization_barrier(codes).reshape(x.shape))
    scales = formats.from_bytes(scale_bytes.reshape(x.shape[:-1] + (cols // BLOCK_SIZE,)), jnp.float8_e4m3fn)
    return NVFP4Array(
        packed=packed,
        scales=scales,
        amax=amax.reshape(x.shape[:-1]) if row_scaled else amax,
        block=block,
        hadamard=bool(hadamard),
        row_scaled=bool(row_scaled),
        e4m3_max=int(e4m3_max),
    )


def block_scaled_values(q, dtype=jnp.float32):
    """e2m1(code) · s_b, without the per-tensor factor amax/2688.

    Exact in float32 and in bfloat16 (at most 6 significant bits, magnitudes 2^-10 .. 2688): these
    are the operands a block-scaled GEMM multiplies; its fp32 result is then scaled by both
    operands' amax/2688 (docs/numerics.md §6).
    """
    shape = q.shape
    values = formats.e2m1_decode_packed(q.packed).reshape(-1, shape[-1] // BLOCK_SIZE, BLOCK_SIZE)
    scale = q.scales.astype(jnp.float32).reshape(-1, shape[-1] // BLOCK_SIZE, 1)
    return (values * scale).reshape(shape).astype(dtype)


def dequantize(q, dtype=jnp.float32):
    """(e2m1(code) · s_b) · fp32(amax / (6 · e4m3_max)), computed in float32, then cast to `dtype`."""
    decode = tensor_decode_scale(q.amax, q.e4m3_max)
    return (block_scaled_values(q) * (decode[..., None] if q.row_scaled else decode)).astype(dtype)


def tensor_decode_scale(amax, e4m3_max=448):
    """fp32(amax / 2688) (or / 1536), correctly rounded on every platform (a multiply by fp32(1/2688) is not)."""
    return divide_correctly_rounded(amax, global_range(e4m3_max))
