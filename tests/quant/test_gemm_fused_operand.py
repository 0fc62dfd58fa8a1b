"""The emulated GEMM's fused NVFP4 operands (dot.gemm_input) give the same bits as quantized arrays.

`gemm_input` quantizes an operand that feeds one GEMM straight into bf16 `e2m1 · s_b` values; the
reference below is the path it replaces (quantize to an NVFP4Array, view it as a ScaledOperand).
Forward outputs and both gradients of every nvfp4 recipe must be bit-identical, and what the forward
pass saves for the backward must still be the packed arrays.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lm import numerics
from fp4lm.numerics import nvfp4
from fp4lm.quant import RECIPES, dot, dot_general, gemm
from tests.quant.fake_quant import LINEAR_DIMS, gaussian_layer, quantized_linear

pytestmark = pytest.mark.slow

# nvfp4_bwd_dequantized saves both forward operands quantized, so none of its operands takes the fused path.
NVFP4_RECIPES = [name for name in RECIPES if name.startswith("nvfp4") and name != "nvfp4_bwd_dequantized"]


def _unfused_gemm_input(x, spec, key, backend, tensor_amax=None):
    del backend
    return dot.gemm_operand(dot.quantize_operand(x, spec, key, tensor_amax))


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint16 if x.dtype == jnp.bfloat16 else np.uint32)


@pytest.mark.parametrize(
    ("block", "rounding", "hadamard", "nvfp4_options"),
    [
        ((1, 16), "nearest", False, nvfp4.PLAIN),
        ((16, 16), "nearest", False, nvfp4.PLAIN),
        ((1, 16), "stochastic", True, nvfp4.PLAIN),
        ((1, 16), "stochastic", True, nvfp4.Options(row_scaled=True)),
        ((16, 16), "nearest", False, nvfp4.Options(four_over_six="mse", e4m3_max=256)),
    ],
)
def test_fused_operand_equals_the_quantized_array_view(block, rounding, hadamard, nvfp4_options):
    x = jax.random.normal(jax.random.key(0), (2, 32, 64)) * 5
    key = jax.random.key(3) if rounding == "stochastic" else None
    options = dict(block=block, rounding=rounding, key=key, hadamard=hadamard)
    fused = gemm.nvfp4_block_scaled_operand(x, **options, options=nvfp4_options)
    viewed = gemm.scaled_operand(numerics.quantize(x, "nvfp4", **options, nvfp4_options=nvfp4_options))
    assert fused.block_scales is None and fused.values.dtype == jnp.bfloat16
    np.testing.assert_array_equal(_bits(fused.values), _bits(gemm._bf16_values(viewed)))
    np.testing.assert_array_equal(_bits(fused.global_scale), _bits(viewed.global_scale))


@pytest.mark.parametrize("recipe", NVFP4_RECIPES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_dot_outputs_and_gradients_are_bit_identical(recipe, dtype, monkeypatch):
    x, kernel, dy = gaussian_layer(5, 64, 48, 32, dtype)
    key = jax.random.key(11)
    calls = []
    fused_operand = gemm.nvfp4_block_scaled_operand
    monkeypatch.setattr(gemm, "nvfp4_block_scaled_operand", lambda *a, **k: calls.append(1) or fused_operand(*a, **k))
    fn = dot_general(recipe, backend="emulated")
    fused = quantized_linear(fn, x, kernel, dy, key)
    assert calls, "the fused path was not taken"
    monkeypatch.setattr(dot, "gemm_input", _unfused_gemm_input)
    monkeypatch.setattr(gemm, "nvfp4_block_scaled_operand", None)  # the reference must not reach it
    reference = quantized_linear(dot_general(recipe, backend="emulated", name="unfused"), x, kernel, dy, key)
    for got, want in zip(fused, reference, strict=True):
        np.testing.assert_array_equal(_bits(got), _bits(want))


def test_the_saved_residuals_are_still_packed_arrays():
    x, kernel, _ = gaussian_layer(5, 64, 48, 32, jnp.bfloat16)
    fn = dot_general("nvfp4", backend="emulated")
    _, residuals = jax.vjp(lambda a, b: fn(a, b, LINEAR_DIMS, key=jax.random.key(1)), x, kernel)
    leaves = jax.tree_util.tree_leaves(residuals)
    assert {str(leaf.dtype) for leaf in leaves if leaf.ndim >= 2} <= {"uint8", "float8_e4m3fn"}
