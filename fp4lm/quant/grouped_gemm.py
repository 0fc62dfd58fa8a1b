"""The two GEMMs of a grouped (mixture-of-experts) layer on quantized operands, as a loop or one ragged dot.

The operands come from the segment-aware quantizers (fp4lm.numerics.grouped): token operands padded per
expert in a buffer of R rows (fp4lm.numerics.group_layout), each expert's group with its own global scale,
and the experts' weights with one global scale each. Two products are made of them, each in two ways:

- `rows_product`, ``[R, D] x W[e] -> [R, M]``: the fprop and dgrad GEMMs, whose rows are the tokens;
- `group_contraction`, ``[M, R], [D, R] -> [X, D, M]``: the wgrad GEMM, which contracts the tokens.

With ``ragged`` (a GPU or TPU: grouped.uses_ragged_dot) each is ONE ``jax.lax.ragged_dot_general`` on the
bf16 values with float32 accumulation, then each group's global scale: the grouped GEMM kernel of the
device. Without (a CPU) each is a loop over the experts of dense dots on exactly their rows: XLA:CPU lowers
a ragged dot to a dense contraction over every expert (X times the work). Both multiply the same values and
scale in the same order; only the order of the float32 sums may differ (tests/quant/test_grouped_ragged.py).
D is the contraction, M the output width, whichever of the layer's widths they are.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from fp4lm.numerics.group_layout import GroupLayout
from fp4lm.quant import gemm

REMAINDER_ROWS = 256
"""Below this many rows a group's remainder is one chunk of its exact length (`chunk_lengths`)."""


def _alpha(a_scale, b_scale):
    """The product's global factor, as gemm.output_scale forms it for scalars (None: nothing to multiply)."""
    if a_scale is None:
        return b_scale
    return a_scale if b_scale is None else a_scale * b_scale


def _expert_scales(a_scale, b_scale, experts: int):
    """``[X]`` global factors of the experts' products (None: none): ``a_scale`` and ``b_scale`` are
    ``[X + 1]`` (a token operand's, the last for the unused rows) or ``[X]`` (a weight's)."""
    return _alpha(None if a_scale is None else a_scale[:experts], None if b_scale is None else b_scale[:experts])


def rows_product(
    a_RD, a_scale, b, b_scale, layout: GroupLayout, multiple: int, out_dtype, *, b_transposed=False, ragged=False
) -> jax.Array:
    """``[R, M]`` in ``out_dtype`` (float32 sums, times the scales, cast): row r of ``a_RD`` (in ``layout``) times
    ``b[its expert]``, which is ``[X, M, D]`` (``[X, D, M]`` when ``b_transposed``). The unused rows past the
    groups are unspecified (ragged_dot's are); `GroupLayout.unpad` never reads them.
    ``a_scale``: per group ``[X + 1]``; ``b_scale``: ``[X]``; either may be None."""
    if ragged:
        return _ragged_rows_product(a_RD, a_scale, b, b_scale, layout, out_dtype, b_transposed)
    return _looped_rows_product(a_RD, a_scale, b, b_scale, layout, multiple, out_dtype, b_transposed)


def group_contraction(a_MR, a_scale, b_DR, b_scale, layout: GroupLayout, multiple: int, out_dtype, *, ragged=False):
    """``[X, D, M]`` in ``out_dtype``: for each expert, ``b_DR · a_MRᵀ`` over its group's rows (float32 sums,
    then the scales ``[X + 1]``, then the cast); an expert without tokens gets zeros."""
    if ragged:
        return _ragged_group_contraction(a_MR, a_scale, b_DR, b_scale, layout, out_dtype)
    return _looped_group_contraction(a_MR, a_scale, b_DR, b_scale, layout, multiple, out_dtype)


def _ragged_rows_product(a_RD, a_scale, b, b_scale, layout: GroupLayout, out_dtype, b_transposed: bool):
    """One ragged dot: group e is padded rows ``padded_starts_X[e]`` on, ``padded_sizes_X[e]`` of them."""
    contraction = 1 if b_transposed else 2
    numbers = lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(((1,), (contraction,)), ((), ())), lhs_ragged_dimensions=[0], rhs_group_dimensions=[0]
    )
    product_RM = gemm.ragged_dot(a_RD, b, layout.padded_sizes_X, numbers)
    alpha_X = _expert_scales(a_scale, b_scale, layout.groups)
    if alpha_X is not None:
        alpha_R = alpha_X[jnp.minimum(layout.row_group_R, layout.groups - 1)]
        product_RM = product_RM * alpha_R[:, None]
    return product_RM.astype(out_dtype)


def _ragged_group_contraction(a_MR, a_scale, b_DR, b_scale, layout: GroupLayout, out_dtype):
    """One ragged dot whose ragged axis is the contraction: one ``[D, M]`` product per group."""
    numbers = lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(((1,), (1,)), ((), ())), lhs_ragged_dimensions=[1], rhs_group_dimensions=[]
    )
    product_XDM = gemm.ragged_dot(b_DR, a_MR, layout.padded_sizes_X, numbers)
    alpha_X = _expert_scales(a_scale, b_scale, layout.groups)
    if alpha_X is not None:
        product_XDM = product_XDM * alpha_X[:, None, None]
    return product_XDM.astype(out_dtype)


def chunk_lengths(capacity: int, multiple: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The static row counts of the looped fprop and dgrad GEMMs' chunks: (powers of two times ``multiple``, at
    least `REMAINDER_ROWS`, up to the largest that fits ``capacity``, longest first; every multiple of
    ``multiple`` below the smallest of them). A padded group (a multiple of ``multiple``, at most ``capacity``
    rows) is the sum of distinct lengths of the first kind, its binary digits from 256 rows up, and at most
    one of the second: 608 rows are 512 + 96. Small dots cost far more per row than large ones, so the
    remainder is one dot, not up to four."""
    powers = [multiple]
    while powers[-1] * 2 <= capacity:
        powers.append(powers[-1] * 2)
    large = tuple(reversed([length for length in powers if length >= REMAINDER_ROWS]))
    below = large[-1] if large else capacity + multiple
    return large, tuple(range(multiple, below, multiple))


def _looped_rows_product(a_RD, a_scale, b, b_scale, layout: GroupLayout, multiple: int, out_dtype, b_transposed):
    """A loop over the experts; each expert's padded group is cut into chunks (`chunk_lengths`: 608 rows are
    512 + 96), longest first, each multiplied by the expert's weight and written to the output at its rows:
    ``lax.cond`` takes or skips each power of two, and ``lax.switch`` picks the remainder's length. So the
    products cover exactly the padded groups, in a few dots per expert and no padding beyond the blocks'.
    Each row's sums equal the dense dot's wherever XLA:CPU sums a row alike for the chunk's and the group's
    row counts, as the tests check bit for bit (not for every shape and CPU: tests/model/test_expert_parallel.py
    measured a case that differs)."""
    capacity, experts = a_RD.shape[0], layout.groups
    alpha_X = _expert_scales(a_scale, b_scale, experts)
    width = b.shape[2] if b_transposed else b.shape[1]
    large, remainders = chunk_lengths(capacity, multiple)

    def expert_rows(expert, out_RM):
        weight = b[expert]

        def chunk(out_RM, first, length: int):
            a_chunk = lax.dynamic_slice_in_dim(a_RD, first, length)
            product = gemm.nn_dot(a_chunk, weight) if b_transposed else gemm.tn_dot(a_chunk[None], weight[None])[0]
            product = product if alpha_X is None else product * alpha_X[expert]
            return lax.dynamic_update_slice_in_dim(out_RM, product.astype(out_dtype), first, axis=0)

        start, size = layout.padded_starts_X[expert], layout.padded_sizes_X[expert]
        done = jnp.int32(0)
        for length in large:
            takes = size - done >= length
            out_RM = lax.cond(takes, functools.partial(chunk, first=start + done, length=length), lambda o: o, out_RM)
            done = done + jnp.where(takes, length, 0)
        remainder_chunks = [lambda o, first: o] + [functools.partial(chunk, length=n) for n in remainders]
        return lax.switch((size - done) // multiple, remainder_chunks, out_RM, start + done)

    return lax.fori_loop(0, experts, expert_rows, jnp.zeros((capacity, width), out_dtype))


def window_lengths(capacity: int, multiple: int) -> tuple[int, ...]:
    """The static window lengths of the looped wgrad GEMM: ``multiple`` times each block count below
    ``capacity`` with at most three significant binary digits (1 to 8, 10, 12, 14, 16, 20, 24, 28, 32, 40,
    ...), then ``capacity``. An expert's window is the shortest that holds its padded group: at most 1.25
    times as long, for about four branches per doubling of the group."""
    counts = [n for n in range(1, capacity // multiple) if n % (1 << max(n.bit_length() - 3, 0)) == 0]
    return (*(multiple * n for n in counts), capacity)


def _looped_group_contraction(a_MR, a_scale, b_DR, b_scale, layout: GroupLayout, multiple: int, out_dtype):
    """Per expert (``lax.map``): a window of the buffer from the group's first row, the rows past the group
    zeroed, of the shortest static length (`window_lengths`) that holds the group, chosen by lax.switch: the
    dense dot's sum followed by exact zeros, at most 1.25 times the loop's work."""
    capacity = a_MR.shape[1]
    lengths = window_lengths(capacity, multiple)
    # A group of padded size p in (L_{i-1}, L_i] starts at most at capacity - p, so its window of L_i runs
    # past the buffer by less than L_i - L_{i-1}: zeros that long keep every window inside (no clamping).
    overhang = max(b - a for a, b in zip((0, *lengths), lengths, strict=False))
    # The barrier keeps XLA from fusing the quantizers into the zero extension (a pad), which would run their
    # elementwise work over the zeros too; copying the quantized values is far cheaper.
    a_MR, b_DR = lax.optimization_barrier((a_MR, b_DR))
    a_ext = jnp.concatenate([a_MR, jnp.zeros((a_MR.shape[0], overhang), a_MR.dtype)], axis=1)
    b_ext = jnp.concatenate([b_DR, jnp.zeros((b_DR.shape[0], overhang), b_DR.dtype)], axis=1)

    def window_product(length: int):
        def product(start, size):
            inside = (jnp.arange(length) < size)[None, :]
            a_w = jnp.where(inside, lax.dynamic_slice_in_dim(a_ext, start, length, axis=1), 0)
            b_w = jnp.where(inside, lax.dynamic_slice_in_dim(b_ext, start, length, axis=1), 0)
            return gemm.tn_dot(b_w[None], a_w[None])[0]  # [D, M]

        return product

    branches = [window_product(length) for length in lengths]

    def one(expert):
        size = layout.padded_sizes_X[expert]
        branch = jnp.searchsorted(jnp.asarray(lengths, jnp.int32), size, side="left")
        out_DM = lax.switch(branch, branches, layout.padded_starts_X[expert], size)
        alpha = _alpha(None if a_scale is None else a_scale[expert], None if b_scale is None else b_scale[expert])
        return (out_DM if alpha is None else out_DM * alpha).astype(out_dtype)

    return lax.map(one, jnp.arange(layout.groups))
