"""The GPU/TPU path of the grouped GEMM, forced on a CPU: one ragged dot per GEMM on the same quantized operands.

`grouped_dot(..., ragged=True)` must feed its GEMMs exactly the operands the per-expert loop (the CPU path,
bit-exact to the dense dot per expert: test_grouped_dot.py) feeds its own: the same bf16 values and the
same global scales, bit for bit. What may differ is only the order of the float32 sums, so y, dX and dW
may differ by at most twice the float32 error bound of an n-term sum of those operands,
``2 · n · 2^-24 · Σ|a_i · b_i| · |scale|``. The inputs are float32, so no bf16 rounding of the result hides
or adds a difference.
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lm.numerics.group_layout import GroupLayout
from fp4lm.quant import grouped
from fp4lm.quant.grouped import grouped_dot, token_multiple
from fp4lm.quant.recipes import get_recipe
from tests.quant.fake_quant import gaussian
from tests.quant.test_grouped_dot import TOKEN_TILES, inputs

GROUPS = (70, 0, 16, 7, 61)  # an empty expert, groups that are not whole blocks
DROPPED = 9  # rows past the groups (pairs a capacity dropped): zero rows of y and dX on both paths


def inputs_with_dropped_rows():
    x, w, dy = inputs(jnp.float32, GROUPS)
    extra = gaussian(3, (DROPPED, x.shape[1]), x.dtype) * 50  # large: a leak into an amax or a product shows
    return jnp.concatenate([x, extra]), w, jnp.concatenate([dy, extra[:, : dy.shape[1]]])


def run_both(monkeypatch, recipe, x, w, dy, group_sizes, key):
    """{ragged: (y, dx, dw)} and {ragged: {(GEMM, operand shapes): [operands]}}: every GEMM's operands,
    read back from inside the jitted forward and backward passes."""
    operands = {True: collections.defaultdict(list), False: collections.defaultdict(list)}

    def spying(name, gemm):
        def spy(*args, **kwargs):
            arrays = args[:4]  # a, a's per-group scale, b, b's per-expert scale
            shapes = tuple(None if a is None else a.shape for a in arrays)
            record = operands[kwargs["ragged"]][(name, shapes)]
            jax.debug.callback(lambda *values: record.append(values), *arrays)
            return gemm(*args, **kwargs)

        return spy

    monkeypatch.setattr(grouped, "rows_product", spying("rows", grouped.rows_product))
    monkeypatch.setattr(grouped, "group_contraction", spying("contraction", grouped.group_contraction))
    jax.clear_caches()  # trace again, with the spies
    results = {}
    for ragged in (True, False):

        @jax.jit
        def forward_backward(x, w, dy, group_sizes, key, ragged=ragged):
            y, vjp = jax.vjp(lambda a, b: grouped_dot(a, b, group_sizes, recipe, key=key, ragged=ragged), x, w)
            return (y, *vjp(dy))

        results[ragged] = jax.block_until_ready(forward_backward(x, w, dy, group_sizes, key))
    jax.effects_barrier()
    return results, operands


def sum_bound(recipe, x, w, group_sizes, operands):
    """``2 · n · 2^-24 · Σ|a_i b_i| · |scale|`` for y, dX and dW, from the GEMMs' own operands (float64)."""
    layout = GroupLayout.of(group_sizes, x.shape[0], token_multiple(get_recipe(recipe)))
    row_group = np.minimum(np.asarray(layout.row_group_R), w.shape[0] - 1)
    token_row = np.asarray(layout.token_row_P)
    bounds = {}
    for (name, _), ((a, a_scale, b, b_scale),) in operands.items():
        a, b = np.abs(np.asarray(a, np.float64)), np.abs(np.asarray(b, np.float64))
        scale = np.ones(w.shape[0])
        for s in (a_scale, b_scale):
            scale = scale if s is None else scale * np.abs(np.asarray(s, np.float64))[: w.shape[0]]
        if name == "rows":  # a [R, D], b [X, M, D] (or [X, D, M]: the reused fprop tiles), contracting D
            b_XMD = b if b.shape[2] == a.shape[1] else np.swapaxes(b, 1, 2)
            sums = np.einsum("rd,rmd->rm", a, b_XMD[row_group]) * scale[row_group][:, None]
            bound = 2 * a.shape[1] * 2.0**-24 * sums
            kept = token_row < bound.shape[0]  # a dropped row's bound is 0: it must be exactly 0 on both paths
            bounds["y" if b_XMD.shape[1] == w.shape[2] else "dx"] = np.where(
                kept[:, None], bound[np.minimum(token_row, bound.shape[0] - 1)], 0.0
            )
        else:  # a [M, R] (dY), b [D, R] (X): per expert over its rows
            sums = np.stack([np.einsum("dr,mr->dm", b * (row_group == e), a) * scale[e] for e in range(w.shape[0])])
            bounds["dw"] = 2 * a.shape[1] * 2.0**-24 * sums
    return bounds


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp8", "fp8", pytest.param(TOKEN_TILES, id="nvfp4_16x16_wgrad")])
def test_the_ragged_path_multiplies_the_same_operands_and_differs_only_in_summation_order(monkeypatch, recipe):
    x, w, dy = inputs_with_dropped_rows()
    group_sizes, key = jnp.asarray(GROUPS, jnp.int32), jax.random.key(11)
    results, operands = run_both(monkeypatch, recipe, x, w, dy, group_sizes, key)
    # The same GEMMs (fprop, dgrad, wgrad), each once, on bit-identical operands.
    assert operands[True].keys() == operands[False].keys() and len(operands[True]) == 3
    for gemm, (ragged_operands,) in operands[True].items():
        (looped_operands,) = operands[False][gemm]
        for got, want in zip(ragged_operands, looped_operands, strict=True):
            assert (got is None) == (want is None), gemm
            if got is not None:
                np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=str(gemm))
    bounds = sum_bound(recipe, x, w, group_sizes, operands[False])
    assert not np.any(np.asarray(results[False][0][-DROPPED:])) and not np.any(np.asarray(results[False][1][-DROPPED:]))
    for name, got, want in zip(("y", "dx", "dw"), results[True], results[False], strict=True):
        assert got.dtype == want.dtype == jnp.float32 and got.shape == want.shape, name
        difference = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
        assert np.all(difference <= bounds[name]), (name, float(np.max(difference - bounds[name])))
