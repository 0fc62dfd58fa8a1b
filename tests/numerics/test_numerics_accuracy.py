"""Reference error levels (docs/numerics.md §13): relative RMS error on N(0,1) bf16 data of shape 256x4096."""

import jax
import jax.numpy as jnp
import pytest

import fp4lm.numerics as numerics

CASES = [  # format, options, spec value, tolerance
    ("nvfp4", dict(block=(1, 16)), 0.0952, 0.005),
    ("nvfp4", dict(block=(16, 16)), 0.1114, 0.005),
    ("mxfp4", {}, 0.1153, 0.005),
]


@pytest.fixture(scope="module")
def normal_bf16():
    return jax.random.normal(jax.random.key(0), (256, 4096), jnp.float32).astype(jnp.bfloat16)


def relative_rms_error(x, fmt, **options):
    @jax.jit
    def error(a):
        xf = a.astype(jnp.float32)
        dq = numerics.quantize(a, fmt, **options).dequantize(jnp.float32)
        return jnp.sqrt(jnp.sum((dq - xf) ** 2) / jnp.sum(xf**2))

    return float(error(x))


@pytest.mark.parametrize("fmt,options,want,tolerance", CASES)
def test_relative_rms_error_matches_the_spec(normal_bf16, fmt, options, want, tolerance):
    assert abs(relative_rms_error(normal_bf16, fmt, **options) - want) <= tolerance


def test_eight_bit_formats_are_far_more_accurate(normal_bf16):
    x = normal_bf16[:64]
    mxfp8, e4m3, e5m2 = (relative_rms_error(x, f) for f in ("mxfp8", "fp8_e4m3", "fp8_e5m2"))
    assert 0.02 < mxfp8 < 0.035 and 0.02 < e4m3 < 0.035  # ~2^-4 / sqrt(3) · ...: 3 mantissa bits
    assert 0.04 < e5m2 < 0.065  # one mantissa bit fewer: about twice the error
