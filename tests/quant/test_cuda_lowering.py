"""The GPU path, checked on a CPU: a quantized linear layer lowered for CUDA (forward + backward).

`jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))` needs no GPU. Lowered for CUDA, jax's
`scaled_matmul` becomes cuDNN's block-scaled GEMM, `stablehlo.custom_call @__op$block_scaled_dot`
(lowered for CPU it is a decomposition with no custom call, so counting `call @_scaled_matmul`
cannot tell the two apart). The native backend must put each of the layer's quantized GEMMs there,
on narrow operands; the emulated backend, and recipes the GEMM does not support, must not.
"""

import re
import types

import jax
import jax.numpy as jnp
import pytest

from fp4lm.quant import dot_general, gemm
from tests.quant.fake_quant import LINEAR_DIMS, gaussian_layer

BLOCK_SCALED_DOT = "stablehlo.custom_call @__op$block_scaled_dot"
M, K, N = 96, 64, 32  # tokens, features in, features out: distinct, so each GEMM has its own shapes


def linear_forward_backward(dot, x, kernel, dy, key):
    y, vjp = jax.vjp(lambda a, b: dot(a, b, LINEAR_DIMS, key=key), x, kernel)
    return (y, *vjp(dy.astype(y.dtype)))


def lowered(recipe, backend, platform="cuda"):
    x, kernel, dy = gaussian_layer(3, M, K, N, jnp.bfloat16)
    traced = jax.jit(linear_forward_backward, static_argnums=0).trace(
        dot_general(recipe, backend=backend), x, kernel, dy, jax.random.key(0)
    )
    return traced.lower(lowering_platforms=(platform,)).as_text()


def block_scaled_operands(text):
    """Operand types of every block-scaled GEMM: the signature of the function holding the custom call."""
    functions = re.split(r"\n\s*func\.func ", text)
    found = []
    for function in functions:
        for _ in range(function.count(BLOCK_SCALED_DOT)):
            signature = function.split("{", 1)[0]
            found.append(tuple(re.findall(r"tensor<([0-9x]+)x(\w+)>", signature)))
    return found


# The three GEMMs as (data shape, scale shape) pairs of both operands, for blocks of `block` along K.
def expected_operands(block, data_type, scale_type):
    gemms = [((M, K), (N, K)), ((M, N), (K, N)), ((N, M), (K, M))]  # fprop, dgrad, wgrad (TN layout)
    out = set()
    for (ra, ka), (rb, kb) in gemms:
        data = [(f"1x{ra}x{ka}", data_type), (f"1x{rb}x{kb}", data_type)]
        scales = [(f"1x{ra}x{ka // block}", scale_type), (f"1x{rb}x{kb // block}", scale_type)]
        out.add(tuple(data + scales + [(f"1x{ra}x{rb}", "f32")]))
    return out


@pytest.mark.parametrize("recipe", ["nvfp4", "nvfp4_no_rht", "nvfp4_1d_weights"])
def test_native_nvfp4_runs_all_three_gemms_on_fp4_tensor_cores(recipe):
    text = lowered(recipe, "native")
    assert text.count(BLOCK_SCALED_DOT) == 3
    assert set(block_scaled_operands(text)) == expected_operands(16, "f4E2M1FN", "f8E4M3FN")


def test_native_mxfp8_uses_e8m0_scales():
    text = lowered("mxfp8", "native")
    assert text.count(BLOCK_SCALED_DOT) == 3
    assert set(block_scaled_operands(text)) == expected_operands(32, "f8E4M3FN", "f8E8M0FNU")


def test_forward_only_recipe_has_one_block_scaled_gemm():
    text = lowered("nvfp4_fwd_only", "native")
    assert text.count(BLOCK_SCALED_DOT) == 1
    assert set(block_scaled_operands(text)) <= expected_operands(16, "f4E2M1FN", "f8E4M3FN")


@pytest.mark.parametrize(
    "recipe,backend",
    [("nvfp4", "emulated"), ("mxfp8", "emulated"), ("mxfp4", "native"), ("fp8", "native"), ("bf16", "native")],
)
def test_no_block_scaled_gemm_where_the_hardware_path_is_not_taken(recipe, backend):
    """Emulated runs bf16 x bf16 -> f32 dots; MXFP4 and per-tensor FP8 have no native configuration."""
    text = lowered(recipe, backend)
    assert BLOCK_SCALED_DOT not in text and "_scaled_matmul" not in text
    assert "stablehlo.dot_general" in text


def test_cpu_lowering_of_the_native_path_has_no_custom_call():
    """What the old test counted (`call @_scaled_matmul`) is the same on both platforms; the custom call
    is what separates them."""
    cuda, cpu = lowered("nvfp4", "native", "cuda"), lowered("nvfp4", "native", "cpu")
    assert cuda.count("call @_scaled_matmul") == cpu.count("call @_scaled_matmul") == 3
    assert BLOCK_SCALED_DOT not in cpu


def test_auto_takes_the_local_device_not_the_lowering_platform():
    """`auto` is decided when tracing, from the local device: on this CPU it is the emulated path."""
    assert BLOCK_SCALED_DOT not in lowered("nvfp4", "auto")


def fake_gpu(capability):
    return types.SimpleNamespace(platform="gpu", compute_capability=capability, device_kind=f"sm_{capability}")


@pytest.mark.parametrize(
    "device,want",
    [
        (fake_gpu("9.0"), "emulated"),  # H100 / H200: FP8 tensor cores, no FP4
        (fake_gpu("8.0"), "emulated"),
        (fake_gpu("10.0"), "native"),  # B200 / GB200
        (fake_gpu("10.3"), "native"),  # B300
        (fake_gpu("12.0"), "native"),  # RTX Blackwell
        (types.SimpleNamespace(platform="gpu", compute_capability=None), "emulated"),
        (types.SimpleNamespace(platform="gpu"), "emulated"),  # e.g. ROCm: no compute_capability
        (types.SimpleNamespace(platform="cpu"), "emulated"),
        (types.SimpleNamespace(platform="tpu"), "emulated"),
    ],
)
def test_auto_is_native_only_from_compute_capability_10(device, want):
    assert gemm.resolve_backend("auto", device) == want
    assert gemm.resolve_backend("emulated", device) == "emulated"
    assert gemm.resolve_backend("native", device) == "native"
