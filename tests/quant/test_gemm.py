"""GEMM backends: native (jax.nn.scaled_matmul) against emulated, the lowered HLO of the native path,
the device-based choice of "auto", and the exact views of quantized arrays that both backends consume."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lm import numerics
from fp4lm.quant import dot_general, gemm
from tests.quant.fake_quant import gaussian, gaussian_layer, jit, quantized_linear


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp8", "fp8"])
def test_native_and_emulated_agree(recipe):
    x, kernel, dy = gaussian_layer(0, 64, 64, 32)
    key = jax.random.key(2)
    native = quantized_linear(dot_general(recipe, backend="native"), x, kernel, dy, key)
    emulated = quantized_linear(dot_general(recipe, backend="emulated"), x, kernel, dy, key)
    for a, b in zip(native, emulated, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(b))))


def lowered_text(recipe, backend):
    x, kernel, dy = gaussian_layer(1, 32, 32, 32, jnp.bfloat16)
    dot = dot_general(recipe, backend=backend)
    return quantized_linear.lower(dot, x, kernel, dy, jax.random.key(0)).as_text()


def test_native_path_lowers_to_the_block_scaled_matmul():
    """jax lowers scaled_matmul on CPU through a private `_scaled_matmul` decomposition (cuDNN's block-scaled
    GEMM on Blackwell): all three GEMMs must go through it, on FP4 data with E4M3 scales."""
    native = lowered_text("nvfp4", "native")
    assert native.count("call @_scaled_matmul") == 3
    assert "f4E2M1FN" in native and "f8E4M3FN" in native
    mxfp8 = lowered_text("mxfp8", "native")
    assert mxfp8.count("call @_scaled_matmul") == 3 and "f8E8M0FNU" in mxfp8
    emulated = lowered_text("nvfp4", "emulated")
    assert "_scaled_matmul" not in emulated


def test_auto_picks_native_only_on_fp4_tensor_cores():
    def device(platform, capability):
        return types.SimpleNamespace(platform=platform, compute_capability=capability)

    assert gemm.resolve_backend("auto", device("gpu", "10.0")) == "native"
    assert gemm.resolve_backend("auto", device("gpu", "12.0")) == "native"
    assert gemm.resolve_backend("auto", device("gpu", "9.0")) == "emulated"
    assert gemm.resolve_backend("auto", types.SimpleNamespace(platform="cpu")) == "emulated"
    assert gemm.resolve_backend("auto") == "emulated"  # the tests run on the CPU
    assert gemm.resolve_backend("native", device("gpu", "9.0")) == "native"


@pytest.mark.parametrize(
    "quantize",
    [
        lambda a: numerics.quantize(a, "nvfp4"),
        lambda a: numerics.quantize(a, "nvfp4", block=(16, 16)),
        lambda a: numerics.quantize(a, "mxfp4", block=(1, 32)),
        lambda a: numerics.quantize(a, "mxfp8", block=(1, 32)),
        lambda a: numerics.quantize(a, "fp8_e5m2"),
    ],
    ids=["nvfp4", "nvfp4_16x16", "mxfp4", "mxfp8", "fp8_e5m2"],
)
def test_scaled_operand_represents_the_dequantized_values(quantize):
    a = gaussian(3, (2, 32, 64), jnp.float32)

    @jit
    def both(a):
        q = quantize(a)
        op = gemm.scaled_operand(q)
        return q.dequantize(jnp.float32), gemm._bf16_values(op).astype(jnp.float32) * op.global_scale

    dequantized, from_operand = both(a)
    np.testing.assert_allclose(from_operand, dequantized, rtol=2e-7, atol=0)


def test_16x16_tiles_transpose_exactly():
    w = gaussian(4, (1, 48, 64), jnp.bfloat16)

    @jit
    def views(w):
        transposed = gemm.scaled_operand(numerics.quantize(w, "nvfp4", block=(16, 16))).transpose_rows_and_k()
        direct = gemm.scaled_operand(numerics.quantize(jnp.swapaxes(w, 1, 2), "nvfp4", block=(16, 16)))
        bits = lambda v: jax.lax.bitcast_convert_type(v, jnp.uint8)  # noqa: E731
        return (
            bits(transposed.block_scales),
            bits(direct.block_scales),
            transposed.values.astype(jnp.float32),
            direct.values.astype(jnp.float32),
        )

    scales_t, scales_d, values_t, values_d = views(w)
    assert scales_t.shape == (1, 64, 3)
    np.testing.assert_array_equal(scales_t, scales_d)
    np.testing.assert_array_equal(values_t, values_d)


def test_matmul_applies_both_global_scales():
    a, b = gaussian(5, (1, 16, 32), jnp.float32), gaussian(6, (1, 8, 32), jnp.float32, scale=1e-3)

    @jit
    def products(a, b):
        qa, qb = numerics.quantize(a, "nvfp4"), numerics.quantize(b, "nvfp4")
        out = {
            backend: gemm.matmul(gemm.scaled_operand(qa), gemm.scaled_operand(qb), backend=backend)
            for backend in ("emulated", "native")
        }
        ref = jnp.einsum("brk,bsk->brs", qa.dequantize(), qb.dequantize(), precision="highest")
        return out, ref

    out, ref = products(a, b)
    for backend, got in out.items():
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(ref))), err_msg=backend)


def test_only_cudnn_block_scaled_configs_run_natively():
    a = jax.ShapeDtypeStruct((1, 32, 64), jnp.float32)

    def operand(fmt, **kwargs):
        return jax.eval_shape(lambda a: gemm.scaled_operand(numerics.quantize(a, fmt, **kwargs)), a)

    nvfp4, mxfp8 = operand("nvfp4"), operand("mxfp8", block=(1, 32))
    assert gemm.runs_natively(nvfp4, nvfp4) and gemm.runs_natively(mxfp8, mxfp8)
    assert not gemm.runs_natively(nvfp4, mxfp8)
    mxfp4, fp8 = operand("mxfp4", block=(1, 32)), operand("fp8_e4m3")
    assert not gemm.runs_natively(mxfp4, mxfp4) and not gemm.runs_natively(fp8, fp8)
    assert not gemm.runs_natively(nvfp4, jnp.ones((1, 32, 64)))
