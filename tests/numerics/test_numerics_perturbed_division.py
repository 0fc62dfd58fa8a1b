"""The quantized bits do not depend on the platform's divide (a GPU's f32 divide is approximate).

Every quantizer is run with `division._approximate_divide` replaced by one that is one ulp off
upwards or downwards (tests/numerics/perturbed_division.py); codes, packed bytes, scale bytes,
amax, FP8 scales and dequantized values must equal the unperturbed run - and for the
TransformerEngine vectors, the vectors themselves.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lm.numerics import fp8, microscaling, nvfp4, nvfp4_scales
from tests.numerics import test_numerics_vectors as vectors
from tests.numerics.data_gen import DISTRIBUTIONS, make_tensor
from tests.numerics.perturbed_division import off_by_one_ulp, perturbed

pytestmark = pytest.mark.slow

SHAPE = (32, 64)
DIRECTIONS = [pytest.param(+1, id="one_ulp_up"), pytest.param(-1, id="one_ulp_down")]


def edge_tensors():
    """Tensors at the edges of the scale arithmetic (same shape as the random ones)."""
    rng = np.random.default_rng(7)
    base = rng.standard_normal(SHAPE).astype(np.float32)
    out = [np.zeros(SHAPE, np.float32)]
    for value in (np.nan, np.inf, -np.inf):
        x = base.copy()
        x[3, 17] = value
        out.append(x)
    for amax in (1e-37, 7.9e-36, 1e-30, 2688.0, 2688.0 * 2.0**-20, 448.0, 6.0, 3.0e38, np.finfo(np.float32).max):
        x = base / np.abs(base).max() * np.float32(amax)
        x[0, 0] = amax
        out.append(x.astype(np.float32))
    x = base.copy()
    x[:, 32:] *= 1e-6  # block scales that underflow to E4M3 subnormals / zero
    out.append(x)
    out.append(tie_tensor())
    return out


def tie_tensor():
    """amax 2688 makes S_enc = S_dec = 1; a block (and a 16x16 tile) with max 12 gets s_b = 2 and
    enc_b = 1/2, so 0.5, 2.5, 5, 7, 10 land exactly on E2M1 ties (0.25, 1.25, 2.5, 3.5, 5): an
    encode scale one ulp off moves every one of them."""
    x = np.zeros(SHAPE, np.float32)
    x[0, 0] = 2688.0
    x[16:32, 16:32] = 1.0
    x[16:32, 16:22] = [12.0, 0.5, 2.5, 5.0, 7.0, 10.0]
    return x


def family_tensors():
    out = [
        make_tensor(SHAPE, distribution, log10_scale, seed)
        for seed, distribution in enumerate(DISTRIBUTIONS)
        for log10_scale in (-30, -6, 0, 4, 30)
    ]
    rng = np.random.default_rng(1)
    for _ in range(20):  # amaxes spread over every exponent, random significands
        out.append((rng.standard_normal(SHAPE) * 2.0 ** rng.integers(-120, 120)).astype(np.float32))
    return np.stack(out + edge_tensors())


def _bytes(a):
    return np.asarray(jax.lax.bitcast_convert_type(a, jnp.uint8))


def quantize_everything(x, key):
    """Every format and mode on one tensor: the integers and float bits that must not move."""
    out = {}
    for name, kwargs in {
        "nvfp4": {},
        "nvfp4_16x16": {"block": (16, 16)},
        "nvfp4_rht": {"hadamard": True},
        "nvfp4_sr": {"rounding": "stochastic", "key": key},
    }.items():
        q = nvfp4.quantize(x, **kwargs)
        out |= {f"{name}_packed": q.packed, f"{name}_scales": q.scale_bytes(), f"{name}_amax": q.amax}
        out[f"{name}_dequant"] = q.dequantize()
        out[f"{name}_encode"] = nvfp4.block_encode_scale(q.scales.astype(jnp.float32), nvfp4.global_scales(q.amax))
    mx4 = microscaling.quantize_mxfp4(x)
    mx8 = microscaling.quantize_mxfp8(x)
    out |= {"mxfp4_data": mx4.data, "mxfp4_scales": mx4.scale_bytes(), "mxfp8_data": mx8.data}
    for dtype in (jnp.float8_e4m3fn, jnp.float8_e5m2):
        q = fp8.quantize(x, dtype)
        name = jnp.dtype(dtype).name
        out |= {f"{name}_data": q.data, f"{name}_scale_inv": q.scale_inv, f"{name}_dequant": q.dequantize()}
    return {
        name: value if value.dtype == jnp.uint8 else jax.lax.bitcast_convert_type(value, jnp.uint8)
        for name, value in out.items()
    }


def run_all(tensors):
    keys = jax.random.split(jax.random.key(3), len(tensors))
    result = jax.jit(jax.vmap(quantize_everything))(jnp.asarray(tensors), keys)
    return {name: np.asarray(value) for name, value in result.items()}


@pytest.fixture(scope="module")
def tensors_and_reference():
    tensors = family_tensors()
    jax.clear_caches()
    return tensors, run_all(tensors)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_no_quantized_bit_moves_when_the_divide_is_one_ulp_off(direction, tensors_and_reference, monkeypatch):
    tensors, reference = tensors_and_reference
    with perturbed(monkeypatch, off_by_one_ulp(direction)):
        got = run_all(tensors)
    for name, want in reference.items():
        np.testing.assert_array_equal(got[name], want, err_msg=name)


def test_the_tensors_would_expose_an_uncorrected_one_ulp_off_divide(tensors_and_reference, monkeypatch):
    """Sanity check of the test above: with NVFP4's divisions done directly by the one-ulp-up
    divide (no correction), packed codes and scale bytes of these tensors do change."""
    tensors, reference = tensors_and_reference
    plain = off_by_one_ulp(+1)
    divide = lambda a, b: plain(jnp.float32(a), jnp.float32(b))  # noqa: E731
    for module in (nvfp4, nvfp4_scales):
        monkeypatch.setattr(module, "divide_correctly_rounded", divide)
    monkeypatch.setattr(nvfp4_scales, "reciprocal_correctly_rounded", lambda b: plain(jnp.float32(1), b))
    jax.clear_caches()
    try:
        got = run_all(tensors)
    finally:
        jax.clear_caches()
    changed = {name: int((got[name] != reference[name]).sum()) for name in ("nvfp4_packed", "nvfp4_16x16_packed")}
    assert all(count > 0 for count in changed.values()), changed


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_transformer_engine_vectors_hold_with_a_one_ulp_off_divide(direction, monkeypatch):
    with perturbed(monkeypatch, off_by_one_ulp(direction)):
        for name, case in vectors.CASES.items():
            want = vectors.expected(case)
            for dtype in vectors.dtypes_for(case):
                q, dq = vectors.run_quantize(case, vectors.case_input(case, dtype), use_jit=True)
                message = f"{name} {jnp.dtype(dtype).name}"
                np.testing.assert_array_equal(np.asarray(q.codes()), want["codes"], err_msg=message)
                np.testing.assert_array_equal(np.asarray(q.scale_bytes()), want["scale_bytes"], err_msg=message)
                assert int(vectors.bits(q.amax)) == want["amax_bits"], message
                np.testing.assert_array_equal(vectors.bits(dq), want["dequant_bits"], err_msg=message)
