"""Segment-aware quantizers: each group of rows of one buffer quantized as its own tensor.

A mixture-of-experts layer multiplies each expert's group of routed rows by that expert's weight, and each
group is its own quantized tensor, as if it were quantized alone (`quantize_groups`): its own amax (so its
own NVFP4 global scale or FP8 scale), its own stochastic-rounding bits (the bits that
`rounding.random_bits` draws for that group's tensor alone: the group's seeds at the element's index in that
tensor), and blocks that never leave the group (`group_layout` pads the groups). The result is what an
emulated GEMM multiplies: block-scaled values in bfloat16 (``e2m1 · s_b``, or the FP8 / MXFP8 codes times
their block scale, all exact) and the per-group global scale, equal bit for bit to the dense quantizer's
values of the group's tensor (numerics.quantize, then its block-scaled values).

The operand comes in as ``[R, D]`` rows (D: the features) and ``transposed`` says which tensor to quantize:
the rows themselves (blocks along the features) or their transpose ``[D, R]`` (blocks and the RHT along
the rows, as a weight gradient contracting the rows needs them). A transposed NVFP4 operand is quantized in
tiles of 16 rows that are transposed where they lie (`_nvfp4_along_rows`); the other formats transform
along the rows' axis (`hadamard.rht`'s ``axis``) and transpose the result.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from fp4lm.numerics import formats, microscaling, nvfp4
from fp4lm.numerics.division import divide_correctly_rounded, reciprocal_correctly_rounded
from fp4lm.numerics.fp8 import FP8_MAX
from fp4lm.numerics.group_layout import GroupLayout
from fp4lm.numerics.hadamard import rht
from fp4lm.numerics.rounding import hashed_random_bits, nearest_magnitude_value, stochastic_magnitude_value

_FP8_DTYPES = {"fp8_e4m3": jnp.dtype(jnp.float8_e4m3fn), "fp8_e5m2": jnp.dtype(jnp.float8_e5m2)}
GROUPED_FORMATS = ("nvfp4", "mxfp8", "fp8_e4m3", "fp8_e5m2")
"""Formats with a segment-aware quantizer. MXFP4 (whose stochastic bits would need the same per-group
treatment) is not one yet; nor are NVFP4's row-scaled and 4over6 options."""


def quantize_groups(
    rows_RD: jax.Array,
    layout: GroupLayout,
    format: str | None,
    *,
    block: tuple[int, int] = (1, 16),
    hadamard: bool = False,
    transposed: bool = False,
    seeds_X2: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """(values an emulated GEMM multiplies, per-group global scale ``[X + 1]`` or None), of ``rows_RD`` or,
    when ``transposed``, of its transpose ``[D, R]``.

    ``format``: one of `GROUPED_FORMATS`, or None to leave the values as they are (after the RHT when
    ``hadamard``: a recipe's "identity" operand). ``block``: NVFP4's (1, 16) or (16, 16).
    ``seeds_X2``: uint32 ``[X + 1, 2]``, each group's two `rounding.random_bits` seeds, for stochastic
    rounding (NVFP4 only; the last row, for the unused rows past the groups, is never read by a product);
    None rounds to nearest. Entry X of the scale belongs to those unused rows.
    """
    if format is not None and format not in GROUPED_FORMATS:
        raise ValueError(f"no segment-aware quantizer for format {format!r}; use one of {GROUPED_FORMATS}")
    if seeds_X2 is not None and format != "nvfp4":
        raise ValueError(f"{format}: stochastic rounding of groups is implemented for nvfp4 only")
    if transposed and format == "nvfp4":
        return _nvfp4_along_rows(rows_RD, block, hadamard, layout, seeds_X2)
    a = rows_RD
    if hadamard:  # along the features, or along the rows in runs of 16 inside one group
        a = rht(a, axis=0 if transposed else -1)
    if transposed:
        a = jnp.swapaxes(a, 0, 1)
    row_axis = 1 if transposed else 0
    if format is None:
        return a, None
    if format == "nvfp4":
        return _nvfp4(a, block, layout, seeds_X2)
    if format == "mxfp8":  # no tensor scale, and blocks of 32 inside a group: the whole buffer at once
        q = microscaling.quantize_mxfp8(a)
        scales = jnp.repeat(q.scales.astype(jnp.bfloat16), microscaling.MX_BLOCK_SIZE, axis=-1)
        return q.data.astype(jnp.bfloat16) * scales, None
    return _fp8(a, _FP8_DTYPES[format], layout, row_axis)


def group_amax(a: jax.Array, layout: GroupLayout, row_axis: int) -> jax.Array:
    """max |a| over each group's rows, ``[X + 1]`` float32 (0 for an empty group; NaN propagates)."""
    return _segment_amax(formats.abs_max(a, axis=1 - row_axis), layout.row_group_R, layout)


def _segment_amax(maxima: jax.Array, groups: jax.Array, layout: GroupLayout) -> jax.Array:
    """``[X + 1]``: the max of ``maxima`` (non-negative, per row or per tile) over each group."""
    amax_X = jax.ops.segment_max(maxima, groups, num_segments=layout.groups + 1)
    return jnp.maximum(amax_X, jnp.float32(0.0))  # an empty group's -inf; NaN stays NaN


def _per_element(per_group: jax.Array, layout: GroupLayout, row_axis: int) -> jax.Array:
    """A per-group value broadcast over the operand, one per row along the row axis."""
    values_R = per_group[layout.row_group_R]
    return values_R[:, None] if row_axis == 0 else values_R[None, :]


def _nvfp4(a_RD, block, layout: GroupLayout, seeds_X2):
    """Blocks along the features: each row is one of its group's rows."""
    nvfp4.check_quantize_arguments(a_RD, block, "nearest", None)
    # A row's amax is the max of its blocks' maxima, which scaled_blocks computes too (XLA does it once).
    amax = _segment_amax(formats.abs_max(nvfp4.block_amax(a_RD, block), axis=1), layout.row_group_R, layout)
    index_RD = layout.row_index_R[:, None] * a_RD.shape[1] + jnp.arange(a_RD.shape[1], dtype=jnp.int32)[None, :]
    bits = _random_bits(seeds_X2, layout.row_group_R[:, None], index_RD)
    values = _block_scaled_values(a_RD, block, _per_element(amax, layout, row_axis=0), bits)
    return values, nvfp4.tensor_decode_scale(amax)


def _nvfp4_along_rows(rows_RD, block, hadamard: bool, layout: GroupLayout, seeds_X2):
    """The transpose ``[D, R]`` of ``rows_RD``, blocks (and the RHT) along the rows, computed in row tiles:
    ``[R / 16, D, 16]``, run j of tile i being row 16 i + j. Each tile is transposed where it lies, in a few
    KiB, and only the bf16 values cross the whole buffer at the end: transposing the buffer first makes
    every elementwise pass read a row apart (slower on a CPU; BENCHMARKS.md). The same bits."""
    capacity, features = rows_RD.shape
    tile = nvfp4.BLOCK_SIZE
    tiles = jnp.swapaxes(rows_RD.reshape(capacity // tile, tile, features), 1, 2)
    if hadamard:
        tiles = rht(tiles)
    nvfp4.check_quantize_arguments(tiles, block, "nearest", None)
    tile_maxima = nvfp4.block_amax(tiles.reshape(-1, tile), block)  # one block per (tile, feature)
    tile_group = layout.row_group_R[::tile]
    amax = _segment_amax(
        formats.abs_max(tile_maxima.reshape(tile_group.shape[0], features), axis=1), tile_group, layout
    )
    row = jnp.arange(capacity, dtype=jnp.int32).reshape(capacity // tile, 1, tile)
    group_length_R = layout.padded_sizes_X[jnp.minimum(layout.row_group_R, layout.groups - 1)]
    feature = jnp.arange(features, dtype=jnp.int32)[None, :, None]
    index = feature * group_length_R[row] + layout.row_index_R[row]  # in the group's [D, rows] tensor
    bits = _random_bits(seeds_X2, layout.row_group_R[row], index)
    tensor_amax = jnp.broadcast_to(amax[tile_group][:, None, None], (tile_group.shape[0], features, 1))
    values = _block_scaled_values(tiles, block, tensor_amax, bits)
    return jnp.swapaxes(values, 0, 1).reshape(features, capacity), nvfp4.tensor_decode_scale(amax)


def _block_scaled_values(x, block, tensor_amax, bits):
    """``e2m1 · s_b`` in bfloat16 (exact, as in nvfp4_fused) of ``x`` ``[..., D]`` viewed as ``[rows, D]``,
    in ``block`` blocks along D (a 16x16 tile spans 16 consecutive rows of that view), each block's global
    scale built from the amax of its group's tensor, ``tensor_amax`` (broadcast against ``[..., D / 16]``)."""
    x2 = x.reshape(-1, x.shape[-1])
    tensor_amax = jnp.broadcast_to(tensor_amax, x.shape[:-1] + (x.shape[-1] // nvfp4.BLOCK_SIZE,))
    v, _, scale_f32, _ = nvfp4.scaled_blocks(x2, block, tensor_amax=tensor_amax.reshape(x2.shape[0], -1))
    magnitude_in = jnp.abs(v)
    if bits is not None:
        magnitude = stochastic_magnitude_value(magnitude_in, bits.reshape(v.shape))
        magnitude = jnp.where(jnp.isnan(magnitude), jnp.float32(0.0), magnitude)
    else:
        magnitude = nearest_magnitude_value(magnitude_in)
    signed = jnp.where(v < 0, -magnitude, magnitude)
    return (signed * scale_f32[..., None]).reshape(x.shape).astype(jnp.bfloat16)


def _random_bits(seeds_X2, row_group, index) -> jax.Array | None:
    """Each element's bits as its group's tensor alone would draw them: that tensor's seeds (the element's
    group, ``row_group``), at the element's row-major ``index`` in it; None to round to nearest."""
    if seeds_X2 is None:
        return None
    group_seeds = seeds_X2[row_group]  # [..., 2]
    return hashed_random_bits(group_seeds[..., 0], group_seeds[..., 1], index.astype(jnp.uint32))


def _fp8(a, dtype, layout: GroupLayout, row_axis: int):
    """Per-group current scaling, as fp8.quantize does for a whole tensor."""
    formats.check_input_dtype(a, "fp8")
    fmax = FP8_MAX[dtype]
    amax = group_amax(a, layout, row_axis)
    encode = jnp.where(amax == 0, jnp.float32(1.0), jnp.minimum(divide_correctly_rounded(fmax, amax), formats.FLT_MAX))
    scaled = jnp.clip(a.astype(jnp.float32) * _per_element(encode, layout, row_axis), -fmax, fmax)
    data = lax.optimization_barrier(scaled.astype(dtype))
    return data.astype(jnp.bfloat16), reciprocal_correctly_rounded(encode)
