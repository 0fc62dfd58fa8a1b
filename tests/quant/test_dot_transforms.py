"""The quantized dot under JAX transformations, inside Flax layers, with general dimension numbers; what it
saves for the backward pass; and the errors a user sees."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

from fp4lm.errors import UserError
from fp4lm.model import remat_policy
from fp4lm.quant import RECIPES, Policy, dot_general
from fp4lm.quant.dot import QUANTIZED_RESIDUAL_NAME, UNQUANTIZED_OPERAND_NAME
from tests.quant.fake_quant import LINEAR_DIMS, gaussian, jit, reference_linear

pytestmark = pytest.mark.slow


def assert_same(a, b):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def loss_and_grads(dot, x, kernel, key, dims=LINEAR_DIMS):
    def loss(x, kernel):
        return jnp.sum(jnp.square(dot(x, kernel, dims, key=key).astype(jnp.float32)))

    return jax.value_and_grad(loss, argnums=(0, 1))(x, kernel)


def test_vmap_quantizes_each_example_on_its_own():
    x = gaussian(0, (2, 32, 64), jnp.bfloat16)
    kernel = gaussian(1, (64, 32), jnp.bfloat16)
    dot = dot_general("nvfp4")
    key = jax.random.key(0)

    @jit
    def per_example(x, kernel):
        batched = jax.vmap(lambda xi: loss_and_grads(dot, xi, kernel, key), in_axes=0)(x)
        looped = [loss_and_grads(dot, x[i], kernel, key) for i in range(2)]
        return batched, looped

    (loss_b, (dx_b, dk_b)), looped = per_example(x, kernel)
    for i, (loss_i, (dx_i, dk_i)) in enumerate(looped):
        np.testing.assert_allclose(loss_b[i], loss_i, rtol=1e-6)
        assert_same(dx_b[i], dx_i)
        np.testing.assert_allclose(
            np.asarray(dk_b[i], np.float32),
            np.asarray(dk_i, np.float32),
            rtol=1e-2,
            atol=1e-2 * float(jnp.max(jnp.abs(dk_i.astype(jnp.float32)))),
        )


def test_checkpoint_and_scan_over_layers_give_the_same_gradients():
    """Two layers applied with lax.scan, with and without jax.checkpoint (saving only the quantized
    copies), against the unrolled loop."""
    depth, width = 2, 32
    x = gaussian(2, (32, width), jnp.bfloat16)
    kernels = gaussian(3, (depth, width, width), jnp.bfloat16, scale=width**-0.5)
    dot = dot_general("nvfp4")
    step_key = jax.random.key(5)
    save_quantized = jax.checkpoint_policies.save_only_these_names(QUANTIZED_RESIDUAL_NAME)

    def layer(h, kernel_and_index):
        kernel, i = kernel_and_index
        return dot(h, kernel, LINEAR_DIMS, key=jax.random.fold_in(step_key, i)), None

    def scanned(x, kernels, remat):
        body = jax.checkpoint(layer, policy=save_quantized) if remat else layer
        h, _ = lax.scan(body, x, (kernels, jnp.arange(depth)))
        return jnp.sum(jnp.square(h.astype(jnp.float32)))

    def unrolled(x, kernels):
        h = x
        for i in range(depth):
            h, _ = layer(h, (kernels[i], i))
        return jnp.sum(jnp.square(h.astype(jnp.float32)))

    @jit
    def all_grads(x, kernels):
        grad = functools.partial(jax.grad, argnums=(0, 1))
        return grad(unrolled)(x, kernels), grad(scanned)(x, kernels, False), grad(scanned)(x, kernels, True)

    want, got_scan, got_remat = all_grads(x, kernels)
    for got in (got_scan, got_remat):
        for a, b in zip(got, want, strict=True):
            assert bool(jnp.all(jnp.isfinite(a.astype(jnp.float32))))
            assert_same(a, b)


def test_drops_into_nnx_linear_and_nnx_einsum():
    x = gaussian(4, (2, 16, 32), jnp.bfloat16)
    dot = functools.partial(dot_general("nvfp4"), key=jax.random.key(7))  # the same SR bits for both layers
    linear = nnx.Linear(32, 64, use_bias=False, dtype=jnp.bfloat16, dot_general=dot, rngs=nnx.Rngs(0))
    einsum = nnx.Einsum(
        "btd,dnh->btnh",
        (32, 4, 16),
        dtype=jnp.bfloat16,
        rngs=nnx.Rngs(0),
        einsum_op=functools.partial(jnp.einsum, _dot_general=dot),
    )
    einsum.kernel[...] = linear.kernel[...].reshape(32, 4, 16)

    @jit
    def forward_and_grads(x, linear, einsum):
        def loss(module):
            return jnp.sum(jnp.square(module(x).astype(jnp.float32)))

        return (linear(x), einsum(x), nnx.grad(loss)(linear).kernel[...], nnx.grad(loss)(einsum).kernel[...])

    y_linear, y_einsum, g_linear, g_einsum = forward_and_grads(x, linear, einsum)
    assert y_linear.dtype == jnp.bfloat16 and y_linear.shape == (2, 16, 64)
    assert_same(y_einsum.reshape(2, 16, 64), y_linear)  # same canonical operands, same quantization
    if jax.default_backend() == "cpu":
        assert_same(g_einsum.reshape(32, 64), g_linear)
    else:  # XLA:GPU may skip a bfloat16 rounding of a gradient (xla_allow_excess_precision): one ulp apart
        np.testing.assert_allclose(g_einsum.reshape(32, 64), g_linear, rtol=2**-7)
    exact = jnp.einsum("btd,dn->btn", x.astype(jnp.float32), linear.kernel[...].astype(jnp.float32))
    assert 0.05 < float(jnp.linalg.norm(y_linear - exact) / jnp.linalg.norm(exact)) < 0.2


def test_general_dimension_numbers():
    """Several contracting dims flatten into one K (in the lhs's contracting order); batch dims stay batch
    dims, and each operand still has one amax over its whole tensor."""
    dot = dot_general("nvfp4")
    key = jax.random.key(1)
    x = gaussian(5, (2, 16, 4, 8), jnp.float32)  # [b, t, h, d], contract (h, d) with the kernel's (h, d)
    kernel = gaussian(6, (4, 8, 32), jnp.float32)  # [h, d, n]
    dy = gaussian(7, (2, 16, 32), jnp.float32)
    multi = jit(lambda x, kernel, dy: _linear(dot, x, kernel, dy, key, (((2, 3), (0, 1)), ((), ()))))
    flat = jit(lambda x, kernel, dy: _linear(dot, x, kernel, dy, key, (((1,), (0,)), ((), ()))))
    got = multi(x, kernel, dy)
    want = flat(x.reshape(32, 32), kernel.reshape(32, 32), dy.reshape(32, 32))
    for a, b in zip(got, want, strict=True):
        assert_same(a.reshape(b.shape), b)

    xb = gaussian(8, (2, 32, 32), jnp.float32)  # [g, m, k] x [g, k, n]: g is a batch dim
    kb = gaussian(9, (2, 32, 16), jnp.float32)
    dyb = gaussian(10, (2, 32, 16), jnp.float32)
    got = jit(lambda *a: _linear(dot, *a, key, (((2,), (1,)), ((0,), (0,)))))(xb, kb, dyb)
    want = reference_linear(RECIPES["nvfp4"], xb, kb, dyb, key)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(b))))


def _linear(dot, x, kernel, dy, key, dims):
    y, vjp = jax.vjp(lambda a, b: dot(a, b, dims, key=key), x, kernel)
    return (y, *vjp(dy))


def test_output_and_cotangent_dtypes():
    x = gaussian(11, (16, 32), jnp.bfloat16)
    kernel = gaussian(12, (32, 16), jnp.float32)
    dot = dot_general("nvfp4")

    @jit
    def run(x, kernel):
        key = jax.random.key(0)
        mixed = jax.vjp(lambda a, b: dot(a, b, LINEAR_DIMS, key=key), x, kernel)
        f32_out = jax.vjp(
            lambda a, b: dot(a, b, LINEAR_DIMS, preferred_element_type=jnp.float32, key=key),
            x,
            kernel.astype(jnp.bfloat16),
        )
        return [(y, *vjp(jnp.ones_like(y))) for y, vjp in (mixed, f32_out)]

    (y1, dx1, dk1), (y2, dx2, dk2) = run(x, kernel)
    assert (y1.dtype, dx1.dtype, dk1.dtype) == (jnp.float32, jnp.bfloat16, jnp.float32)
    assert (y2.dtype, dx2.dtype, dk2.dtype) == (jnp.float32, jnp.bfloat16, jnp.bfloat16)


def residual_bytes(recipe, x, kernel):
    """Bytes of the arrays the backward pass keeps: the leaves of the vjp closure (keys excluded), taken
    abstractly with eval_shape."""
    key = jax.random.key(0)
    vjp = jax.eval_shape(
        lambda a, b: jax.vjp(lambda a, b: dot_general(recipe)(a, b, LINEAR_DIMS, key=key), a, b)[1], x, kernel
    )
    leaves = [leaf for leaf in jax.tree_util.tree_leaves(vjp) if hasattr(leaf, "dtype")]
    arrays = [leaf for leaf in leaves if not jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)]
    return sum(a.size * a.dtype.itemsize for a in arrays), arrays


def test_residuals_are_the_quantized_copies():
    m, k, n = 256, 128, 64
    x, kernel = gaussian(13, (m, k), jnp.bfloat16), gaussian(14, (k, n), jnp.bfloat16)
    high_precision = x.nbytes + kernel.nbytes
    assert residual_bytes("bf16", x, kernel)[0] == high_precision
    assert residual_bytes("nvfp4_fwd_only", x, kernel)[0] == high_precision  # bf16 backward needs X and W

    nvfp4_bytes, arrays = residual_bytes("nvfp4", x, kernel)
    w_16x16 = n * k // 2 + n * k // 16 + 4  # codes + E4M3 tile scales (one per row) + amax, reused by dgrad
    x_columnwise = k * m // 2 + k * m // 16 + 4  # Xᵀ after the RHT, blocks along the tokens
    assert nvfp4_bytes == w_16x16 + x_columnwise
    assert high_precision / nvfp4_bytes > 3.5  # 4.5 bits instead of 16
    assert not any(a.dtype in (jnp.bfloat16, jnp.float32) and a.size > 1 for a in arrays)

    fp8_bytes, _ = residual_bytes("fp8", x, kernel)  # per-tensor copies are reused transposed
    assert fp8_bytes == m * k + k * n + 4 * 4


def saved_residuals(recipe, policy, capsys, seed) -> list[str]:
    """print_saved_residuals' lines (arguments excluded) for sum(sin(dot(x, kernel))) under `policy`."""
    x, kernel = gaussian(seed, (64, 32), jnp.bfloat16), gaussian(seed + 1, (32, 32), jnp.bfloat16)
    dot = dot_general(recipe)
    f = jax.checkpoint(lambda x, k: jnp.sum(jnp.sin(dot(x, k, LINEAR_DIMS, key=jax.random.key(0)))), policy=policy)
    jax.ad_checkpoint.print_saved_residuals(f, x, kernel)
    return [line for line in capsys.readouterr().out.splitlines() if "from the argument" not in line]


def test_remat_policy_keeps_only_the_quantized_copies(capsys):
    saved = saved_residuals("nvfp4", remat_policy("save_quantized"), capsys, seed=15)
    assert len(saved) == 6 and all(QUANTIZED_RESIDUAL_NAME in line for line in saved), saved
    assert sum(line.startswith("u8[") for line in saved) == 2  # packed codes of W and Xᵀ


@pytest.mark.parametrize("recipe, saved_name", [("bf16", UNQUANTIZED_OPERAND_NAME), ("nvfp4", QUANTIZED_RESIDUAL_NAME)])
def test_matmul_operand_policy_keeps_each_recipes_operands(recipe, saved_name, capsys):
    """model.remat=save_matmul_operands: a bf16 layer keeps its two bf16 operands, an nvfp4 layer its
    4.5-bit copies; nothing else (the sin is recomputed)."""
    saved = saved_residuals(recipe, remat_policy("save_matmul_operands"), capsys, seed=17)
    assert saved and all(saved_name in line for line in saved), saved
    if recipe == "bf16":
        assert sorted(line.split(" ")[0] for line in saved) == ["bf16[32,32]", "bf16[64,32]"], saved


@pytest.mark.parametrize(
    "x_shape, kernel_shape, message",
    [
        ((32, 40), (40, 32), r"layer 'blocks\.0\.mlp\.up' \(lhs shape \(32, 40\).*K=40 to be a multiple of 16"),
        ((32, 32), (32, 24), r"layer 'blocks\.0\.mlp\.up' .*rhs shape \(32, 24\).*N=24 to be a multiple of 16"),
        ((2, 5, 32), (32, 32), r"layer 'blocks\.0\.mlp\.up'.*tokens.*M=10 to be a multiple of 16"),
    ],
)
def test_sizes_the_blocks_do_not_divide_name_the_layer_and_shape(x_shape, kernel_shape, message):
    dot = Policy("nvfp4", num_layers=1).dot_general_for("blocks.0.mlp.up")
    x, kernel = jnp.ones(x_shape, jnp.bfloat16), jnp.ones(kernel_shape, jnp.bfloat16)
    dims = (((x.ndim - 1,), (0,)), ((), ()))
    with pytest.raises(UserError, match=message):
        jax.eval_shape(lambda x, kernel: jax.grad(lambda x: jnp.sum(dot(x, kernel, dims)))(x), x, kernel)


def test_the_forward_pass_alone_takes_any_number_of_tokens():
    """Only the wgrad GEMM contracts over the tokens, so decoding a single token still works."""
    dot = dot_general("nvfp4")
    x, kernel = gaussian(17, (1, 1, 32), jnp.bfloat16), gaussian(18, (32, 16), jnp.bfloat16)
    y = jit(lambda x, kernel: dot(x, kernel, (((2,), (0,)), ((), ()))))(x, kernel)
    assert y.shape == (1, 1, 16) and bool(jnp.all(jnp.isfinite(y)))


def test_bf16_layer_and_unknown_backend():
    dot = Policy("nvfp4", num_layers=1, bf16_first_layers=1).dot_general_for("blocks.0.mlp.up")
    x, kernel = jnp.ones((2, 5, 40), jnp.bfloat16), jnp.ones((40, 24), jnp.bfloat16)
    assert dot(x, kernel, (((2,), (0,)), ((), ()))).shape == (2, 5, 24)  # bf16 takes any size
    with pytest.raises(UserError, match="unknown GEMM backend 'cuda'"):
        dot_general("nvfp4", backend="cuda")


def test_a_nan_input_reaches_the_output_and_the_gradients():
    """A non-finite value must never become finite silently: the loss scaler has to see it."""
    x = gaussian(19, (16, 32), jnp.bfloat16).at[3, 5].set(jnp.nan)
    kernel = gaussian(20, (32, 16), jnp.bfloat16)
    loss, (dx, dkernel) = jit(lambda x, k: loss_and_grads(dot_general("nvfp4"), x, k, jax.random.key(0)))(x, kernel)
    assert not bool(jnp.isfinite(loss))
    assert not bool(jnp.all(jnp.isfinite(dx))) and not bool(jnp.all(jnp.isfinite(dkernel)))
