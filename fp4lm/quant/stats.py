"""Quantization telemetry: how well a recipe represents an operand. Jittable; cheap enough for every N steps.

For an operand x quantized along its last axis by a `QuantSpec` (t = RHT(x) when the spec uses the RHT,
else x; the statistics describe the values the GEMM actually sees):

- ``rel_err``: ``||DQ(Q(x)) - t|| / ||t||`` (0 for an all-zero operand).
- ``saturated_frac``: fraction of elements clamped at the format's largest magnitude: their code is the
  top one (E2M1 ±6, E4M3 ±448, E5M2 ±57344) and the original magnitude is larger than the dequantized one.
  With NVFP4 this happens when a block scale rounds down in E4M3 (the block max then exceeds 6·s_b).
- ``underflow_frac``: fraction of non-zero blocks that vanished: for NVFP4 the blocks whose E4M3 scale
  underflowed to zero; for other formats the non-zero blocks (32 for MX, single elements for FP8) whose
  dequantized values are all zero.
- ``amax``: max |t|.

A mixture-of-experts projection (`grouped_layer_stats`) has one set per expert: expert e's weight and its
group of tokens are each their own quantized tensor (fp4lm.quant.grouped), so each is measured alone, its
fractions over its own elements and blocks (an expert that got no tokens reports an all-zero operand's: 0).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp4lm import numerics
from fp4lm.numerics.group_layout import GroupLayout
from fp4lm.quant.dot import quantize_operand, shared_amax_for
from fp4lm.quant.grouped import token_multiple
from fp4lm.quant.recipes import QuantSpec, Recipe

_TOP_MAGNITUDE_BYTE = {  # the largest finite magnitude's bit pattern (sign bit cleared)
    jnp.dtype(jnp.float8_e4m3fn): 0x7E,
    jnp.dtype(jnp.float8_e5m2): 0x7B,
}
_RELATIVE_SLACK = 2.0**-20  # the final fp32 multiply of a dequantization may round by an ulp


def _fraction(mask: jax.Array, of: jax.Array | float) -> jax.Array:
    """Elements of `mask` that are set, over `of` counted elements (0 when none is counted)."""
    return jnp.sum(mask.astype(jnp.float32)) / jnp.maximum(jnp.asarray(of, jnp.float32), 1.0)


def _top_code_mask(q) -> jax.Array:
    """Elements stored with the format's largest magnitude."""
    if isinstance(q, numerics.NVFP4Array) or (isinstance(q, numerics.MXArray) and q.element == "e2m1"):
        return (q.codes() & 0x7) == 0x7  # E2M1 magnitude code 7 = 6.0
    data = q.data
    magnitude = jax.lax.bitcast_convert_type(data, jnp.uint8) & 0x7F
    return magnitude == _TOP_MAGNITUDE_BYTE[jnp.dtype(data.dtype)]


def _block_size(q) -> int:
    if isinstance(q, numerics.NVFP4Array):
        return 16
    if isinstance(q, numerics.MXArray):
        return 32
    return 1


def operand_stats(
    x: jax.Array,
    spec: QuantSpec | None,
    *,
    key: jax.Array | None = None,
    tensor_amax=None,
    rows: jax.Array | None = None,
) -> dict:
    """``dict(rel_err, saturated_frac, underflow_frac, amax)`` of quantizing x [..., K] by ``spec``.

    ``key`` is needed by stochastic specs only (a ValueError without one: no fixed key is made up).
    ``tensor_amax``: the shared amax the operand's NVFP4 global scale is made from (the ``amax`` metric
    stays the operand's own). ``rows``: for a 2-D x, a boolean [rows] mask of the rows that make up the
    operand; the others must be zero, and count in no fraction (one expert's tokens in a padded buffer).
    """
    x = jnp.asarray(x)
    counted = x.size if rows is None else jnp.sum(rows.astype(jnp.int32)) * x.shape[-1]
    zero = jnp.float32(0.0)
    if spec is None:
        return dict(
            rel_err=zero, saturated_frac=zero, underflow_frac=zero, amax=jnp.max(jnp.abs(x)).astype(jnp.float32)
        )
    if key is None and spec.stochastic:
        raise ValueError(f"telemetry of a stochastic operand ({spec.describe()}) needs a key=; pass a PRNG key")
    target = (numerics.rht(x) if spec.hadamard else x).astype(jnp.float32)
    q = quantize_operand(x, spec, key, shared_amax_for(spec, tensor_amax))
    if isinstance(q, jax.Array):  # "identity": nothing is rounded
        return dict(rel_err=zero, saturated_frac=zero, underflow_frac=zero, amax=jnp.max(jnp.abs(target)))
    dequantized = q.dequantize(jnp.float32)

    norm = jnp.linalg.norm(target)
    rel_err = jnp.where(norm > 0, jnp.linalg.norm(dequantized - target) / jnp.where(norm > 0, norm, 1.0), 0.0)

    clipped = jnp.abs(target) > jnp.abs(dequantized) * (1.0 + _RELATIVE_SLACK)
    saturated = _top_code_mask(q).reshape(target.shape) & clipped

    size = _block_size(q)
    blocks = target.reshape(-1, size)
    nonzero_block = jnp.max(jnp.abs(blocks), axis=-1) > 0
    if isinstance(q, numerics.NVFP4Array):
        vanished = q.scale_bytes().reshape(-1) == 0
    else:
        vanished = jnp.max(jnp.abs(dequantized.reshape(-1, size)), axis=-1) == 0
    return dict(
        rel_err=rel_err.astype(jnp.float32),
        saturated_frac=_fraction(saturated, counted),
        underflow_frac=_fraction(nonzero_block & vanished, counted / size),
        amax=jnp.max(jnp.abs(target)),
    )


def layer_stats(x: jax.Array, w: jax.Array, recipe: Recipe, *, key: jax.Array | None = None, weight_amax=None) -> dict:
    """Statistics of a linear layer's forward operands: x [..., K] activations, w [K, N] kernel
    (as in ``nnx.Linear``; quantized as Wᵀ = [N, K], blocks along K; with the shared ``weight_amax``
    when its group shares one). Returns {"x": {...}, "w": {...}}."""
    x2 = jnp.reshape(x, (-1, x.shape[-1]))
    return {
        "x": operand_stats(x2, recipe.fprop_x, key=key),
        "w": operand_stats(jnp.swapaxes(w, 0, 1), recipe.fprop_w, key=key, tensor_amax=weight_amax),
    }


def grouped_layer_stats(x: jax.Array, w: jax.Array, group_sizes: jax.Array, recipe: Recipe) -> dict:
    """`layer_stats` of each expert of a grouped GEMM: x [rows, K] sorted by expert (group_sizes [X] rows
    each; rows past their sum, pairs a capacity dropped, belong to no expert), w [X, K, N].

    Returns {"x": {metric: [X]}, "w": {metric: [X]}}. Expert e's tokens are measured as the grouped GEMM
    quantizes them: its group alone, padded to whole blocks (`GroupLayout`), the other rows zero and not
    counted. The experts are visited one after another (`lax.map`), so the memory is one operand's.
    """
    layout = GroupLayout.of(group_sizes, x.shape[0], token_multiple(recipe))
    padded = layout.pad(x)

    def one_expert(expert_and_weight):
        expert, w_DM = expert_and_weight
        rows = (layout.row_group_R == expert) & (layout.row_index_R < group_sizes[expert])  # not its padding
        x_e = jnp.where(rows[:, None], padded, jnp.zeros((), padded.dtype))
        return {
            "x": operand_stats(x_e, recipe.fprop_x, rows=rows),
            "w": operand_stats(jnp.swapaxes(w_DM, 0, 1), recipe.fprop_w),
        }

    return jax.lax.map(one_expert, (jnp.arange(w.shape[0], dtype=jnp.int32), w))
