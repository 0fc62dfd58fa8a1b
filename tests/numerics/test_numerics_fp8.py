"""Per-tensor current-scaling FP8 (E4M3 and E5M2)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lm.numerics import fp8

FORMATS = [  # dtype, largest finite value, mantissa bits, smallest normal
    (jnp.float8_e4m3fn, 448.0, 3, 2.0**-6),
    (jnp.float8_e5m2, 57344.0, 2, 2.0**-14),
]


def _quantize_jit(x, dtype):
    return jax.jit(fp8.quantize, static_argnums=1)(x, dtype)


@pytest.mark.parametrize("dtype,fmax,mantissa_bits,min_normal", FORMATS)
def test_amax_maps_to_the_largest_value_and_errors_are_half_an_ulp(dtype, fmax, mantissa_bits, min_normal):
    x = jax.random.normal(jax.random.key(0), (64, 128), jnp.float32) * 1e-3
    q = _quantize_jit(x, dtype)
    assert q.data.dtype == dtype and q.shape == x.shape
    assert abs(float(q.data.astype(jnp.float32).ravel()[jnp.argmax(jnp.abs(x))])) == fmax
    assert float(q.amax) == float(jnp.max(jnp.abs(x)))
    xs, dq = np.asarray(x), np.asarray(q.dequantize())
    scaled = np.abs(xs) / float(q.scale_inv)
    normal = scaled >= min_normal
    rel = np.abs(dq - xs)[normal] / np.abs(xs)[normal]
    assert rel.max() <= 2.0 ** -(mantissa_bits + 1) * (1 + 1e-6)
    np.testing.assert_array_equal(dq, np.asarray(fp8.quantize(x, dtype).dequantize()))  # jit == eager


@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_non_finite_inputs_never_come_back_finite(dtype):
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(4, 16)
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[1, 2] = bad
        dq = np.asarray(_quantize_jit(jnp.asarray(y), dtype).dequantize())
        assert not np.isfinite(dq).any()


@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_zeros_stay_zero(dtype):
    q = _quantize_jit(jnp.zeros((4, 16)), dtype)
    assert float(q.scale_inv) == 1.0
    assert np.all(np.asarray(q.dequantize()) == 0)


def test_rejects_other_dtypes():
    with pytest.raises(ValueError, match="float8"):
        fp8.quantize(jnp.ones((4, 16)), jnp.bfloat16)
    with pytest.raises(ValueError, match="floating"):
        fp8.quantize(jnp.ones((4, 16), jnp.int32))
