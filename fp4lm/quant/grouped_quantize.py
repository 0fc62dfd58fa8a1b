"""Quantizing the token operands of a grouped GEMM: one tensor per expert, packed in one padded buffer.

Each expert's group of tokens is quantized as the dense path quantizes a whole operand (dot.py): its own
amax (so its own NVFP4 global scale or FP8 scale), its own stochastic-rounding bits (the bits that
`numerics.rounding.random_bits` draws for that group's tensor alone: the group's seeds at the element's
index in that tensor), and blocks that never leave the group (grouped_layout.py pads the groups). The
result is what the emulated GEMM multiplies (`gemm.emulated_operand`): block-scaled values in bfloat16 and
the per-group global scale, equal bit for bit to the dense path's operand of the group's tensor.

The operand comes in as ``[capacity, features]`` rows, and ``transposed`` says which tensor to quantize:
the rows themselves (fprop X, dgrad dY: blocks along the features) or their transpose ``[features,
capacity]`` (wgrad Xᵀ and dYᵀ: blocks and the RHT along the tokens). A transposed NVFP4 operand is
quantized in tiles of 16 tokens that are transposed where they lie (`_nvfp4_along_tokens`); the other
formats transform along the rows' token axis (`numerics.rht`'s ``axis``) and transpose the result.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from fp4lm import numerics
from fp4lm.errors import UserError
from fp4lm.numerics import formats, nvfp4
from fp4lm.numerics.division import divide_correctly_rounded, reciprocal_correctly_rounded
from fp4lm.numerics.fp8 import FP8_MAX
from fp4lm.numerics.rounding import hashed_random_bits, nearest_magnitude_value, stochastic_magnitude_value
from fp4lm.quant import gemm
from fp4lm.quant.grouped_layout import GroupLayout
from fp4lm.quant.recipes import QuantSpec

_FP8_DTYPES = {"fp8_e4m3": jnp.dtype(jnp.float8_e4m3fn), "fp8_e5m2": jnp.dtype(jnp.float8_e5m2)}
GROUPED_FORMATS = ("nvfp4", "mxfp8", "fp8_e4m3", "fp8_e5m2", "identity")
"""Formats with a grouped quantizer; MXFP4 (whose stochastic bits would need the same per-group treatment)
is not one yet."""


def quantize_token_operand(
    rows: jax.Array, spec: QuantSpec | None, layout: GroupLayout, *, transposed: bool, seeds: jax.Array | None
) -> tuple[jax.Array, jax.Array | None]:
    """(values the emulated GEMM multiplies, per-group global scale ``[experts + 1]`` or None), of ``rows``
    ``[capacity, features]`` or, when ``transposed``, of its transpose.

    ``seeds``: uint32 ``[experts + 1, 2]``, each group's two `random_bits` seeds (the last row, for the
    unused rows past the groups, is never read by a product), for a stochastic spec; else None.
    Entry ``experts`` of the scale belongs to those unused rows.
    """
    if spec is not None and (spec.row_scaled or spec.four_over_six):
        raise UserError(
            f"the MoE experts' grouped GEMM has no row-scaled or 4over6 token operands yet ({spec.describe()}); "
            "use such a recipe for dense layers only (precision.rules can give the experts plain nvfp4)"
        )
    if transposed and spec is not None and spec.format == "nvfp4":
        return _nvfp4_along_tokens(rows, spec, layout, seeds)
    a = rows
    if spec is not None and spec.hadamard:  # along the features, or the tokens in runs inside one group
        a = numerics.rht(a, axis=0 if transposed else -1)
    if transposed:
        a = jnp.swapaxes(a, 0, 1)
    if spec is None:
        return a, None
    token_axis = 1 if transposed else 0
    if spec.format == "identity":
        return a, None
    if spec.format == "nvfp4":
        return _nvfp4(a, spec, layout, seeds)
    if spec.format == "mxfp8":  # no tensor scale, and blocks of 32 inside a group: the whole buffer at once
        values, _ = gemm.emulated_operand(gemm.scaled_operand(numerics.quantize(a, "mxfp8", block=spec.block)))
        return values, None
    if spec.format in _FP8_DTYPES:
        return _fp8(a, _FP8_DTYPES[spec.format], layout, token_axis)
    raise ValueError(f"grouped quantization of format {spec.format!r} is not implemented; use one of {GROUPED_FORMATS}")


def group_amax(a: jax.Array, layout: GroupLayout, token_axis: int) -> jax.Array:
    """max |a| over each group's tokens, ``[experts + 1]`` float32 (0 for an empty group; NaN propagates)."""
    return _segment_amax(formats.abs_max(a, axis=1 - token_axis), layout.row_group, layout)


def _segment_amax(maxima: jax.Array, groups: jax.Array, layout: GroupLayout) -> jax.Array:
    """``[experts + 1]``: the max of ``maxima`` (non-negative, per token or per tile) over each group."""
    amax = jax.ops.segment_max(maxima, groups, num_segments=layout.experts + 1)
    return jnp.maximum(amax, jnp.float32(0.0))  # an empty group's -inf; NaN stays NaN


def _per_element(per_group: jax.Array, layout: GroupLayout, token_axis: int) -> jax.Array:
    """A per-group value broadcast over the operand, one per token along the token axis."""
    values = per_group[layout.row_group]
    return values[:, None] if token_axis == 0 else values[None, :]


def _nvfp4(a, spec: QuantSpec, layout: GroupLayout, seeds):
    """``a`` ``[capacity, features]``, blocks along the features: each row is one token."""
    nvfp4.check_quantize_arguments(a, spec.block, "nearest", None)
    # A token's amax is the max of its blocks' maxima, which scaled_blocks computes too (XLA does it once).
    amax = _segment_amax(formats.abs_max(nvfp4.block_amax(a, spec.block), axis=1), layout.row_group, layout)
    index = layout.row_index[:, None] * a.shape[1] + jnp.arange(a.shape[1], dtype=jnp.int32)[None, :]
    bits = _random_bits(spec, seeds, layout.row_group[:, None], index)
    values = _block_scaled_values(a, spec, _per_element(amax, layout, token_axis=0), bits)
    return values, nvfp4.tensor_decode_scale(amax)


def _nvfp4_along_tokens(rows, spec: QuantSpec, layout: GroupLayout, seeds):
    """The transpose ``[features, capacity]`` of ``rows`` ``[capacity, features]``, blocks (and the RHT) along
    the tokens, computed in token tiles: ``[capacity / 16, features, 16]``, run j of tile i being token
    16 i + j. Each tile is transposed where it lies, in a few KiB, and only the bf16 values cross the
    whole buffer at the end: transposing the buffer first makes every elementwise pass read a row apart
    (on a CPU ~3x slower at 2048 x 512; BENCHMARKS.md). The same bits either way."""
    capacity, features = rows.shape
    tiles = jnp.swapaxes(rows.reshape(capacity // nvfp4.BLOCK_SIZE, nvfp4.BLOCK_SIZE, features), 1, 2)
    if spec.hadamard:
        tiles = numerics.rht(tiles)
    nvfp4.check_quantize_arguments(tiles, spec.block, "nearest", None)
    tile_maxima = nvfp4.block_amax(tiles.reshape(-1, nvfp4.BLOCK_SIZE), spec.block)  # one block per (tile, feature)
    tile_group = layout.row_group[:: nvfp4.BLOCK_SIZE]
    amax = _segment_amax(
        formats.abs_max(tile_maxima.reshape(tile_group.shape[0], features), axis=1), tile_group, layout
    )
    token = jnp.arange(capacity, dtype=jnp.int32).reshape(capacity // nvfp4.BLOCK_SIZE, 1, nvfp4.BLOCK_SIZE)
    group_length = layout.padded_sizes[jnp.minimum(layout.row_group, layout.experts - 1)]
    feature = jnp.arange(features, dtype=jnp.int32)[None, :, None]
    index = feature * group_length[token] + layout.row_index[token]  # in the group's [features, rows] tensor
    bits = _random_bits(spec, seeds, layout.row_group[token], index)
    tensor_amax = jnp.broadcast_to(amax[tile_group][:, None, None], (tile_group.shape[0], features, 1))
    values = _block_scaled_values(tiles, spec, tensor_amax, bits)
    return jnp.swapaxes(values, 0, 1).reshape(features, capacity), nvfp4.tensor_decode_scale(amax)


def _block_scaled_values(x, spec: QuantSpec, tensor_amax, bits):
    """``e2m1 · s_b`` in bfloat16 (exact, as in nvfp4_fused) of ``x`` ``[..., K]`` viewed as ``[N, K]``, in
    ``spec.block`` blocks along K (a 16x16 tile spans 16 consecutive rows of that view), each block's global
    scale built from the amax of its group's tensor, ``tensor_amax`` (broadcast against ``[..., K / 16]``)."""
    x2 = x.reshape(-1, x.shape[-1])
    tensor_amax = jnp.broadcast_to(tensor_amax, x.shape[:-1] + (x.shape[-1] // nvfp4.BLOCK_SIZE,))
    v, _, scale_f32, _ = nvfp4.scaled_blocks(x2, spec.block, tensor_amax=tensor_amax.reshape(x2.shape[0], -1))
    magnitude_in = jnp.abs(v)
    if bits is not None:
        magnitude = stochastic_magnitude_value(magnitude_in, bits.reshape(v.shape))
        magnitude = jnp.where(jnp.isnan(magnitude), jnp.float32(0.0), magnitude)
    else:
        magnitude = nearest_magnitude_value(magnitude_in)
    signed = jnp.where(v < 0, -magnitude, magnitude)
    return (signed * scale_f32[..., None]).reshape(x.shape).astype(jnp.bfloat16)


def _random_bits(spec: QuantSpec, seeds, row_group, index) -> jax.Array | None:
    """Each element's bits as its group's tensor alone would draw them: that tensor's seeds (the element's
    group, ``row_group``), at the element's row-major ``index`` in it; None for a spec that rounds to
    nearest."""
    if not spec.stochastic:
        return None
    assert seeds is not None, "a stochastic spec needs the groups' seeds"
    group_seeds = seeds[row_group]  # [..., 2]
    return hashed_random_bits(group_seeds[..., 0], group_seeds[..., 1], index.astype(jnp.uint32))


def _fp8(a, dtype, layout: GroupLayout, token_axis: int):
    """Per-group current scaling, as numerics.fp8.quantize does for a whole tensor."""
    formats.check_input_dtype(a, "fp8")
    fmax = FP8_MAX[dtype]
    amax = group_amax(a, layout, token_axis)
    encode = jnp.where(amax == 0, jnp.float32(1.0), jnp.minimum(divide_correctly_rounded(fmax, amax), formats.FLT_MAX))
    scaled = jnp.clip(a.astype(jnp.float32) * _per_element(encode, layout, token_axis), -fmax, fmax)
    data = lax.optimization_barrier(scaled.astype(dtype))
    return data.astype(jnp.bfloat16), reciprocal_correctly_rounded(encode)
