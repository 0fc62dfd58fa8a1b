"""The grouped quantized GEMM of mixture-of-experts layers: row p of y is ``x[p] @ w[e]`` for p's expert e.

``grouped_dot(x, w, group_sizes, recipe, key=...)`` takes the (token, expert) pairs sorted by expert (x
``[P, D]``, ``group_sizes[e]`` rows for expert e) and one kernel per expert (w ``[X, D, M]``, the nnx.Linear
layout per expert; D in and M out as in the gate and up projections, the down projection passes them the
other way), and runs all three GEMMs of every expert under the recipe through a custom VJP, as a loop over
the experts of the dense quantized dot (dot.py) would, sharing its scaffolding:

- each expert's weight is its own quantized tensor (its own amax, 16x16 NVFP4 tiles), quantized by the dense
  path's own `dot.gemm_input`, vmapped over the experts, and quantized once where the dense path reuses
  its copy transposed (`dot.reuses_transposed`);
- each expert's group of rows is its own tensor for X, dY, Xᵀ and dYᵀ (fp4lm.numerics.grouped): its own
  amax, blocks (and the RHT's runs of 16) that never straddle two experts, because every group is padded
  with zero rows to a multiple of the blocks (`token_multiple`), as TransformerEngine's grouped quantize does;
- stochastic rounding draws, for expert e, the bits of ``dot_general(recipe)(..., key=fold_in(key, e))``:
  the per-expert key, then the dense path's per-slot keys (`dot.operand_keys`);
- dY is quantized in the inputs' dtype (`dot.gradient_operand`), a missing key is the dense path's error
  (`dot.require_key`), and the residuals carry the dense path's names (`dot.residual_name`).

The products (fp4lm.quant.grouped_gemm) multiply the block-scaled bfloat16 values of the FP4 (or FP8)
operands with float32 sums, then apply the global scales, in one of two ways:

- On a GPU or TPU (`uses_ragged_dot`) each GEMM is ONE ``jax.lax.ragged_dot`` over all the experts: the
  device's grouped GEMM kernel, no loop. Its float32 sums may run in another order than a per-expert dot's,
  so its results may differ from the per-expert loop in the last bits of float32, never in the quantized
  operands (tests/quant/test_grouped_ragged.py forces this path on a CPU).
- On a CPU, where XLA lowers a ragged dot to a dense contraction over every expert (X times the work), a
  loop over the experts of dense dots on exactly their padded rows, which equals the per-expert loop of the
  dense dot bit for bit (tests/quant/test_grouped_dot.py).

Why not a block-scaled GEMM under the ``native`` backend: XLA has no grouped one. ``jax.nn.scaled_matmul``
(cuDNN's block-scaled dot) is a dense batched product of static shapes, and ``ragged_dot`` takes no block
scales; block-scaled dots of routed (traced) group sizes would need every expert padded to a fixed capacity
(the work and memory of X times that many rows, and dropped tokens). So the experts run on the bf16 tensor
cores of any GPU, on values that are exactly the quantized ones, while the dense layers of the same model
take the FP4 GEMM under ``native`` (tests/quant/test_grouped_cuda_lowering.py lowers both for CUDA).

The bf16 recipe (nothing quantized) is ``jax.lax.ragged_dot`` differentiated by JAX on a GPU or TPU; on a
CPU it is the loop with nothing quantized, so an MoE model's bf16 baseline does the same GEMMs as its
quantized recipes. ``grouped_dot(..., ragged=True)`` (or False) forces a path, whatever the device.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.core import Tracer

from fp4lm.errors import UserError
from fp4lm.numerics.group_layout import GroupLayout
from fp4lm.numerics.grouped import GROUPED_FORMATS, quantize_groups
from fp4lm.numerics.rounding import random_bits_seeds
from fp4lm.quant import gemm
from fp4lm.quant.dot import (
    UNQUANTIZED_OPERAND_NAME,
    gemm_input,
    gradient_operand,
    operand_keys,
    require_key,
    residual_name,
    reuses_transposed,
    shared_amax_for,
)
from fp4lm.quant.grouped_gemm import group_contraction, rows_product
from fp4lm.quant.recipes import BACKWARD_SLOTS, FORWARD_SLOTS, QuantSpec, Recipe, get_recipe

BLOCK_ALIGNMENT = 16
"""Groups are padded to at least this many rows: the RHT's runs and NVFP4's blocks, and the row tile of the
looped GEMM (grouped_gemm.py), even for a recipe with no blocks along the rows (fp8)."""
TOKEN_SLOTS = ("fprop_x", "dgrad_g", "wgrad_g", "wgrad_x")
"""The slots whose operand is the routed rows (X or dY), quantized per expert group (numerics.grouped)."""
TOKEN_FORMATS = (*GROUPED_FORMATS, "identity")
"""The formats a grouped operand may take: those with a segment-aware quantizer, and none at all."""


@dataclass(frozen=True)
class _Static:
    """What the custom VJP needs that is not an array (hashable)."""

    recipe: Recipe
    multiple: int  # each group is padded to a multiple of this many rows
    compute_dtype: jnp.dtype
    x_dtype: jnp.dtype
    w_dtype: jnp.dtype
    where: str
    ragged: bool  # one ragged_dot per GEMM (GPU, TPU), or the loop over the experts (CPU)


def grouped_dot(
    x: jax.Array,
    w: jax.Array,
    group_sizes: jax.Array,
    recipe: str | Recipe,
    *,
    key: jax.Array | None = None,
    name: str | None = None,
    first_expert: int | jax.Array = 0,
    weight_amax: jax.Array | None = None,
    ragged: bool | None = None,
) -> jax.Array:
    """``[P, M]``: row p is ``x[p] @ w[e]`` for the expert e whose group holds row p.

    ``x`` ``[P, D]``; ``w`` ``[X, D, M]``. ``group_sizes``: int ``[X]``, the rows of each expert in order
    (traced values are fine; they sum to at most P: a row past the sum, one an expert's capacity dropped,
    gets a zero row, as with ragged_dot). ``key``: the step's key, needed when the recipe rounds
    stochastically where bits are drawn. ``name``: the layer, for errors.
    ``first_expert``: the index of ``w[0]`` among all the layer's experts, when ``w`` holds a slice of them
    (expert parallelism): expert e's bits come from ``fold_in(key, first_expert + e)``, as unsharded.
    ``weight_amax``: float32 ``[X]``, each expert's amax to build its NVFP4 weight's global scale from
    instead of its own (a fused gate/up pair's shared amax, precision.shared_weight_scale), as the dense
    path's ``weight_amax``; None: each weight's own.
    ``ragged``: one ragged_dot per GEMM (True) or the loop over the experts (False); None: as
    `uses_ragged_dot` says for this device (module docstring).
    The output is in the inputs' common dtype; the gradients in the primals' dtypes.
    """
    recipe = get_recipe(recipe)
    where = f"layer {name!r}" if name else "grouped_dot"
    x_PD, w_XDM, group_sizes_X = jnp.asarray(x), jnp.asarray(w), jnp.asarray(group_sizes)
    _check_shapes(x_PD, w_XDM, group_sizes_X, where)
    ragged = uses_ragged_dot() if ragged is None else bool(ragged)
    if not recipe.is_quantized and ragged:
        x_PD, w_XDM = checkpoint_name((x_PD, w_XDM), UNQUANTIZED_OPERAND_NAME)  # as a bf16 dense layer's
        y_PM = lax.ragged_dot(x_PD, w_XDM, group_sizes_X.astype(jnp.int32))
        # ragged_dot leaves the rows past the groups (dropped pairs) unspecified: make them the promised zeros.
        kept_P = jnp.arange(x_PD.shape[0]) < jnp.sum(group_sizes_X)
        return jnp.where(kept_P[:, None], y_PM, jnp.zeros((), y_PM.dtype))
    _check_recipe(recipe, d_in=x_PD.shape[1], d_out=w_XDM.shape[2], where=where)
    compute_dtype = jnp.result_type(x_PD.dtype, w_XDM.dtype)
    static = _Static(recipe, token_multiple(recipe), compute_dtype, x_PD.dtype, w_XDM.dtype, where, ragged)
    require_key(recipe, FORWARD_SLOTS, has_key=key is not None, where=where)
    first = jnp.asarray(first_expert, jnp.int32)
    if weight_amax is not None:
        weight_amax = lax.stop_gradient(jnp.asarray(weight_amax, jnp.float32))
    return _grouped_dot(static, x_PD, w_XDM, group_sizes_X.astype(jnp.int32), key, first, weight_amax)


def uses_ragged_dot(device=None) -> bool:
    """Whether the experts' GEMMs run as ``jax.lax.ragged_dot``: on a GPU or TPU, where it is a native grouped
    GEMM. On a CPU (the first local device, decided when tracing, as the ``auto`` backend is) XLA lowers it to
    a dense contraction over every expert, X times the work, so there the experts take the loop, for every
    recipe: the same GEMMs for bf16 and the quantized recipes, which keeps their comparison honest."""
    device = jax.devices()[0] if device is None else device
    return device.platform != "cpu"


def token_multiple(recipe: Recipe) -> int:
    """The multiple each group of rows is padded to: every block along the row axis of any operand of the
    recipe (wgrad's contraction, a 16x16 tile's rows), and at least `BLOCK_ALIGNMENT`."""
    multiples = [BLOCK_ALIGNMENT]
    for slot in ("fprop_x", "dgrad_g"):  # the rows are their rows
        spec = getattr(recipe, slot)
        multiples.append(1 if spec is None else spec.row_multiple)
    for slot in ("wgrad_g", "wgrad_x"):  # the rows are their contraction
        spec = getattr(recipe, slot)
        multiples.append(1 if spec is None else spec.contraction_multiple)
    return math.lcm(*multiples)


def _check_shapes(x_PD, w_XDM, group_sizes_X, where: str) -> None:
    if x_PD.ndim != 2 or w_XDM.ndim != 3 or group_sizes_X.ndim != 1:
        raise UserError(
            f"{where}: expected x [tokens, d_in], w [experts, d_in, d_out] and group_sizes [experts], got shapes "
            f"{tuple(x_PD.shape)}, {tuple(w_XDM.shape)} and {tuple(group_sizes_X.shape)}; sort the tokens by "
            "expert and flatten them to one axis"
        )
    if group_sizes_X.shape[0] != w_XDM.shape[0]:
        raise UserError(
            f"{where}: group_sizes has {group_sizes_X.shape[0]} entries but w has {w_XDM.shape[0]} experts; pass one "
            "group size per expert"
        )
    if x_PD.shape[1] != w_XDM.shape[1]:
        raise UserError(f"{where}: x has d_in={x_PD.shape[1]} but w has d_in={w_XDM.shape[1]}; they must be equal")
    if not jnp.issubdtype(group_sizes_X.dtype, jnp.integer):
        raise UserError(f"{where}: group_sizes must be integers, got {group_sizes_X.dtype}")
    # A concrete array is summed in numpy: under a jit that closes over it, jnp would give a tracer.
    total = None if isinstance(group_sizes_X, Tracer) else int(np.asarray(group_sizes_X).sum())
    if total is not None and total > x_PD.shape[0]:
        raise UserError(
            f"{where}: group_sizes sum to {total} but x has {x_PD.shape[0]} tokens; they cannot sum "
            "to more (rows past the sum are dropped tokens)"
        )


def _check_recipe(recipe: Recipe, *, d_in: int, d_out: int, where: str) -> None:
    """The dense shape rule on the features (the rows are padded), and the formats grouped here."""
    recipe.check_gemm_shapes(m=None, n=d_out, k=d_in, where=f"{where} (d_in {d_in}, d_out {d_out})")
    check_grouped_formats(recipe, where=where)


def check_grouped_formats(recipe: Recipe, *, where: str) -> None:
    """The one rule of which formats a grouped GEMM's operands may use: every format the recipe quantizes to
    has a segment-aware quantizer (`TOKEN_FORMATS`; the weights too, so that an expert's operands are alike),
    and no row operand is row-scaled or 4over6 (the segment-aware quantizer has neither yet; the expert
    weights may use them)."""
    for slot, spec in recipe.specs().items():
        if spec is not None and slot in TOKEN_SLOTS and (spec.row_scaled or spec.four_over_six):
            raise UserError(
                f"{where}: recipe {recipe.name!r} quantizes {slot} as {spec.describe()}; the experts' grouped GEMM "
                "has no row-scaled or 4over6 token operands yet; give the experts plain nvfp4 (precision.rules, "
                r"e.g. 'blocks\.\d+\.mlp\.experts\..*=nvfp4')"
            )
        if spec is not None and spec.format not in TOKEN_FORMATS:
            raise UserError(
                f"{where}: recipe {recipe.name!r} quantizes {slot} as {spec.format}, which the grouped GEMM does "
                f"not implement yet; use a recipe whose formats are among {', '.join(TOKEN_FORMATS)} for the "
                "experts (precision.rules)"
            )


def _token_operand(rows_RD, spec: QuantSpec | None, layout: GroupLayout, *, transposed: bool, seeds_X2):
    """The quantized (values, per-group scale) of a row operand, ``rows_RD`` or its transpose, as ``spec``
    says (None, or "identity": the values, after the RHT the spec asks for)."""
    if spec is None:
        return quantize_groups(rows_RD, layout, None, transposed=transposed)
    return quantize_groups(
        rows_RD,
        layout,
        None if spec.format == "identity" else spec.format,
        block=spec.block,
        hadamard=spec.hadamard,
        transposed=transposed,
        seeds_X2=seeds_X2,
    )


def _slot_seeds(spec: QuantSpec | None, slot: str, expert_keys) -> jax.Array | None:
    """uint32 ``[X + 1, 2]``: each expert's `random_bits` seeds for ``slot`` (a zero row for the unused
    rows); None when the slot draws no bits."""
    if spec is None or not spec.stochastic:
        return None
    seeds_X2 = jax.vmap(lambda k: random_bits_seeds(operand_keys(k)[slot]))(expert_keys)
    return jnp.concatenate([seeds_X2, jnp.zeros((1, 2), seeds_X2.dtype)])


def _expert_keys(key, experts: int, first_expert):
    return None if key is None else jax.vmap(lambda e: jax.random.fold_in(key, e))(first_expert + jnp.arange(experts))


def _weight_operand(w3: jax.Array, spec: QuantSpec | None, slot: str, expert_keys, weight_amax=None):
    """Each expert's ``w3[e]`` ``[rows, contraction]`` quantized by the dense path (vmapped): values
    ``[X, rows, contraction]`` and scales ``[X]`` (or None). ``weight_amax`` ``[X]``: the shared amaxes,
    where the spec takes one (dot.shared_amax_for)."""
    amax = shared_amax_for(spec, weight_amax)

    def one(w_e, key_e, amax_e):
        slot_key = None if key_e is None else operand_keys(key_e)[slot]
        values, scale = gemm.emulated_operand(gemm_input(w_e[None], spec, slot_key, "emulated", amax_e))
        return values[0], scale

    return jax.vmap(one, in_axes=(0, None if expert_keys is None else 0, None if amax is None else 0))(
        w3, expert_keys, amax
    )


def _forward(st: _Static, x_PD, w_XDM, group_sizes_X, key, first_expert, weight_amax, *, save: bool):
    """Y, and with ``save`` the residuals: the fprop weight operand itself when dgrad can take it transposed
    (a 16x16-tiled NVFP4 weight: the dense path reuses it the same way, dot.reuses_transposed), else w."""
    recipe, experts = st.recipe, w_XDM.shape[0]
    layout = GroupLayout.of(group_sizes_X, x_PD.shape[0], st.multiple)
    expert_keys = _expert_keys(key, experts, first_expert)
    seeds_X2 = _slot_seeds(recipe.fprop_x, "fprop_x", expert_keys)
    xv_RD, x_scale = _token_operand(layout.pad(x_PD), recipe.fprop_x, layout, transposed=False, seeds_X2=seeds_X2)
    wv_XMD, w_scale = _weight_operand(jnp.swapaxes(w_XDM, 1, 2), recipe.fprop_w, "fprop_w", expert_keys, weight_amax)
    y_RM = rows_product(xv_RD, x_scale, wv_XMD, w_scale, layout, st.multiple, st.compute_dtype, ragged=st.ragged)
    y_PM = layout.unpad(y_RM)
    if not save:
        return y_PM, None
    weight = (wv_XMD, w_scale) if reuses_transposed(recipe.fprop_w, recipe.dgrad_w) else w_XDM
    # Named as the dense dot names what it saves, so that model.remat's policies keep them (llama.remat_policy).
    x_PD, weight = checkpoint_name((x_PD, weight), residual_name(recipe))
    return y_PM, (x_PD, weight, group_sizes_X, key, first_expert, weight_amax)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _grouped_dot(st: _Static, x_PD, w_XDM, group_sizes_X, key, first_expert, weight_amax):
    return _forward(st, x_PD, w_XDM, group_sizes_X, key, first_expert, weight_amax, save=False)[0]


def _grouped_dot_fwd(st: _Static, x_PD, w_XDM, group_sizes_X, key, first_expert, weight_amax):
    require_key(st.recipe, BACKWARD_SLOTS, has_key=key is not None, where=st.where)
    return _forward(st, x_PD, w_XDM, group_sizes_X, key, first_expert, weight_amax, save=True)


def _grouped_dot_bwd(st: _Static, saved, g_PM):
    """dX by rows against each expert's Wᵀ; dW per expert over its rows (dYᵀ · Xᵀ, contracting them).
    The row operands are quantized again from the saved bf16 x (what a dense layer saves is its quantized
    copies; the values are the same either way, as dot.py's exact transposes are)."""
    x_PD, weight, group_sizes_X, key, first_expert, weight_amax = saved
    recipe, experts = st.recipe, group_sizes_X.shape[0]
    layout = GroupLayout.of(group_sizes_X, x_PD.shape[0], st.multiple)
    expert_keys = _expert_keys(key, experts, first_expert)
    g_RM = layout.pad(g_PM)
    # dgrad: dX [R, D] = dY [R, M] · (W [M, D] per expert), contracting M.
    gv_RM, g_scale = _token_operand(
        gradient_operand(g_RM, recipe.dgrad_g, st.compute_dtype),
        recipe.dgrad_g,
        layout,
        transposed=False,
        seeds_X2=_slot_seeds(recipe.dgrad_g, "dgrad_g", expert_keys),
    )
    reused = isinstance(weight, tuple)  # the fprop tiles [X, M, D], read as they lie (they transpose exactly)
    if reused:
        wv, w_scale = weight
    else:  # Wᵀ's rows are D, its contraction M: [X, D, M]
        wv, w_scale = _weight_operand(weight, recipe.dgrad_w, "dgrad_w", expert_keys, weight_amax)
    dx_RD = rows_product(
        gv_RM, g_scale, wv, w_scale, layout, st.multiple, st.x_dtype, b_transposed=reused, ragged=st.ragged
    )
    # wgrad: dW [D, M] per expert = Xᵀ [D, R] · (dYᵀ [M, R])ᵀ, contracting the expert's rows.
    gtv_MR, gt_scale = _token_operand(
        gradient_operand(g_RM, recipe.wgrad_g, st.compute_dtype),
        recipe.wgrad_g,
        layout,
        transposed=True,
        seeds_X2=_slot_seeds(recipe.wgrad_g, "wgrad_g", expert_keys),
    )
    xtv_DR, xt_scale = _token_operand(
        layout.pad(x_PD),
        recipe.wgrad_x,
        layout,
        transposed=True,
        seeds_X2=_slot_seeds(recipe.wgrad_x, "wgrad_x", expert_keys),
    )
    dw_XDM = group_contraction(gtv_MR, gt_scale, xtv_DR, xt_scale, layout, st.multiple, st.w_dtype, ragged=st.ragged)
    return layout.unpad(dx_RD), dw_XDM, None, None, None, None


_grouped_dot.defvjp(_grouped_dot_fwd, _grouped_dot_bwd)
