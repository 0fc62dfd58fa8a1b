"""NVFP4 special values (docs/numerics.md §9): NaN, ±inf, zeros, -0.0, scale underflow; non-finite stays non-finite."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lm.numerics import nvfp4
from tests.numerics import nvfp4_reference

quantize_jit = jax.jit(nvfp4.quantize, static_argnames=("block",))


def both_modes(x, block=(1, 16)):
    """Eagerly and under jit (eager compiles every op per shape, so only the special-value tests use it)."""
    return [nvfp4.quantize(x, block=block), quantize_jit(x, block=block)]


def base_tensor():
    return np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32)


@pytest.mark.parametrize("block", [(1, 16), (16, 16)])
def test_a_nan_anywhere_makes_every_scale_and_value_nan(block):
    x = base_tensor()
    x[5, 20] = np.nan
    for q in both_modes(jnp.asarray(x), block):
        assert np.all(np.isnan(np.asarray(q.scales.astype(jnp.float32))))
        np.testing.assert_array_equal(np.asarray(q.codes()), 0)
        assert np.all(np.isnan(np.asarray(q.dequantize())))
        assert np.isnan(float(q.amax))


def test_inf_saturates_its_block_and_makes_the_tensor_non_finite():
    x = base_tensor()
    x[2, 3], x[7, 30] = np.inf, -np.inf
    want = nvfp4_reference.quantize(x)
    for q in both_modes(jnp.asarray(x)):
        scale_bytes, codes = np.asarray(q.scale_bytes()), np.asarray(q.codes())
        assert scale_bytes[2, 0] == 0x7E and scale_bytes[7, 1] == 0x7E  # d_b = inf -> clamped to 448
        assert codes[2, 3] == 7 and codes[7, 30] == 15
        np.testing.assert_array_equal(codes, want["codes"])
        np.testing.assert_array_equal(scale_bytes, want["scale_bytes"])
        dq = np.asarray(q.dequantize())
        assert not np.isfinite(dq).any()
        assert np.all(np.isinf(dq[codes % 8 != 0])) and np.all(np.isnan(dq[codes % 8 == 0]))


def test_zero_tensor_and_zero_blocks():
    for q in [quantize_jit(jnp.zeros((16, 32)))]:
        np.testing.assert_array_equal(np.asarray(q.codes()), 0)
        np.testing.assert_array_equal(np.asarray(q.scale_bytes()), 0)
        assert np.all(np.asarray(q.dequantize()) == 0)
    x = base_tensor()
    x[:, 16:] = 0.0
    x[0, 16] = -0.0
    for q in [quantize_jit(jnp.asarray(x))]:
        np.testing.assert_array_equal(np.asarray(q.codes())[:, 16:], 0)
        np.testing.assert_array_equal(np.asarray(q.scale_bytes())[:, 1], 0)


def test_negative_zero_gets_code_zero_and_tiny_negatives_code_eight():
    x = np.zeros((1, 16), np.float32)
    x[0, :4] = [6.0, -0.0, -0.1, 0.1]
    for q in [quantize_jit(jnp.asarray(x))]:
        np.testing.assert_array_equal(np.asarray(q.codes())[0, :4], [7, 0, 8, 0])
        dq = np.asarray(q.dequantize())[0]
        assert not np.signbit(dq[1]) and np.signbit(dq[2])


def test_scale_underflow_saturates_codes_but_dequantizes_to_zero():
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 1.0
    x[0, 16:18] = [1e-7, -1e-7]  # amax_b / amax ~ 1e-7 -> d_b below 2^-10 -> s_b = 0
    for q in [quantize_jit(jnp.asarray(x))]:
        assert np.asarray(q.scale_bytes())[0, 1] == 0
        np.testing.assert_array_equal(np.asarray(q.codes())[0, 16:18], [7, 15])
        assert np.all(np.asarray(q.dequantize())[0, 16:] == 0)
