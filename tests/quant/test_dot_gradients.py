"""Backward-pass properties: stochastic rounding is unbiased, the RHT cancels in wgrad, keys behave."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lm.quant import RECIPES, QuantSpec, Recipe, dot_general
from fp4lm.quant.dot import operand_keys
from fp4lm.quant.recipes import SLOTS
from tests.quant.fake_quant import LINEAR_DIMS, gaussian_layer, jit, quantized_linear, relative_error

NO_ROUNDING = QuantSpec(format="identity")
NO_ROUNDING_RHT = QuantSpec(format="identity", hadamard=True)


def saturation_free_gradient(seed, m, n):
    """dy [m, n] whose every 16-element row block and column block has max |v| = 1 = amax: each block scale
    is then exactly 448 (no E4M3 rounding), so no block maximum is clipped. (When a scale rounds down, the
    block max saturates at 6 — a small deterministic bias that stochastic rounding cannot remove.)"""
    rng = np.random.default_rng(seed)
    dy = np.clip(rng.standard_normal((m, n)) * 0.3, -0.95, 0.95).astype(np.float32)
    for r in range(m):
        for tile_start in range(0, n, 16):  # one ±1 per row block, on the tile's diagonal
            dy[r, tile_start + r % 16] = rng.choice([-1.0, 1.0])
    return jnp.asarray(dy)


def test_stochastic_rounding_gradients_are_unbiased():
    """Mean of dX and dW over n keys -> the gradient with dY unquantized (X and W still quantized by
    round-to-nearest, which is deterministic); the error of the mean shrinks like 1/sqrt(n).

    nvfp4_no_rht has nvfp4's stochastic rounding on both dY copies; without the RHT the data below keeps
    every block maximum unclipped in both directions, so only the 8-bit SR bias (< step/256) remains."""
    recipe = RECIPES["nvfp4_no_rht"]
    expectation_recipe = dataclasses.replace(recipe, name="dy_exact", dgrad_g=NO_ROUNDING, wgrad_g=NO_ROUNDING)
    x, kernel, _ = gaussian_layer(3, 64, 32, 32)
    dy = saturation_free_gradient(3, 64, 32)
    _, dx_exp, dw_exp = quantized_linear(dot_general(expectation_recipe), x, kernel, dy, None)

    dot = dot_general(recipe)

    @jit
    def grads_over_keys(keys):
        return jax.vmap(lambda k: quantized_linear.__wrapped__(dot, x, kernel, dy, k)[1:])(keys)

    dxs, dws = grads_over_keys(jax.random.split(jax.random.key(0), 1024))
    for name, samples, expected in (("dx", dxs, dx_exp), ("dw", dws, dw_exp)):
        errors = {n: relative_error(jnp.mean(samples[:n], axis=0), expected) for n in (16, 64, 1024)}
        single = relative_error(samples[0], expected)
        assert single > 0.05, (name, single)  # each sample really is noisy
        # 1/sqrt(n): /2 from 16 to 64 samples, /8 from 16 to 1024; allow for noise and the SR bias floor.
        assert errors[64] < errors[16] / 1.5, (name, errors)
        assert errors[1024] < errors[16] / 5.0, (name, errors)
        assert errors[1024] < single / 20, (name, errors, single)


def test_hadamard_without_quantization_gives_the_exact_weight_gradient():
    rht_only = Recipe(name="rht_only", wgrad_g=NO_ROUNDING_RHT, wgrad_x=NO_ROUNDING_RHT)
    for dtype, tolerance in ((jnp.float32, 1e-6), (jnp.bfloat16, 2**-8)):
        x, kernel, dy = gaussian_layer(4, 64, 32, 48, dtype)
        with jax.default_matmul_precision("highest"):  # a GPU's default float32 product rounds to TF32
            got = quantized_linear(dot_general(rht_only), x, kernel, dy, None, preferred_element_type=jnp.float32)
            exact = quantized_linear(dot_general("bf16"), x, kernel, dy, None, preferred_element_type=jnp.float32)
        assert relative_error(got[0], exact[0]) < 1e-6 and relative_error(got[1], exact[1]) < 1e-6
        err = relative_error(got[2], exact[2])
        assert err < tolerance, (dtype, err)

    # The residual really is the transformed Xᵀ (so the agreement above is the transform cancelling).
    x, kernel, _ = gaussian_layer(4, 64, 32, 48)
    _, vjp = jax.vjp(lambda a, b: dot_general(rht_only)(a, b, LINEAR_DIMS), x, kernel)
    saved = [leaf for leaf in jax.tree_util.tree_leaves(vjp) if getattr(leaf, "shape", None) == (1, 32, 64)]
    from fp4lm.numerics import rht

    assert len(saved) == 1
    np.testing.assert_allclose(saved[0][0], rht(x.T), rtol=1e-6, atol=1e-6)
    assert relative_error(saved[0][0], x.T) > 0.5


def test_keys_drive_stochastic_rounding_only():
    x, kernel, dy = gaussian_layer(5, 32, 32, 32, jnp.bfloat16)
    dot = dot_general("nvfp4")
    a = quantized_linear(dot, x, kernel, dy, jax.random.key(1))
    b = quantized_linear(dot, x, kernel, dy, jax.random.key(1))
    c = quantized_linear(dot, x, kernel, dy, jax.random.key(2))
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(u, np.float32), np.asarray(v, np.float32))
    np.testing.assert_array_equal(np.asarray(a[0], np.float32), np.asarray(c[0], np.float32))  # fprop is RNE
    assert not np.array_equal(np.asarray(a[1], np.float32), np.asarray(c[1], np.float32))
    assert not np.array_equal(np.asarray(a[2], np.float32), np.asarray(c[2], np.float32))
    with pytest.raises(ValueError, match=r"rounds dgrad_g, wgrad_g stochastically, but no random key"):
        quantized_linear(dot, x, kernel, dy, None)  # no silent fixed key
    forward_only = jax.jit(lambda x, kernel: dot(x, kernel, LINEAR_DIMS))(x, kernel)  # nvfp4's fprop is RNE
    np.testing.assert_array_equal(np.asarray(forward_only, np.float32), np.asarray(a[0], np.float32))


def test_every_operand_slot_draws_from_its_own_key():
    keys = operand_keys(jax.random.key(0))
    assert tuple(keys) == SLOTS
    data = {tuple(np.asarray(jax.random.key_data(k)).tolist()) for k in keys.values()}
    assert len(data) == len(SLOTS)
    # The dgrad and wgrad copies of dY get independent bits: their 8-bit streams are uncorrelated.
    shape = (4096,)
    bits_dgrad = jax.random.bits(keys["dgrad_g"], shape, jnp.uint8).astype(np.float32)
    bits_wgrad = jax.random.bits(keys["wgrad_g"], shape, jnp.uint8).astype(np.float32)
    assert abs(np.corrcoef(bits_dgrad, bits_wgrad)[0, 1]) < 0.1
