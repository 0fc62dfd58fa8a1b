"""`precision.shared_weight_scale`: q/k/v (and gate/up) are quantized with one amax, so a run trains with the
global scale a serving engine's fused GEMM uses, and its NVFP4 export is the forward pass's codes, unchanged
(no re-quantization, bit for bit)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from fp4lm.config import ModelConfig
from fp4lm.export.nvfp4 import export_nvfp4
from fp4lm.export.nvfp4_weights import FUSED_GROUPS
from fp4lm.export.source import load_source
from fp4lm.hf import tensor_names
from fp4lm.model import Llama
from fp4lm.model.layers import apply_rope, rope_angles
from fp4lm.numerics import nvfp4, nvfp4_fused
from fp4lm.quant import Policy, dot
from fp4lm.quant.recipes import get_recipe
from tests.export import nvfp4_decoder
from tests.export.safetensors_reading import read_checkpoint
from tests.reliability.helpers_reliability import train_tiny_run

pytestmark = pytest.mark.slow


def _bits(x) -> np.ndarray:
    return np.asarray(x).view(np.uint8)


@pytest.mark.parametrize("block", [(16, 16), (1, 16)])
def test_a_shared_amax_codes_each_tensor_as_its_rows_of_the_stacked_tensor(block):
    keys = jax.random.split(jax.random.key(0), 2)
    small = jax.random.normal(keys[0], (32, 64)).astype(jnp.bfloat16)
    large = (3 * jax.random.normal(keys[1], (48, 64))).astype(jnp.bfloat16)
    stacked = nvfp4.quantize(jnp.concatenate([small, large]), block=block)
    parts = [nvfp4.quantize(w, block=block, tensor_amax=stacked.amax) for w in (small, large)]
    np.testing.assert_array_equal(np.concatenate([p.packed for p in parts]), stacked.packed)
    np.testing.assert_array_equal(np.concatenate([_bits(p.scales) for p in parts]), _bits(stacked.scales))
    assert all(p.amax == stacked.amax for p in parts)
    own = nvfp4.quantize(small, block=block)
    assert own.amax < stacked.amax and not np.array_equal(_bits(own.scales), _bits(parts[0].scales))
    # The fused quantizer of the emulated GEMM takes the same shared amax.
    values, amax = nvfp4_fused.quantize_block_scaled(small, block=block, tensor_amax=stacked.amax)
    np.testing.assert_array_equal(np.asarray(values), np.asarray(parts[0].block_scaled()))
    assert amax == stacked.amax


@pytest.mark.parametrize("recipe", ["nvfp4", "nvfp4_1d_weights"])
def test_the_dot_quantizes_w_and_its_transpose_with_the_given_amax(recipe):
    """Forward and dX use W's NVFP4 copies: with `weight_amax` they are those of W quantized with that amax,
    i.e. the dot equals the same dot on an input whose amax is the shared one (one entry raised to it, in a
    row the probe does not read)."""
    keys = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(keys[0], (32, 64)).astype(jnp.bfloat16)
    w = jax.random.normal(keys[1], (64, 48)).astype(jnp.bfloat16)
    shared = jnp.float32(8.0)  # above max |w|
    layer = dot.dot_general(recipe)
    dims = (((1,), (0,)), ((), ()))

    def loss(x, w, amax):
        return jnp.sum(layer(x, w, dims, preferred_element_type=jnp.float32, key=keys[2], weight_amax=amax) ** 2)

    y_shared = layer(x, w, dims, preferred_element_type=jnp.float32, weight_amax=shared)
    y_own = layer(x, w, dims, preferred_element_type=jnp.float32)
    assert not np.array_equal(np.asarray(y_shared), np.asarray(y_own))
    # The reference: quantize W with the shared amax by hand, dequantize, multiply exactly.
    spec = get_recipe(recipe).fprop_w
    w_hat = np.asarray(dot.quantize_operand(w.T[None], spec, None, shared).dequantize())[0].T
    x_hat = np.asarray(dot.quantize_operand(x[None], get_recipe(recipe).fprop_x, None).dequantize())[0]
    np.testing.assert_allclose(np.asarray(y_shared), x_hat @ w_hat, rtol=1e-5, atol=1e-5)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w, shared)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
    assert jax.grad(loss, argnums=2)(x, w, shared) == 0  # the amax is a statistic, not a parameter


def _amax(*layers) -> jax.Array:
    """max |W| over the layers' bfloat16 weights, by NumPy."""
    return jnp.float32(max(np.abs(np.asarray(layer.weight(), np.float32)).max() for layer in layers))


def test_attention_and_mlp_give_each_fused_group_one_amax():
    cfg = ModelConfig(num_layers=1, d_model=64, num_heads=4, num_kv_heads=2, mlp_dim=128, init_std=0.05)
    models = {
        flag: Llama(cfg, 96, Policy("nvfp4", num_layers=1, shared_weight_scale=flag), rngs=nnx.Rngs(0))
        for flag in (False, True)
    }
    tokens = jax.random.randint(jax.random.key(2), (2, 32), 0, 96)
    assert not np.array_equal(np.asarray(models[True](tokens)), np.asarray(models[False](tokens)))
    # Each projection of the shared model is what it gives with its group's amax passed by hand.
    attn, mlp = models[True].blocks[0].attn, models[True].blocks[0].mlp
    x = jax.random.normal(jax.random.key(3), (2, 32, 64)).astype(jnp.bfloat16)
    qkv_amax = _amax(attn.q, attn.k, attn.v)
    angles = rope_angles(jnp.arange(32), attn.head_dim, attn.rope_theta)
    q, k, v = attn.rotated_qkv(x, jnp.arange(32))
    expected_q = apply_rope(attn.q(x, weight_amax=qkv_amax).reshape(q.shape), angles)
    expected_k = apply_rope(attn.k(x, weight_amax=qkv_amax).reshape(k.shape), angles)
    expected_v = attn.v(x, weight_amax=qkv_amax).reshape(v.shape)
    for got, expected in ((q, expected_q), (k, expected_k), (v, expected_v)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
    gate_up_amax = _amax(mlp.gate, mlp.up)
    gate, up = mlp.gate(x, weight_amax=gate_up_amax), mlp.up(x, weight_amax=gate_up_amax)
    hidden = (jax.nn.silu(gate.astype(jnp.float32)) * up.astype(jnp.float32)).astype(jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(mlp(x)), np.asarray(mlp.down(hidden)))
    # and a member whose own amax is below the group's is quantized differently than on its own
    smallest = min((attn.q, attn.k, attn.v), key=lambda layer: float(_amax(layer)))
    assert not np.array_equal(np.asarray(smallest(x, weight_amax=qkv_amax)), np.asarray(smallest(x)))


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared_scale_run")
    run_dir = train_tiny_run(
        root,
        "model.num_layers=2",
        "train.steps=3",
        "checkpoint.every=3",
        "checkpoint.async_save=false",
        "eval.batches=0",
        "precision.shared_weight_scale=true",
    )
    return load_source(str(run_dir))


def test_the_nvfp4_export_of_a_shared_scale_run_is_the_forward_pass_codes(shared_run, tmp_path, capsys):
    source = shared_run
    assert source.policy.shared_weight_scale
    export_nvfp4(source, tmp_path, layout="modelopt", log=print)
    assert "re-quantized" not in capsys.readouterr().out
    tensors = read_checkpoint(tmp_path)
    cfg = source.config.model
    kernels = dict(tensor_names.block_projection_kernels(source.params, cfg))
    for index in range(cfg.num_layers):
        for group in FUSED_GROUPS:
            paths = [f"blocks.{index}.{name}" for name in group]
            weights = {p: kernels[p].astype(ml_dtypes.bfloat16).T for p in paths}  # W [out, in] as the forward
            group_amax = np.float32(max(np.abs(w.astype(np.float32)).max() for w in weights.values()))
            for path, weight in weights.items():
                module = tensor_names.hf_module(path)
                spec = source.policy.recipe_for(path).fprop_w
                amax = group_amax if len(group) > 1 else None
                trained = dot.quantize_operand(jnp.asarray(weight)[None], spec, None, amax)
                np.testing.assert_array_equal(tensors[f"{module}.weight"], np.asarray(trained.packed)[0])
                np.testing.assert_array_equal(_bits(tensors[f"{module}.weight_scale"]), _bits(trained.scales)[0])
                decoded = nvfp4_decoder.decode_modelopt(
                    *(tensors[f"{module}.{n}"] for n in ("weight", "weight_scale", "weight_scale_2"))
                )
                expected = np.asarray(trained.dequantize())[0]
                np.testing.assert_array_equal(decoded.view(np.uint32), expected.view(np.uint32), err_msg=path)
