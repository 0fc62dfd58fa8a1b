"""Dropless routing never builds a [tokens x experts x d_model] tensor, checked on the programs XLA
runs: the MoE layer's forward + backward, lowered (StableHLO) and compiled (optimized HLO), has no array of
that many elements; a dense dispatch (one-hot tokens to every expert), lowered the same way, has one."""

import math
import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from fp4lm.config import ModelConfig
from fp4lm.linear_layers import block_linear_layers
from fp4lm.model.moe import MoE
from fp4lm.quant import Policy
from tests.quant.fake_quant import FAST_COMPILE

# d_model = moe_mlp_dim, so no weight or per-row buffer comes near tokens * experts * d_model by accident.
CFG = ModelConfig(
    num_layers=1,
    d_model=32,
    num_heads=2,
    num_kv_heads=1,
    mlp_dim=64,
    num_experts=8,
    experts_per_token=2,
    moe_mlp_dim=32,
    num_shared_experts=1,
)
BATCH, SEQ = 2, 64
LIMIT = BATCH * SEQ * CFG.num_experts * CFG.d_model  # elements of one [tokens, experts, d_model] tensor

_STABLEHLO_TYPE = re.compile(r"tensor<((?:\d+x)+)\w+>")
_HLO_SHAPE = re.compile(r"\b(?:pred|[subf]\d+|bf16|f8\w*)\[([\d,]+)\]")


def largest_array(text: str) -> int:
    """The most elements of any array type in a StableHLO or HLO module's text."""
    sizes = [math.prod(int(d) for d in dims.rstrip("x").split("x")) for dims in _STABLEHLO_TYPE.findall(text)]
    sizes += [math.prod(int(d) for d in dims.split(",")) for dims in _HLO_SHAPE.findall(text)]
    return max(sizes)


def moe_layer(recipe: str) -> MoE:
    layers = {}
    for layer in block_linear_layers(CFG, 0):
        module, projection = layer.name.split(".", 1)
        if module == "mlp":
            layers[projection] = layer
    return MoE(CFG, layers=layers, policy=Policy(recipe, num_layers=1), rngs=nnx.Rngs(0))


def programs(loss, *args) -> tuple[str, str]:
    """(StableHLO, optimized HLO) of jit(grad(loss)) over its first two arguments."""
    lowered = jax.jit(jax.grad(loss, argnums=(0, 1)), compiler_options=FAST_COMPILE).lower(*args)
    return lowered.as_text(), lowered.compile().as_text()


def x_and_key():
    return jax.random.normal(jax.random.key(1), (BATCH, SEQ, CFG.d_model), jnp.bfloat16), jax.random.key(2)


@pytest.mark.parametrize("recipe", ["bf16", "nvfp4"])
def test_moe_forward_backward_has_no_tokens_x_experts_x_d_model_array(recipe):
    graphdef, params = nnx.split(moe_layer(recipe), nnx.Param)

    def loss(params, x, key):
        return jnp.sum(jnp.square(nnx.merge(graphdef, params)(x, quant_key=key).astype(jnp.float32)))

    for text in programs(loss, params, *x_and_key()):
        assert largest_array(text) < LIMIT


def test_a_dense_dispatch_is_caught():
    """The check can fail: every token sent to every expert (one-hot, as a naive MoE does) makes the array."""
    moe = moe_layer("bf16")
    params = {"router": moe.router[...], "w": moe.up.kernel[...][:, :, : CFG.d_model]}

    def dense_dispatch(params, x, key):
        del key
        x_ND = x.reshape(-1, CFG.d_model).astype(jnp.float32)
        _, experts_NK = jax.lax.top_k(x_ND @ params["router"], CFG.experts_per_token)
        onehot_NX = jax.nn.one_hot(experts_NK, CFG.num_experts).sum(1)
        dispatched_NXD = onehot_NX[:, :, None] * x_ND[:, None, :]
        return jnp.sum(jnp.einsum("nxd,xde->ne", dispatched_NXD, params["w"]) ** 2)

    lowered, compiled = programs(dense_dispatch, params, *x_and_key())
    assert largest_array(lowered) >= LIMIT
    assert largest_array(compiled) >= LIMIT
