"""The grouped quantized GEMM equals a per-expert loop of the dense quantized dot, bit for bit.

These tests run the loop over the experts (``ragged=False``: the CPU's path, on any device); the one ragged dot
per GEMM of a GPU or TPU sums in another order, and test_grouped_ragged.py bounds that difference.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench import grouped_reference
from fp4lm.model.llama import remat_policy
from fp4lm.quant.dot import QUANTIZED_RESIDUAL_NAME, UNQUANTIZED_OPERAND_NAME
from fp4lm.quant.grouped import grouped_dot, uses_ragged_dot
from fp4lm.quant.grouped_gemm import REMAINDER_ROWS, chunk_lengths
from fp4lm.quant.recipes import QuantSpec, get_recipe
from tests.quant.fake_quant import gaussian, jit

D_IN, D_OUT = 64, 32
GROUPS = (70, 0, 16, 7, 67)  # an empty group, groups that are not multiples of 16 (or 32)


per_expert_loop = jit(grouped_reference.per_expert_loop, static_argnums=(0, 4))


@jit(static_argnums=0, static_argnames="ragged")
def grouped(recipe, x, w, dy, group_sizes, key, ragged: bool | None = False):
    y, vjp = jax.vjp(lambda a, b: grouped_dot(a, b, group_sizes, recipe, key=key, ragged=ragged), x, w)
    return (y, *vjp(dy))


def inputs(dtype=jnp.bfloat16, groups=GROUPS):
    tokens = sum(groups)
    x = gaussian(0, (tokens, D_IN), dtype)
    w = (
        gaussian(1, (len(groups), D_IN, D_OUT), dtype, scale=D_IN**-0.5)
        * jnp.arange(1, len(groups) + 1, dtype=dtype)[:, None, None]
    )  # experts of different magnitudes: a shared amax would show
    dy = (
        gaussian(2, (tokens, D_OUT), dtype)
        * jnp.where(jnp.arange(tokens) < groups[0], 100.0, 1.0).astype(dtype)[:, None]
    )
    return x, w, dy


def assert_same_bits(got, want) -> None:
    """(y, dx, dw) of the grouped path equal the per-expert loop's, bit for bit."""
    for name, g, e in zip(("y", "dx", "dw"), got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(e, np.float32), err_msg=name)


TILE = QuantSpec(format="nvfp4", block=(16, 16), rounding="stochastic", hadamard=True)
TOKEN_TILES = dataclasses.replace(
    get_recipe("nvfp4"), name="nvfp4_16x16_wgrad", wgrad_g=TILE, wgrad_x=dataclasses.replace(TILE, rounding="nearest")
)  # 16x16 tiles of features x tokens on the wgrad operands, which the grouped path quantizes in token tiles


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp8", "fp8", pytest.param(TOKEN_TILES, id="nvfp4_16x16_wgrad")])
def test_grouped_equals_the_per_expert_loop_bit_for_bit(recipe):
    x, w, dy = inputs()
    key = jax.random.key(7)
    want = per_expert_loop(recipe, x, w, dy, GROUPS, key)
    got = grouped(recipe, x, w, dy, jnp.asarray(GROUPS, jnp.int32), key)
    for name, g, e in zip(("y", "dx", "dw"), got, want, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype, name
    assert_same_bits(got, want)


def test_groups_longer_than_the_remainder_chunks_are_bit_exact_too():
    """Groups of more than REMAINDER_ROWS rows run as a power-of-two chunk (lax.cond) and a remainder
    (lax.switch): 600 rows are 512 + 96 (padded to 608), 530 are 512 + 32."""
    groups = (600, 9, 530)
    assert max(groups) > REMAINDER_ROWS
    x, w, dy = inputs(groups=groups)
    key = jax.random.key(5)
    want = per_expert_loop("nvfp4", x, w, dy, groups, key)
    got = grouped("nvfp4", x, w, dy, jnp.asarray(groups, jnp.int32), key)
    assert_same_bits(got, want)


def test_tokens_past_the_groups_get_zero_rows_and_no_gradient():
    """Rows past sum(group_sizes) (pairs a capacity dropped): y and dx are zero there, and the other rows,
    and dW, are the per-expert loop's over the kept tokens alone, bit for bit."""
    x, w, dy = inputs()
    kept = x.shape[0]
    extra = gaussian(3, (9, D_IN), x.dtype) * 50  # large: any leak into an amax or a product would show
    x_all, dy_all = jnp.concatenate([x, extra]), jnp.concatenate([dy, extra[:, :1].repeat(D_OUT, axis=1)])
    key = jax.random.key(7)
    want = per_expert_loop("nvfp4", x, w, dy, GROUPS, key)
    y, dx, dw = grouped("nvfp4", x_all, w, dy_all, jnp.asarray(GROUPS, jnp.int32), key)
    assert not np.any(np.asarray(y[kept:], np.float32)) and not np.any(np.asarray(dx[kept:], np.float32))
    assert_same_bits((y[:kept], dx[:kept], dw), want)


def test_ragged_dot_rows_past_the_groups_are_zeroed(monkeypatch):
    """Where bf16 experts are lax.ragged_dot (GPU, TPU), whose rows past the groups JAX leaves unspecified,
    the grouped dot still returns zeros there (a NaN there would survive the routing weight's 0 · NaN)."""
    real_ragged_dot = jax.lax.ragged_dot

    def garbage_past_the_groups(lhs, rhs, group_sizes, **kwargs):
        y = real_ragged_dot(lhs, rhs, group_sizes, **kwargs)
        return jnp.where((jnp.arange(lhs.shape[0]) < jnp.sum(group_sizes))[:, None], y, jnp.nan)

    monkeypatch.setattr(jax.lax, "ragged_dot", garbage_past_the_groups)
    x, w, _ = inputs(jnp.float32)
    y = grouped_dot(x, w, jnp.asarray((70, 0, 16, 7, 50), jnp.int32), "bf16", ragged=True)
    np.testing.assert_array_equal(np.asarray(y[143:]), 0.0)
    np.testing.assert_allclose(np.asarray(y[:70]), np.asarray(x[:70] @ w[0]), rtol=1e-5)


@pytest.mark.parametrize(
    "recipe, policy, name",
    [("nvfp4", "save_quantized", QUANTIZED_RESIDUAL_NAME), ("bf16", "save_matmul_operands", UNQUANTIZED_OPERAND_NAME)],
)
def test_remat_policies_keep_what_the_grouped_dot_saves(recipe, policy, name, capsys):
    """model.remat's save_* policies keep the grouped GEMM's residuals, named as the dense dot names its own
    (else the whole expert path, dispatch included, would run again in the backward pass); nothing else."""
    x, w, _ = inputs()
    sizes = jnp.asarray(GROUPS, jnp.int32)
    f = jax.checkpoint(
        lambda x, w: jnp.sum(jnp.sin(grouped_dot(x, w, sizes, recipe, key=jax.random.key(0)))),
        policy=remat_policy(policy),
    )
    jax.ad_checkpoint.print_saved_residuals(f, x, w)
    lines = capsys.readouterr().out.splitlines()
    saved = [line for line in lines if "from the argument" not in line and "from a constant" not in line]
    assert saved and all(name in line for line in saved), saved


def test_a_shared_weight_amax_gives_each_expert_the_dense_paths_global_scale():
    # precision.shared_weight_scale: an expert's gate and up share one amax, so its weight's global scale
    # comes from an amax above its own (1.3x: a power of two would give the same codes and block scales)
    x, w, dy = inputs()
    key = jax.random.key(3)
    amax = jnp.abs(w.astype(jnp.float32)).max(axis=(1, 2)) * 1.3
    want = per_expert_loop("nvfp4", x, w, dy, GROUPS, key, amax)

    @jax.jit
    def shared(x, w, dy, amax):
        y, vjp = jax.vjp(
            lambda a, b: grouped_dot(a, b, jnp.asarray(GROUPS), "nvfp4", key=key, weight_amax=amax, ragged=False), x, w
        )
        return (y, *vjp(dy))

    y, dx, dw = shared(x, w, dy, amax)
    assert_same_bits((y, dx, dw), want)
    own = grouped("nvfp4", x, w, dy, jnp.asarray(GROUPS, jnp.int32), key)
    assert not np.array_equal(np.asarray(own[0], np.float32), np.asarray(y, np.float32))  # the amax mattered


@pytest.mark.parametrize("capacity", [200, 1000, 4000])
@pytest.mark.parametrize("multiple", [16, 32])
def test_every_padded_group_is_cut_into_chunks_that_cover_it_exactly(multiple, capacity):
    """The fprop/dgrad loop takes, longest first, each large chunk that still fits, then one remainder chunk
    of the rest's exact length: every padded group must be covered, and the small chunks stay few."""
    capacity = capacity // multiple * multiple
    large, remainders = chunk_lengths(capacity, multiple)
    assert all(length >= REMAINDER_ROWS for length in large)
    assert not large or large[0] <= capacity < 2 * large[0]
    assert len(remainders) < 2 * REMAINDER_ROWS // multiple
    for size in range(0, capacity + 1, multiple):
        done = 0
        for length in large:
            done += length if size - done >= length else 0
        assert size - done == 0 or remainders[(size - done) // multiple - 1] == size - done


def test_bf16_is_ragged_dot_and_differentiates_under_jit():
    groups = (5, 0, 11)
    x, w, _ = inputs(jnp.float32, groups)
    group_sizes = jnp.asarray(groups, jnp.int32)
    loss = jax.jit(jax.value_and_grad(lambda x, w, gs: jnp.sum(grouped_dot(x, w, gs, "bf16") ** 2), argnums=(0, 1)))
    value, (dx, dw) = loss(x, w, group_sizes)
    want_y = jnp.concatenate([x[:5] @ w[0], x[5:] @ w[2]])
    np.testing.assert_allclose(float(value), float(jnp.sum(want_y**2)), rtol=1e-5)
    assert dx.shape == x.shape and dw.shape == w.shape
    assert not np.any(np.asarray(dw[1]))  # the empty expert gets no gradient


def test_group_sizes_closed_over_by_a_jit_are_checked_not_traced():
    """A concrete group_sizes array that a jitted function closes over is checked in numpy, not turned into a
    tracer by the check (which then could not be read)."""
    x, w, _ = inputs()
    sizes = jnp.asarray(GROUPS, jnp.int32)
    y = jax.jit(lambda x, w: grouped_dot(x, w, sizes, "bf16"))(x, w)
    assert y.shape == (x.shape[0], w.shape[2])
    too_many = jnp.asarray((70, 0, 16, 7, 68), jnp.int32)
    with pytest.raises(ValueError, match=r"group_sizes sum to 161 but x has 160 tokens"):
        jax.jit(lambda x, w: grouped_dot(x, w, too_many, "bf16"))(x, w)


def test_shape_errors_are_ordinary_exceptions_that_say_what_to_fix():
    x, w, _ = inputs()
    with pytest.raises(ValueError, match=r"group_sizes has 4 entries but w has 5 experts"):
        grouped_dot(x, w, jnp.asarray(GROUPS[:4]), "nvfp4")
    with pytest.raises(ValueError, match=r"group_sizes sum to 161 but x has 160 tokens"):
        grouped_dot(x, w, jnp.asarray((70, 0, 16, 7, 68)), "nvfp4")
    narrow = jnp.zeros((len(GROUPS), 24, D_OUT), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"contraction size K=24 to be a multiple of 16"):
        grouped_dot(x[:, :24], narrow, jnp.asarray(GROUPS), "nvfp4")
    with pytest.raises(ValueError, match=r"rounds dgrad_g, wgrad_g stochastically, but no random key"):
        jax.eval_shape(jax.grad(lambda x: jnp.sum(grouped_dot(x, w, jnp.asarray(GROUPS), "nvfp4"))), x)
    with pytest.raises(ValueError, match=r"quantizes fprop_x as mxfp4, which the grouped GEMM does not implement"):
        grouped_dot(x, w, jnp.asarray(GROUPS), "mxfp4")


def test_bf16_on_cpu_is_the_tiled_path_equal_to_per_expert_dots():
    """On a CPU the bf16 experts are the tiled grouped GEMM (not ragged_dot, which runs every expert on every
    token there): y and dx equal per-expert bf16 dots with float32 sums, bit for bit. On a GPU they are
    ragged_dot, whose float32 sums run in another order: equal within one bf16 rounding."""
    exact = not uses_ragged_dot()
    same = np.testing.assert_array_equal if exact else functools.partial(np.testing.assert_allclose, rtol=2**-7)
    x, w, dy = inputs()
    group_sizes = jnp.asarray(GROUPS, jnp.int32)
    y, dx, dw = grouped("bf16", x, w, dy, group_sizes, None, ragged=None)  # as this device decides
    ends = np.cumsum(GROUPS)
    for expert, (start, end) in enumerate(zip(ends - np.asarray(GROUPS), ends, strict=True)):
        want_y = jnp.dot(x[start:end], w[expert], preferred_element_type=jnp.float32).astype(x.dtype)
        want_dx = jnp.dot(dy[start:end], w[expert].T, preferred_element_type=jnp.float32).astype(x.dtype)
        same(np.asarray(y[start:end], np.float32), np.asarray(want_y, np.float32))
        same(np.asarray(dx[start:end], np.float32), np.asarray(want_dx, np.float32))
    assert dw.shape == w.shape and not np.any(np.asarray(dw[1], np.float32))
