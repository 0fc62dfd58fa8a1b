"""The 16-point random Hadamard transform (docs/numerics.md §4)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from fp4lm.numerics import hadamard, nvfp4, rht, rht_matrix

SIGNS = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]  # docs/numerics.md §4, mask 0xD7E8


def test_matrix_is_signed_sylvester_over_four_and_orthogonal():
    h = rht_matrix()
    np.testing.assert_array_equal(hadamard.rht_signs(), SIGNS)
    sylvester = np.array([[(-1) ** bin(i & j).count("1") for j in range(16)] for i in range(16)])
    np.testing.assert_array_equal(h, np.diag(SIGNS) @ sylvester / 4)
    np.testing.assert_array_equal(h @ h.T, np.eye(16))
    assert set(np.unique(np.abs(h)).tolist()) == {0.25}


def test_spec_examples():
    e0, e3 = np.zeros(16, np.float32), np.zeros(16, np.float32)
    e0[0], e3[3] = 16.0, 8.0
    np.testing.assert_array_equal(np.asarray(rht(jnp.asarray(e0))), np.full(16, 4.0))
    want = [-2, 2, 2, -2, -2, 2, 2, -2, -2, 2, 2, -2, -2, 2, 2, -2]
    np.testing.assert_array_equal(np.asarray(rht(jnp.asarray(e3))), want)


def test_transform_cancels_inside_the_weight_gradient_product():
    """RHT(dYᵀ)·RHT(Xᵀ)ᵀ = dYᵀ·X: the block-diagonal H is orthogonal along the token axis."""
    keys = jax.random.split(jax.random.key(0), 2)
    dy = jax.random.normal(keys[0], (64, 24), jnp.float32)  # tokens x out features
    x = jax.random.normal(keys[1], (64, 40), jnp.float32)  # tokens x in features
    with jax.default_matmul_precision("highest"):  # a GPU's default float32 product rounds to TF32
        exact = dy.T @ x
        transformed = rht(dy.T) @ rht(x.T).T
    np.testing.assert_allclose(np.asarray(transformed), np.asarray(exact), rtol=1e-5, atol=1e-4)


def test_bf16_output_is_the_exact_sum_rounded_once_within_one_ulp():
    x = jax.random.normal(jax.random.key(1), (8, 4, 64), jnp.float32).astype(jnp.bfloat16)
    y = rht(x)
    assert y.dtype == jnp.bfloat16 and y.shape == x.shape
    chunks = np.asarray(x, np.float64).reshape(8, 4, 4, 16)
    exact = (chunks @ rht_matrix().astype(np.float64)).reshape(x.shape)
    rounded = exact.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    got = np.asarray(y).astype(np.float64)
    ulp = np.abs(rounded) * 2.0**-7 + 1e-30
    assert np.all(np.abs(got - rounded) <= ulp)
    assert np.mean(got == rounded) > 0.999


def test_bf16_rounding_survives_jit():
    """Under jit the bf16 rounding of the RHT output must stay observable in the quantizer."""
    x = jax.random.normal(jax.random.key(2), (16, 32), jnp.float32).astype(jnp.bfloat16)

    def amax_after_rht(a):
        return nvfp4.quantize(a, hadamard=True).amax

    eager, jitted = amax_after_rht(x), jax.jit(amax_after_rht)(x)
    rounded_amax = float(jnp.max(jnp.abs(rht(x).astype(jnp.float32))))
    assert float(eager) == float(jitted) == rounded_amax
    np.testing.assert_array_equal(np.asarray(rht(x)), np.asarray(jax.jit(rht)(x)))


def test_float32_input_stays_float32():
    x = jax.random.normal(jax.random.key(3), (4, 32), jnp.float32)
    y = rht(x)
    assert y.dtype == jnp.float32
    want = (np.asarray(x).reshape(4, 2, 16) @ rht_matrix()).reshape(4, 32)
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-6, atol=1e-7)


def test_hadamard_quantize_holds_transformed_values():
    x = jax.random.normal(jax.random.key(4), (16, 32), jnp.float32).astype(jnp.bfloat16)
    q = jax.jit(lambda a: nvfp4.quantize(a, hadamard=True))(x)
    direct = jax.jit(lambda a: nvfp4.quantize(rht(a)))(x)
    assert q.hadamard
    np.testing.assert_array_equal(np.asarray(q.packed), np.asarray(direct.packed))
    np.testing.assert_array_equal(np.asarray(q.dequantize()), np.asarray(direct.dequantize()))


def test_rejects_a_last_axis_that_is_not_a_multiple_of_16():
    with pytest.raises(ValueError, match=r"\(4, 24\)"):
        rht(jnp.ones((4, 24)))
