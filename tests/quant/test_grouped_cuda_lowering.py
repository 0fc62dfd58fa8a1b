"""The expert GEMMs on a GPU, checked on a CPU: what an MoE layer's forward + backward lowers to for CUDA.

Like tests/quant/test_cuda_lowering.py (the dense layer): `lower(lowering_platforms=("cuda",))` needs no GPU.
On a GPU (`uses_ragged_dot`; forced here with `ragged=True`, since the path is chosen from the local device)
each of a quantized recipe's three expert GEMMs is one `chlo.ragged_dot` (cuBLAS's grouped GEMM) of
bfloat16 block-scaled values with float32 results: no loop over the experts, no branch per group size. XLA
has no block-scaled grouped GEMM (`jax.nn.scaled_matmul`, the custom call `__op$block_scaled_dot`, is a
dense batched product of static shapes, and `ragged_dot` takes no block scales), so the routed experts run
the emulated product on every backend, `native` included (fp4lm/quant/grouped.py says why), while the dense
layers of the same model (here the shared expert) take the block-scaled GEMM under `native`. The CPU's path,
a loop over the experts, is lowered too, to show that it is the one with the loops.
"""

import re
import types

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from fp4lm.config import ModelConfig
from fp4lm.linear_layers import block_linear_layers
from fp4lm.model.moe import MoE
from fp4lm.quant import Policy
from fp4lm.quant.grouped import grouped_dot, uses_ragged_dot

BLOCK_SCALED_DOT = "stablehlo.custom_call @__op$block_scaled_dot"
TOKENS, D_IN, D_OUT, GROUPS = 96, 64, 32, (40, 0, 56)
CFG = ModelConfig(
    num_layers=1,
    d_model=64,
    num_heads=2,
    num_kv_heads=1,
    mlp_dim=64,
    num_experts=4,
    experts_per_token=2,
    moe_mlp_dim=32,
    num_shared_experts=1,
)


def lowered_grouped(recipe: str, platform: str = "cuda", ragged: bool | None = None) -> str:
    def forward_backward(x, w, dy, group_sizes, key):
        y, vjp = jax.vjp(lambda a, b: grouped_dot(a, b, group_sizes, recipe, key=key, ragged=ragged), x, w)
        return (y, *vjp(dy))

    x = jnp.ones((TOKENS, D_IN), jnp.bfloat16)
    w = jnp.ones((len(GROUPS), D_IN, D_OUT), jnp.bfloat16)
    dy = jnp.ones((TOKENS, D_OUT), jnp.bfloat16)
    args = (x, w, dy, jnp.asarray(GROUPS, jnp.int32), jax.random.key(0))
    return jax.jit(forward_backward).trace(*args).lower(lowering_platforms=(platform,)).as_text()


def lowered_moe_layer(backend: str) -> str:
    layers = {}
    for layer in block_linear_layers(CFG, 0):
        module, projection = layer.name.split(".", 1)
        if module == "mlp":
            layers[projection] = layer
    policy = Policy("nvfp4", num_layers=1, backend=backend)
    graphdef, params = nnx.split(MoE(CFG, layers=layers, policy=policy, rngs=nnx.Rngs(0)), nnx.Param)

    def loss(params, x, key):
        return jnp.sum(jnp.square(nnx.merge(graphdef, params)(x, quant_key=key).astype(jnp.float32)))

    x = jnp.ones((2, 48, CFG.d_model), jnp.bfloat16)
    traced = jax.jit(jax.grad(loss, argnums=(0, 1))).trace(params, x, jax.random.key(0))
    return traced.lower(lowering_platforms=("cuda",)).as_text()


def dot_operand_types(text: str) -> set[tuple[str, str, str]]:
    """(lhs, rhs, result) element types of every stablehlo.dot_general."""
    found = set()
    for line in text.splitlines():
        if "stablehlo.dot_general" in line:
            types_ = re.findall(r"tensor<[0-9x]+x(\w+)>", line.split(":")[-1])
            found.add(tuple(types_[:3]))
    return found


def ragged_dot_types(text: str) -> list[tuple[str, ...]]:
    """(lhs, rhs, group sizes, result) element types of every chlo.ragged_dot."""
    lines = [line for line in text.splitlines() if '"chlo.ragged_dot"(' in line]
    return [tuple(re.findall(r"tensor<[0-9x]+x(\w+)>", line.rsplit(" : ", 1)[-1])) for line in lines]


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp8", "fp8"])
def test_on_a_gpu_each_expert_gemm_is_one_ragged_dot_without_a_loop(recipe):
    """fprop, dgrad and wgrad: three ragged dots of bf16 values into float32, and no while loop or case
    anywhere in the forward + backward (the quantizers and the group layout have none either)."""
    text = lowered_grouped(recipe, ragged=True)
    assert "stablehlo.while" not in text and "stablehlo.case" not in text
    assert BLOCK_SCALED_DOT not in text and "_scaled_matmul" not in text and "stablehlo.dot_general" not in text
    assert ragged_dot_types(text) == [("bf16", "bf16", "i32", "f32")] * 3


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp8"])
def test_on_a_cpu_the_expert_gemms_are_bf16_dots_in_loops(recipe):
    text = lowered_grouped(recipe, ragged=False)
    assert BLOCK_SCALED_DOT not in text and "_scaled_matmul" not in text and "ragged_dot" not in text
    # fprop and dgrad in a loop over chunks, wgrad in a loop over experts choosing a window length (a case)
    assert "stablehlo.while" in text and "stablehlo.case" in text
    assert dot_operand_types(text) == {("bf16", "bf16", "f32")}


def test_native_backend_on_an_moe_layer_keeps_the_experts_emulated():
    """Under `native` the shared expert's three projections (dense layers) run their three GEMMs each on the
    block-scaled GEMM; the routed experts add none, whatever the backend."""
    native, emulated = lowered_moe_layer("native"), lowered_moe_layer("emulated")
    assert BLOCK_SCALED_DOT in native  # one function per distinct signature: count the calls to them
    assert native.count("call @_scaled_matmul") == 3 * 3
    assert BLOCK_SCALED_DOT not in emulated and "_scaled_matmul" not in emulated


def test_bf16_experts_are_ragged_dot_only_where_it_is_native():
    """`jax.lax.ragged_dot` lowers to `chlo.ragged_dot` (cuBLAS grouped GEMM on a GPU); on a CPU XLA would run
    every expert on every token, so there the bf16 experts take the tiled path (decided from the local device,
    as `auto` is: this CPU host lowers the tiled path even for CUDA)."""
    assert uses_ragged_dot(types.SimpleNamespace(platform="gpu"))
    assert uses_ragged_dot(types.SimpleNamespace(platform="tpu"))
    assert not uses_ragged_dot(types.SimpleNamespace(platform="cpu"))
    assert ("ragged_dot" in lowered_grouped("bf16")) == uses_ragged_dot()  # this host's device decides
