"""Bit-exact agreement with the TransformerEngine test vectors (tests/fixtures; docs/numerics.md §13 lists them).

Every case is checked in codes, scale bytes, amax, packed bytes and dequantized bits, eagerly and
under jit, for float32 input and (except the float32-only cases) bfloat16 input.
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from fp4lm.numerics import nvfp4
from tests.numerics import nvfp4_reference

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "nvfp4_test_vectors.json"
VECTORS = json.loads(FIXTURE.read_text())
CASES = {case["name"]: case for case in VECTORS["cases"]}
# Cases defined for float32 input only (docs/numerics.md §13).
NOT_BF16 = {"TV1_single_block", "TV3_fractional_scale_saturation", "TV5_scale_underflow"}


def f32_from_hex(words):
    return np.array([int(w, 16) for w in words], np.uint32).view(np.float32)


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def expected(case):
    rows, cols = case["quantized_operand_shape"]
    scales = np.array(case["block_scales_e4m3_bytes"], np.uint8)
    if case["tile"] == [16, 16]:
        scales = np.repeat(scales, 16, axis=0)  # the per-row layout
    return dict(
        codes=np.array(case["codes"], np.uint8),
        scale_bytes=scales,
        amax_bits=int(case["amax_hex"], 16),
        packed=np.array([list(bytes.fromhex(row)) for row in case["packed_hex"]], np.uint8),
        dequant_bits=np.array([int(w, 16) for w in case["dequant_f32_hex"]], np.uint32).reshape(rows, cols),
    )


def case_input(case, dtype):
    """The array to feed: for TV9 the bf16 input transposed (quantize applies the RHT itself)."""
    x = f32_from_hex(case["input_f32_hex"]).reshape(case["input_shape"])
    assert np.array_equal(x.astype(ml_dtypes.bfloat16).astype(np.float32), x) or dtype == jnp.float32
    x = jnp.asarray(x).astype(dtype)
    return x.T if case["rht_columnwise"] else x


def run_quantize(case, x, use_jit):
    def fn(a):
        return nvfp4.quantize(a, block=tuple(case["tile"]), hadamard=case["rht_columnwise"])

    q = jax.jit(fn)(x) if use_jit else fn(x)
    dq = jax.jit(nvfp4.dequantize)(q) if use_jit else nvfp4.dequantize(q)
    return q, dq


def dtypes_for(case):
    if case["rht_columnwise"]:
        return [jnp.bfloat16]  # README: TV9 is defined for bf16 input only
    return [jnp.float32] if case["name"] in NOT_BF16 else [jnp.float32, jnp.bfloat16]


def modes_for(case, dtype):
    """jit for every allowed dtype; eagerly (op by op, which compiles each op per shape and is slow
    on CPU) once per case: float32 where allowed, plus bfloat16 for the random case TV7."""
    eager = dtype == dtypes_for(case)[0] or case["name"] == "TV7_random_bf16_1x16"
    return (False, True) if eager else (True,)


PARAMS = [
    pytest.param(name, dtype, use_jit, id=f"{name}-{jnp.dtype(dtype).name}-{'jit' if use_jit else 'eager'}")
    for name, case in CASES.items()
    for dtype in dtypes_for(case)
    for use_jit in modes_for(case, dtype)
]


def test_fixture_has_the_ten_documented_cases():
    assert len(CASES) == 10
    assert VECTORS["rht_sign_mask"] == "0xd7e8"


@pytest.mark.parametrize("name,dtype,use_jit", PARAMS)
def test_vector_bit_exact(name, dtype, use_jit):
    case = CASES[name]
    want = expected(case)
    q, dq = run_quantize(case, case_input(case, dtype), use_jit)

    assert q.shape == tuple(case["quantized_operand_shape"])
    assert q.scales.dtype == jnp.float8_e4m3fn and q.packed.dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(q.codes()), want["codes"])
    np.testing.assert_array_equal(np.asarray(q.scale_bytes()), want["scale_bytes"])
    assert int(bits(q.amax)) == want["amax_bits"]
    np.testing.assert_array_equal(np.asarray(q.packed), want["packed"])
    np.testing.assert_array_equal(bits(dq), want["dequant_bits"])


def test_tv9_operand_fed_directly_matches():
    """The quantizer alone on the given post-RHT operand (README: `quantized_operand_f32_hex`)."""
    case = CASES["TV9_grad_columnwise_RHT"]
    operand = f32_from_hex(case["quantized_operand_f32_hex"]).reshape(case["quantized_operand_shape"])
    want = expected(case)
    for dtype in (jnp.float32, jnp.bfloat16):
        q = jax.jit(nvfp4.quantize)(jnp.asarray(operand).astype(dtype))
        np.testing.assert_array_equal(np.asarray(q.codes()), want["codes"])
        np.testing.assert_array_equal(np.asarray(q.scale_bytes()), want["scale_bytes"])
        np.testing.assert_array_equal(bits(q.dequantize()), want["dequant_bits"])


def test_tv9_rht_output_is_the_documented_operand():
    from fp4lm.numerics import rht

    case = CASES["TV9_grad_columnwise_RHT"]
    operand = f32_from_hex(case["quantized_operand_f32_hex"]).reshape(case["quantized_operand_shape"])
    x = case_input(case, jnp.bfloat16)
    for fn in (rht, jax.jit(rht)):
        y = fn(x)
        assert y.dtype == jnp.bfloat16
        np.testing.assert_array_equal(bits(y.astype(jnp.float32)), bits(operand))


def test_tv8_columnwise_is_rowwise_transposed():
    case = CASES["TV8_weight_2d_16x16"]
    x = case_input(case, jnp.float32)
    quantize = jax.jit(nvfp4.quantize, static_argnames="block")
    row, col = quantize(x, block=(16, 16)), quantize(x.T, block=(16, 16))
    np.testing.assert_array_equal(np.asarray(col.codes()), np.asarray(row.codes()).T)
    np.testing.assert_array_equal(np.asarray(col.scale_bytes())[::16], np.asarray(row.scale_bytes())[::16].T)


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if not c["rht_columnwise"]])
def test_numpy_oracle_agrees_with_vectors(name):
    """The NumPy oracle used by the property tests reproduces the vectors too."""
    case = CASES[name]
    want = expected(case)
    got = nvfp4_reference.quantize(case_input(case, jnp.float32), tuple(case["tile"]))
    np.testing.assert_array_equal(got["codes"], want["codes"])
    np.testing.assert_array_equal(got["scale_bytes"], want["scale_bytes"])
    np.testing.assert_array_equal(bits(got["dequant"]), want["dequant_bits"])


# --- docs/numerics.md §13 example A: the TE >= 2.14 multiplication order of the block decode scale ---------
ORDER_CASES = [  # amax, amax_b, expected E4M3 byte under amax_b · fp32(S_enc · fp32(1/6))
    ("4065fd42", "3fddc67e", 0x75),
    ("3fccc2c3", "3ec572a8", 0x6E),
    ("401ca010", "3f3e3015", 0x71),
]


@pytest.mark.parametrize("amax_hex,block_amax_hex,want", ORDER_CASES)
@pytest.mark.parametrize("use_jit", [False, True])
def test_example_a_block_scale_order(amax_hex, block_amax_hex, want, use_jit):
    amax, block_amax = f32_from_hex([amax_hex, block_amax_hex])
    row = np.zeros((1, 32), np.float32)
    row[0, 0], row[0, 16] = amax, block_amax
    fn = jax.jit(nvfp4.quantize) if use_jit else nvfp4.quantize
    q = fn(jnp.asarray(row))
    assert int(np.asarray(q.scale_bytes())[0, 1]) == want
    assert int(np.asarray(q.scale_bytes())[0, 0]) == 0x7E  # the amax block: 448
    direct = nvfp4.block_scale_bytes(jnp.float32(block_amax), nvfp4.global_scales(jnp.float32(amax)))
    assert int(direct) == want


def test_example_a_orders_really_differ():
    """The pinned cases do separate the orders: the pre-2.14 `(amax_b/6)·S_enc` gives other bytes."""
    differing = 0
    for amax_hex, block_amax_hex, want in ORDER_CASES:
        amax, block_amax = f32_from_hex([amax_hex, block_amax_hex])
        s_enc = np.float32(2688) / amax
        old = np.float32(np.float32(block_amax / np.float32(6)) * s_enc)
        old_byte = int(np.array(old).astype(ml_dtypes.float8_e4m3fn).view(np.uint8))
        differing += old_byte != want
    assert differing >= 1


def test_zero_tensor_uses_the_reference_global_scale():
    s_enc, _, _ = nvfp4.global_scales(jnp.float32(0.0))
    assert int(bits(s_enc)) == 0x7F7FFFFF  # FLT_MAX, TE's reference convention (TV4b records CUDA's 1.0)
    s_enc, s_dec, _ = nvfp4.global_scales(jnp.float32(np.inf))
    assert float(s_enc) == 1.0 and float(s_dec) == 1.0


def test_block_scaled_values_are_exact_in_bf16_and_times_the_tensor_scale_give_dequant():
    case = CASES["TV7_random_bf16_1x16"]
    q = jax.jit(nvfp4.quantize)(case_input(case, jnp.float32))
    scaled32, scaled16 = np.asarray(q.block_scaled()), np.asarray(q.block_scaled(jnp.bfloat16))
    np.testing.assert_array_equal(scaled16.astype(np.float32), scaled32)
    decode = np.float32(f32_from_hex([case["amax_hex"]])[0] / np.float32(2688))
    np.testing.assert_array_equal(bits(scaled32 * decode), expected(case)["dequant_bits"])
