"""The grouped quantized GEMM of mixture-of-experts layers: ``y[tokens of e] = x[tokens of e] @ w[e]``.

``grouped_dot(x, w, group_sizes, recipe, key=...)`` takes tokens sorted by expert (x ``[tokens, d_in]``,
``group_sizes[e]`` of them for expert e, summing to ``tokens``) and one kernel per expert (w
``[experts, d_in, d_out]``, the nnx.Linear layout per expert), and runs all three GEMMs of every expert
under the recipe through a custom VJP, exactly as a loop over the experts of the dense quantized dot would:

- each expert's weight is its own quantized tensor (its own amax, 16x16 NVFP4 tiles), quantized by the dense
  path's own functions, vmapped over the experts;
- each expert's group of tokens is its own tensor for X, dY, Xᵀ and dYᵀ: its own amax, blocks (and the
  RHT's runs of 16) that never straddle two experts, because every group is padded with zero rows to a
  multiple of the blocks (`grouped_layout.token_multiple`), as TransformerEngine's grouped quantize does;
- stochastic rounding draws, for expert e, the bits of ``dot_general(recipe)(..., key=fold_in(key, e))``:
  the per-expert key ``fold_in(key, e)``, then the dense path's per-slot keys (dot.operand_keys).

So the outputs equal, bit for bit, the dense dot applied to each expert's tokens padded with zero rows to
the same multiple (tests/quant/test_grouped_dot.py). The emulated product is used (gemm.tn_dot on the
block-scaled bfloat16 values, then the global scales), on every backend (see the end).

Why not ``jax.lax.ragged_dot`` for the quantized GEMMs: on CPU (and on any backend without a native ragged
dot) JAX lowers it to a dense contraction over all experts, with the expert axis as an extra contraction
axis: ``experts`` times the work, and float32 sums in another order, so its results differ from a per-expert
dot in the last bits. Here instead:

- fprop and dgrad (tokens are rows) run as a loop over the experts (``lax.fori_loop``): each expert's
  padded group is cut into chunks of static lengths, the binary digits of its length from 256 rows up and
  one remainder of its exact length (608 rows: 512 + 96; ``lax.cond`` skips the digits that are 0,
  ``lax.switch`` picks the remainder), each multiplied by the expert's weight alone and written at its
  rows. No row is moved and nothing is computed past the blocks' padding: the work of the per-expert loop
  in a few dots per expert. Each row's sums equal the dense dot's wherever XLA:CPU
  sums a row alike for the chunk's and the group's row counts, as the tests check bit for bit (not for
  every shape and CPU: tests/model/test_expert_parallel.py measured a case that differs);
- wgrad (tokens are the contraction) runs per expert (``lax.map``) over a window of the padded buffer that
  starts at the expert's first row, the rows past its group masked to zero: the dense dot's sum followed by
  exact zeros. A window's length is static, so each expert takes the shortest of a few lengths (16 times
  1, ..., 8, 10, 12, 14, 16, 20, ..., up to the buffer) that holds its group, through ``lax.switch``: at
  most 1.25 times the loop's work;
- the weight is quantized once: dgrad takes the fprop copy transposed when the dense path would (16x16
  tiles; dot.py), saved in place of the bf16 weight.

The backends. The emulated product runs on every backend, ``native`` included, for these reasons: XLA has
no block-scaled grouped GEMM. jax's block-scaled GEMM (``jax.nn.scaled_matmul``, lowered for CUDA to cuDNN's
``__op$block_scaled_dot``) is a dense batched product of static shapes, and ``jax.lax.ragged_dot`` (the
grouped GEMM, ``chlo.ragged_dot``) takes no block scales. Per-expert block-scaled dots of routed (traced)
group sizes would need static shapes: each expert padded to a fixed capacity (the work and memory of
``experts x capacity`` rows, and dropped tokens), or fprop/dgrad as a batched block-scaled product over row
chunks with each chunk's FP4 expert weight gathered, and wgrad, which contracts the tokens, as per-chunk
partial products summed per expert: a float32 ``[chunks, N, K]`` buffer and sums in another order than one
expert's dot. Neither is the per-expert loop, so the experts stay on the emulated product (bf16 values of
the FP4 blocks, float32 accumulation: the numbers of the per-expert loop, on the bf16 tensor cores of any
GPU) and the dense layers of the same model take the FP4 GEMM under ``native``
(tests/quant/test_grouped_cuda_lowering.py lowers both for CUDA).

The bf16 recipe (nothing quantized) is ``jax.lax.ragged_dot``, differentiated by JAX, where that is a native
grouped GEMM (GPU, TPU); on a CPU, where XLA lowers it to a dense contraction over every expert (``experts``
times the work), it is the tiled path above with nothing quantized (`uses_ragged_dot`), so an MoE model's
bf16 baseline does the same GEMMs as its quantized recipes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.core import Tracer

from fp4lm.errors import UserError
from fp4lm.numerics.rounding import random_bits_seeds
from fp4lm.quant import gemm
from fp4lm.quant.dot import (
    QUANTIZED_RESIDUAL_NAME,
    UNQUANTIZED_OPERAND_NAME,
    _reuse_transposed,
    gemm_input,
    operand_keys,
    shared_amax_for,
)
from fp4lm.quant.grouped_layout import GroupLayout, token_multiple
from fp4lm.quant.grouped_quantize import GROUPED_FORMATS, quantize_token_operand
from fp4lm.quant.recipes import BACKWARD_SLOTS, FORWARD_SLOTS, QuantSpec, Recipe, get_recipe


@dataclass(frozen=True)
class _Static:
    """What the custom VJP needs that is not an array (hashable)."""

    recipe: Recipe
    multiple: int  # each group is padded to a multiple of this many rows
    compute_dtype: jnp.dtype
    x_dtype: jnp.dtype
    w_dtype: jnp.dtype
    where: str

    def check(self, slots: tuple[str, ...], *, has_key: bool) -> None:
        stochastic = [slot for slot in slots if self.recipe.is_stochastic((slot,))]
        if stochastic and not has_key:
            raise UserError(
                f"{self.where}: recipe {self.recipe.name!r} rounds {', '.join(stochastic)} stochastically, but no "
                "random key was given; pass key= (a fresh key per step) on each call"
            )


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
) -> jax.Array:
    """``[tokens, d_out]``: row t is ``x[t] @ w[e]`` for the expert e whose group holds token t.

    ``group_sizes``: int ``[experts]``, the tokens of each expert in order (traced values are fine; they sum to
    at most ``tokens``: a token past the sum, one an expert's capacity dropped, gets a zero row, as with
    ragged_dot). ``key``: the step's key,
    needed when the recipe rounds stochastically where bits are drawn. ``name``: the layer, for errors.
    ``first_expert``: the index of ``w[0]`` among all the layer's experts, when ``w`` holds a slice of them
    (expert parallelism): expert e's bits come from ``fold_in(key, first_expert + e)``, as unsharded.
    ``weight_amax``: float32 ``[experts]``, each expert's amax to build its NVFP4 weight's global scale from
    instead of its own (a fused gate/up pair's shared amax, precision.shared_weight_scale), as the dense
    path's ``weight_amax``; None: each weight's own.
    The output is in the inputs' common dtype; the gradients in the primals' dtypes.
    """
    recipe = get_recipe(recipe)
    where = f"layer {name!r}" if name else "grouped_dot"
    x, w, group_sizes = jnp.asarray(x), jnp.asarray(w), jnp.asarray(group_sizes)
    _check_shapes(x, w, group_sizes, where)
    if not recipe.is_quantized and uses_ragged_dot():
        x, w = checkpoint_name((x, w), UNQUANTIZED_OPERAND_NAME)  # as a bf16 dense layer's, for remat policies
        y = lax.ragged_dot(x, w, group_sizes.astype(jnp.int32))
        # ragged_dot leaves the rows past the groups (dropped tokens) unspecified: make them the promised zeros.
        kept = jnp.arange(x.shape[0]) < jnp.sum(group_sizes)
        return jnp.where(kept[:, None], y, jnp.zeros((), y.dtype))
    _check_recipe(recipe, d_in=x.shape[1], d_out=w.shape[2], where=where)
    compute_dtype = jnp.result_type(x.dtype, w.dtype)
    multiple = token_multiple(recipe)
    static = _Static(recipe, multiple, compute_dtype, x.dtype, w.dtype, where)
    static.check(FORWARD_SLOTS, has_key=key is not None)
    first = jnp.asarray(first_expert, jnp.int32)
    if weight_amax is not None:
        weight_amax = lax.stop_gradient(jnp.asarray(weight_amax, jnp.float32))
    return _grouped_dot(static, x, w, group_sizes.astype(jnp.int32), key, first, weight_amax)


def uses_ragged_dot(device=None) -> bool:
    """Whether the bf16 recipe runs as ``jax.lax.ragged_dot``: on a GPU or TPU, where it is a native grouped
    GEMM. On a CPU (the first local device, decided when tracing, as the ``auto`` backend is) XLA lowers it to
    a dense contraction over every expert, ``experts`` times the work, so there the bf16 experts take the
    tiled path below with nothing quantized: the same GEMMs as the quantized recipes, which keeps a
    bf16-vs-nvfp4 comparison of an MoE model honest."""
    device = jax.devices()[0] if device is None else device
    return device.platform != "cpu"


def _check_shapes(x, w, group_sizes, where: str) -> None:
    if x.ndim != 2 or w.ndim != 3 or group_sizes.ndim != 1:
        raise UserError(
            f"{where}: expected x [tokens, d_in], w [experts, d_in, d_out] and group_sizes [experts], got shapes "
            f"{tuple(x.shape)}, {tuple(w.shape)} and {tuple(group_sizes.shape)}; sort the tokens by expert and "
            "flatten them to one axis"
        )
    if group_sizes.shape[0] != w.shape[0]:
        raise UserError(
            f"{where}: group_sizes has {group_sizes.shape[0]} entries but w has {w.shape[0]} experts; pass one "
            "group size per expert"
        )
    if x.shape[1] != w.shape[1]:
        raise UserError(f"{where}: x has d_in={x.shape[1]} but w has d_in={w.shape[1]}; they must be equal")
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise UserError(f"{where}: group_sizes must be integers, got {group_sizes.dtype}")
    # A concrete array is summed in numpy: under a jit that closes over it, jnp would give a tracer.
    total = None if isinstance(group_sizes, Tracer) else int(np.asarray(group_sizes).sum())
    if total is not None and total > x.shape[0]:
        raise UserError(
            f"{where}: group_sizes sum to {total} but x has {x.shape[0]} tokens; they cannot sum "
            "to more (rows past the sum are dropped tokens)"
        )


def _check_recipe(recipe: Recipe, *, d_in: int, d_out: int, where: str) -> None:
    """The dense shape rule on the features (the tokens are padded), and the formats grouped here."""
    recipe.check_gemm_shapes(m=None, n=d_out, k=d_in, where=f"{where} (d_in {d_in}, d_out {d_out})")
    check_grouped_formats(recipe, where=where)


TOKEN_SLOTS = ("fprop_x", "dgrad_g", "wgrad_g", "wgrad_x")
"""The slots whose operand is the routed tokens (X or dY), quantized per expert group (grouped_quantize.py)."""


def check_grouped_formats(recipe: Recipe, *, where: str) -> None:
    """Every format the recipe quantizes to has a grouped quantizer (GROUPED_FORMATS), and no token operand is
    row-scaled or 4over6 (the grouped quantizer has neither yet; the expert weights may use them)."""
    for slot, spec in recipe.specs().items():
        if spec is not None and slot in TOKEN_SLOTS and (spec.row_scaled or spec.four_over_six):
            raise UserError(
                f"{where}: recipe {recipe.name!r} quantizes {slot} as {spec.describe()}; the experts' grouped GEMM "
                "has no row-scaled or 4over6 token operands yet; give the experts plain nvfp4 (precision.rules, "
                r"e.g. 'blocks\.\d+\.mlp\.experts\..*=nvfp4')"
            )
        if spec is not None and spec.format not in GROUPED_FORMATS:
            raise UserError(
                f"{where}: recipe {recipe.name!r} quantizes {slot} as {spec.format}, which the grouped GEMM does "
                f"not implement yet; use a recipe whose formats are among {', '.join(GROUPED_FORMATS)} for the "
                "experts (precision.rules)"
            )


def _slot_seeds(spec: QuantSpec | None, slot: str, expert_keys) -> jax.Array | None:
    """uint32 ``[experts + 1, 2]``: each expert's `random_bits` seeds for ``slot`` (a zero row for the unused
    rows); None when the slot draws no bits."""
    if spec is None or not spec.stochastic:
        return None
    seeds = jax.vmap(lambda k: random_bits_seeds(operand_keys(k)[slot]))(expert_keys)
    return jnp.concatenate([seeds, jnp.zeros((1, 2), seeds.dtype)])


def _expert_keys(key, experts: int, first_expert):
    return None if key is None else jax.vmap(lambda e: jax.random.fold_in(key, e))(first_expert + jnp.arange(experts))


def _weight_operand(w3: jax.Array, spec: QuantSpec | None, slot: str, expert_keys, weight_amax=None):
    """Each expert's ``w3[e]`` ``[rows, contraction]`` quantized by the dense path (vmapped): values
    ``[experts, rows, contraction]`` and scales ``[experts]`` (or None). ``weight_amax`` ``[experts]``: the
    shared amaxes, where the spec takes one (dot.shared_amax_for)."""
    amax = shared_amax_for(spec, weight_amax)

    def one(w_e, key_e, amax_e):
        slot_key = None if key_e is None else operand_keys(key_e)[slot]
        values, scale = gemm.emulated_operand(gemm_input(w_e[None], spec, slot_key, "emulated", amax_e))
        return values[0], scale

    return jax.vmap(one, in_axes=(0, None if expert_keys is None else 0, None if amax is None else 0))(
        w3, expert_keys, amax
    )


def _alpha(a_scale, b_scale):
    """The product's global factor, as gemm.matmul forms it (None: nothing to multiply)."""
    if a_scale is None:
        return b_scale
    return a_scale if b_scale is None else a_scale * b_scale


REMAINDER_ROWS = 256
"""Below this many rows a group's remainder is one chunk of its exact length (`chunk_lengths`)."""


def chunk_lengths(capacity: int, multiple: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The static row counts of the fprop and dgrad GEMMs' chunks: (powers of two times ``multiple``, at least
    `REMAINDER_ROWS`, up to the largest that fits ``capacity``, longest first; every multiple of ``multiple``
    below the smallest of them). A padded group (a multiple of ``multiple``, at most ``capacity`` rows) is
    the sum of distinct lengths of the first kind, its binary digits from 256 rows up, and at most one of
    the second: 608 rows are 512 + 96. Small dots cost far more per row than large ones, so the remainder
    is one dot, not up to four."""
    powers = [multiple]
    while powers[-1] * 2 <= capacity:
        powers.append(powers[-1] * 2)
    large = tuple(reversed([length for length in powers if length >= REMAINDER_ROWS]))
    below = large[-1] if large else capacity + multiple
    return large, tuple(range(multiple, below, multiple))


def _rows_matmul(
    a, a_scale, b, b_scale, layout: GroupLayout, multiple: int, out_dtype, *, b_transposed: bool = False
) -> jax.Array:
    """``[capacity, R]`` in ``out_dtype`` (float32 sums, cast): row r of ``a`` ``[capacity, C]`` (in ``layout``)
    times ``b[its expert]`` ``[R, C]`` (``[C, R]`` when ``b_transposed``).

    A loop over the experts; each expert's padded group is cut into chunks (`chunk_lengths`: 608 rows are
    512 + 96), longest first, each multiplied by the expert's weight and written to the output at its
    rows: ``lax.cond`` takes or skips each power of two, and ``lax.switch`` picks the remainder's length.
    So the products cover exactly the padded groups, in a few dots per expert and no padding beyond the
    blocks' (each row's sums: see the module's docstring).
    ``a_scale``: per group ``[experts + 1]``; ``b_scale``: ``[experts]``."""
    capacity, experts = a.shape[0], layout.experts
    alpha = _alpha(None if a_scale is None else a_scale[:experts], b_scale)
    rows = b.shape[2] if b_transposed else b.shape[1]
    large, remainders = chunk_lengths(capacity, multiple)

    def expert_rows(expert, out):
        weight = b[expert]

        def chunk(out, first, length: int):
            a_chunk = lax.dynamic_slice_in_dim(a, first, length)
            product = gemm.nn_dot(a_chunk, weight) if b_transposed else gemm.tn_dot(a_chunk[None], weight[None])[0]
            product = product if alpha is None else product * alpha[expert]
            return lax.dynamic_update_slice_in_dim(out, product.astype(out_dtype), first, axis=0)

        start, size = layout.padded_starts[expert], layout.padded_sizes[expert]
        done = jnp.int32(0)
        for length in large:
            takes = size - done >= length
            out = lax.cond(takes, functools.partial(chunk, first=start + done, length=length), lambda out: out, out)
            done = done + jnp.where(takes, length, 0)
        remainder_chunks = [lambda out, first: out] + [functools.partial(chunk, length=n) for n in remainders]
        return lax.switch((size - done) // multiple, remainder_chunks, out, start + done)

    return lax.fori_loop(0, experts, expert_rows, jnp.zeros((capacity, rows), out_dtype))


def window_lengths(capacity: int, multiple: int) -> tuple[int, ...]:
    """The static window lengths of the wgrad GEMM: ``multiple`` times each block count below ``capacity`` with
    at most three significant binary digits (1 to 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ...), then
    ``capacity``. An expert's window is the shortest that holds its padded group: at most 1.25 times as long,
    for about four branches per doubling of the group."""
    counts = [n for n in range(1, capacity // multiple) if n % (1 << max(n.bit_length() - 3, 0)) == 0]
    return (*(multiple * n for n in counts), capacity)


def _per_expert_contraction(a, a_scale, b, b_scale, layout: GroupLayout, multiple: int, out_dtype) -> jax.Array:
    """``[experts, Rb, Ra]`` in ``out_dtype``: for each expert, ``(a [Ra, capacity] · b [Rb, capacity]ᵀ)ᵀ`` over
    its group's rows (float32 sums, then the scales, then the cast), computed as ``b · aᵀ``: a window from the
    group's first row, the rows past the group zeroed, of the shortest static length (`window_lengths`)
    that holds the group, chosen by lax.switch."""
    capacity = a.shape[1]
    lengths = window_lengths(capacity, multiple)
    # A group of padded size p in (L_{i-1}, L_i] starts at most at capacity - p, so its window of L_i runs
    # past the buffer by less than L_i - L_{i-1}: zeros that long keep every window inside (no clamping).
    overhang = max(b - a for a, b in zip((0, *lengths), lengths, strict=False))
    # The barrier keeps XLA from fusing the quantizers into the zero extension (a pad), which would run their
    # elementwise work over the zeros too; copying the quantized values is far cheaper.
    a, b = lax.optimization_barrier((a, b))
    a_ext = jnp.concatenate([a, jnp.zeros((a.shape[0], overhang), a.dtype)], axis=1)
    b_ext = jnp.concatenate([b, jnp.zeros((b.shape[0], overhang), b.dtype)], axis=1)

    def window_product(length: int):
        def product(start, size):
            inside = (jnp.arange(length) < size)[None, :]
            a_w = jnp.where(inside, lax.dynamic_slice_in_dim(a_ext, start, length, axis=1), 0)
            b_w = jnp.where(inside, lax.dynamic_slice_in_dim(b_ext, start, length, axis=1), 0)
            return gemm.tn_dot(b_w[None], a_w[None])[0]  # [Rb, Ra]: the expert's result, transposed

        return product

    branches = [window_product(length) for length in lengths]

    def one(expert):
        size = layout.padded_sizes[expert]
        branch = jnp.searchsorted(jnp.asarray(lengths, jnp.int32), size, side="left")
        out = lax.switch(branch, branches, layout.padded_starts[expert], size)
        alpha = _alpha(None if a_scale is None else a_scale[expert], None if b_scale is None else b_scale[expert])
        return (out if alpha is None else out * alpha).astype(out_dtype)

    return lax.map(one, jnp.arange(layout.experts))


def _gradient(g, spec: QuantSpec | None, st: _Static):
    """dY in the inputs' dtype for a quantizer (as dot._gradient); unquantized gradients keep theirs."""
    return g if spec is None or spec.format == "identity" else g.astype(st.compute_dtype)


def _layout(st: _Static, group_sizes, tokens: int) -> GroupLayout:
    return GroupLayout.of(group_sizes, tokens, st.multiple)


def _forward(st: _Static, x, w, group_sizes, key, first_expert, weight_amax, *, save: bool):
    """Y, and with ``save`` the residuals: the fprop weight operand itself when dgrad can take it transposed
    (a 16x16-tiled NVFP4 weight: the dense path reuses it the same way, dot._reuse_transposed), else w."""
    recipe, experts = st.recipe, w.shape[0]
    layout = _layout(st, group_sizes, x.shape[0])
    expert_keys = _expert_keys(key, experts, first_expert)
    xv, x_scale = quantize_token_operand(
        layout.pad(x),
        recipe.fprop_x,
        layout,
        transposed=False,
        seeds=_slot_seeds(recipe.fprop_x, "fprop_x", expert_keys),
    )
    wv, w_scale = _weight_operand(jnp.swapaxes(w, 1, 2), recipe.fprop_w, "fprop_w", expert_keys, weight_amax)
    y = layout.unpad(_rows_matmul(xv, x_scale, wv, w_scale, layout, st.multiple, st.compute_dtype))
    if not save:
        return y, None
    weight = (wv, w_scale) if _reuse_transposed(recipe.fprop_w, recipe.dgrad_w) else w
    # Named as the dense dot names what it saves, so that model.remat's policies keep them (llama.remat_policy).
    x, weight = checkpoint_name(
        (x, weight), QUANTIZED_RESIDUAL_NAME if recipe.is_quantized else UNQUANTIZED_OPERAND_NAME
    )
    return y, (x, weight, group_sizes, key, first_expert, weight_amax)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _grouped_dot(st: _Static, x, w, group_sizes, key, first_expert, weight_amax):
    return _forward(st, x, w, group_sizes, key, first_expert, weight_amax, save=False)[0]


def _grouped_dot_fwd(st: _Static, x, w, group_sizes, key, first_expert, weight_amax):
    st.check(BACKWARD_SLOTS, has_key=key is not None)
    return _forward(st, x, w, group_sizes, key, first_expert, weight_amax, save=True)


def _grouped_dot_bwd(st: _Static, saved, g):
    """dX by row chunks against each expert's Wᵀ; dW per expert over its tokens (dYᵀ · Xᵀ, contracting them).
    The token operands are quantized again from the saved bf16 x (what a dense layer saves is its quantized
    copies; the values are the same either way, as dot.py's exact transposes are)."""
    x, weight, group_sizes, key, first_expert, weight_amax = saved
    recipe, experts = st.recipe, group_sizes.shape[0]
    layout = _layout(st, group_sizes, x.shape[0])
    expert_keys = _expert_keys(key, experts, first_expert)
    g_pad = layout.pad(g)
    # dgrad: dX [tokens, K] = dY [tokens, N] · (Wᵀ [K, N] per expert), contracting N.
    gv, g_scale = quantize_token_operand(
        _gradient(g_pad, recipe.dgrad_g, st),
        recipe.dgrad_g,
        layout,
        transposed=False,
        seeds=_slot_seeds(recipe.dgrad_g, "dgrad_g", expert_keys),
    )
    reused = isinstance(weight, tuple)  # the fprop tiles [E, N, K], read as Wᵀ (they transpose exactly)
    if reused:
        wtv, wt_scale = weight
    else:
        wtv, wt_scale = _weight_operand(weight, recipe.dgrad_w, "dgrad_w", expert_keys, weight_amax)  # Wᵀ [E, K, N]
    dx = _rows_matmul(gv, g_scale, wtv, wt_scale, layout, st.multiple, st.x_dtype, b_transposed=reused)
    dx = layout.unpad(dx)
    # wgrad: dW [N, K] per expert = dYᵀ [N, tokens] · (Xᵀ [K, tokens]), contracting the expert's tokens.
    gtv, gt_scale = quantize_token_operand(
        _gradient(g_pad, recipe.wgrad_g, st),
        recipe.wgrad_g,
        layout,
        transposed=True,
        seeds=_slot_seeds(recipe.wgrad_g, "wgrad_g", expert_keys),
    )
    xtv, xt_scale = quantize_token_operand(
        layout.pad(x),
        recipe.wgrad_x,
        layout,
        transposed=True,
        seeds=_slot_seeds(recipe.wgrad_x, "wgrad_x", expert_keys),
    )
    dw = _per_expert_contraction(gtv, gt_scale, xtv, xt_scale, layout, st.multiple, st.w_dtype)  # [E, K, N]
    return dx, dw, None, None, None, None


_grouped_dot.defvjp(_grouped_dot_fwd, _grouped_dot_bwd)
