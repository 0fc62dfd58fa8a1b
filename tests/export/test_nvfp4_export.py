"""`fp4lm export --format nvfp4 | nvfp4-ct`: decoded with an independent decoder (nvfp4_decoder.py), the
ModelOpt export equals, bit for bit, the weights fp4lm's forward pass multiplied by; the compressed-tensors
export is within the documented bound of them; fused groups share one global scale."""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from fp4lm.export.nvfp4 import export_nvfp4
from fp4lm.export.nvfp4_weights import FUSED_GROUPS
from fp4lm.export.source import load_source
from fp4lm.hf import tensor_names
from fp4lm.quant import dot
from tests.export import nvfp4_decoder
from tests.export.safetensors_reading import read_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def source(trained_run):
    return load_source(str(trained_run))


def kernel_of(source, path: str) -> np.ndarray:
    index, name = path.split(".", 2)[1:]
    module, projection = name.split(".")
    return source.params["blocks"][int(index)][module][projection]["kernel"]


@functools.partial(jax.jit, static_argnums=1)
def forward_operands(w3, spec):
    """For W [1, out, in] (bf16), what the forward pass builds for the fprop GEMM: the quantized copy training
    saves for the backward pass (codes, scales, amax), and the operand the emulated GEMM multiplies."""
    return dot.quantize_operand(w3, spec, None), dot.gemm_input(w3, spec, None, "emulated")


@functools.partial(jax.jit, static_argnums=0)
def _probe(layer_dot, identity, kernel):
    return layer_dot(identity, kernel, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def forward_weights(source, path: str) -> np.ndarray:
    """The weight `[out, in]` as the layer's own quantized dot_general applies it, probed with the identity as
    activations (an identity quantizes exactly: each row's only nonzero is 1, its block's amax)."""
    kernel = kernel_of(source, path)
    identity = jnp.eye(kernel.shape[0], dtype=jnp.bfloat16)
    return np.asarray(_probe(source.policy.dot_general_for(path), identity, jnp.asarray(kernel, jnp.bfloat16))).T


def _with_shared_amax(source):
    """The run with one entry of every kernel of a fused group set to the same largest value, so every
    group's members already share their amax: the export must then be the forward pass's codes, unchanged."""
    params = {**source.params}
    params["blocks"] = {
        i: {
            **b,
            "attn": {n: {"kernel": p["kernel"].copy()} for n, p in b["attn"].items()},
            "mlp": {n: {"kernel": p["kernel"].copy()} for n, p in b["mlp"].items()},
        }
        for i, b in source.params["blocks"].items()
    }
    for block in params["blocks"].values():
        for module in ("attn", "mlp"):
            for layer in block[module].values():
                layer["kernel"][0, 0] = 0.5
    return dataclasses.replace(source, params=params)


def _paths(source):
    return [path for path, _ in tensor_names.block_projection_kernels(source.params, source.config.model)]


def test_modelopt_export_decodes_bit_for_bit_to_the_forward_weights(source, tmp_path):
    shared = _with_shared_amax(source)
    export_nvfp4(shared, tmp_path, layout="modelopt", log=print)
    tensors = read_checkpoint(tmp_path)
    for path in _paths(shared):
        module = tensor_names.hf_module(path)
        weight, scale, scale_2 = (tensors[f"{module}.{n}"] for n in ("weight", "weight_scale", "weight_scale_2"))
        kernel = kernel_of(shared, path)
        out_features, in_features = kernel.shape[1], kernel.shape[0]
        assert weight.dtype == np.uint8 and weight.shape == (out_features, in_features // 2)
        assert scale.dtype == ml_dtypes.float8_e4m3fn and scale.shape == (out_features, in_features // 16)
        assert scale_2.dtype == np.float32 and scale_2.shape == ()
        # What the forward pass builds for this layer's fprop GEMM (W [1, out, in] from the bf16 kernel):
        spec = shared.policy.recipe_for(path).fprop_w
        trained, operand = forward_operands(jnp.asarray(kernel, jnp.bfloat16).T[None], spec)
        np.testing.assert_array_equal(weight, np.asarray(trained.packed)[0], err_msg=path)
        np.testing.assert_array_equal(scale.view(np.uint8), np.asarray(trained.scales)[0].view(np.uint8))
        block_scaled = nvfp4_decoder.block_scaled(weight, scale)
        np.testing.assert_array_equal(block_scaled, np.asarray(operand.values, np.float32)[0], err_msg=path)
        assert scale_2.view(np.uint32) == np.asarray(operand.global_scale).view(np.uint32)
        decoded = nvfp4_decoder.decode_modelopt(weight, scale, scale_2)
        np.testing.assert_array_equal(decoded.view(np.uint32), np.asarray(trained.dequantize())[0].view(np.uint32))
        # End to end through the layer's own dot_general: the GEMM applies the global scales after its float32
        # sum, so the probe is within one ulp of the decoded weight (and shows the layout is not transposed).
        probe = forward_weights(shared, path)
        assert np.abs((decoded + 0.0).view(np.int32) - (probe + 0.0).view(np.int32)).max() <= 1, path


def test_modelopt_files_fused_groups_and_exclusions(source, tmp_path, capsys):
    export_nvfp4(source, tmp_path, layout="modelopt", log=print)
    printed = capsys.readouterr().out
    tensors = read_checkpoint(tmp_path)
    for index in range(source.config.model.num_layers):
        for group in FUSED_GROUPS:
            modules = [tensor_names.hf_module(f"blocks.{index}.{name}") for name in group]
            assert len({float(tensors[f"{m}.weight_scale_2"]) for m in modules}) == 1, modules
    # The member of a fused group with the group's amax, and o and down (groups of one), keep the forward
    # pass's codes; the others are re-quantized, and the export says so with the relative change.
    exact = differing = 0
    for path in _paths(source):
        module = tensor_names.hf_module(path)
        spec = source.policy.recipe_for(path).fprop_w
        trained, _ = forward_operands(jnp.asarray(kernel_of(source, path), jnp.bfloat16).T[None], spec)
        same = np.array_equal(tensors[f"{module}.weight"], np.asarray(trained.packed)[0])
        exact, differing = exact + same, differing + (not same)
    assert exact >= 4 * source.config.model.num_layers and differing >= 1
    assert "re-quantized blocks.0.attn.q, blocks.0.attn.k, blocks.0.attn.v with their shared amax" in printed
    assert "relative change of the weights" in printed
    quant = json.loads((tmp_path / "hf_quant_config.json").read_text())["quantization"]
    assert quant["quant_algo"] == "W4A16_NVFP4" and quant["group_size"] == 16 and quant["kv_cache_quant_algo"] is None
    assert {"lm_head", "model.embed_tokens"} <= set(quant["exclude_modules"])
    config = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "modelopt" and config["quant_algo"] == "W4A16_NVFP4"
    assert tensors["model.embed_tokens.weight"].dtype == ml_dtypes.bfloat16
    assert tensors["lm_head.weight"].dtype == ml_dtypes.bfloat16


def test_compressed_tensors_export_is_within_two_ulps_of_the_forward_weights(source, tmp_path):
    shared = _with_shared_amax(source)
    for name, layout in (("ct", "compressed-tensors"), ("mo", "modelopt")):
        (tmp_path / name).mkdir()
        export_nvfp4(shared, tmp_path / name, layout=layout, log=print)
    ct, mo = read_checkpoint(tmp_path / "ct"), read_checkpoint(tmp_path / "mo")
    for path in _paths(shared):
        module = tensor_names.hf_module(path)
        np.testing.assert_array_equal(ct[f"{module}.weight_packed"], mo[f"{module}.weight"])
        np.testing.assert_array_equal(
            ct[f"{module}.weight_scale"].view(np.uint8), mo[f"{module}.weight_scale"].view(np.uint8)
        )
        global_scale = ct[f"{module}.weight_global_scale"]
        assert global_scale.dtype == np.float32 and global_scale.shape == (1,)
        decoded = nvfp4_decoder.decode_compressed_tensors(
            *(ct[f"{module}.{n}"] for n in ("weight_packed", "weight_scale", "weight_global_scale"))
        )
        spec = shared.policy.recipe_for(path).fprop_w
        trained, _ = forward_operands(jnp.asarray(kernel_of(shared, path), jnp.bfloat16).T[None], spec)
        expected = np.asarray(trained.dequantize())[0]  # fp4lm's values
        ulps = np.abs(decoded.view(np.int32).astype(np.int64) - expected.view(np.int32).astype(np.int64))
        assert ulps.max() <= 2, (path, ulps.max())
    config = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "nvfp4-pack-quantized"
    weights = config["config_groups"]["group_0"]["weights"]
    assert (weights["strategy"], weights["group_size"], weights["type"], weights["num_bits"]) == (
        "tensor_group",
        16,
        "float",
        4,
    )
    assert config["config_groups"]["group_0"]["input_activations"] is None
    assert "lm_head" in config["ignore"]


def test_the_reciprocal_global_scale_bound_on_every_code_and_scale():
    """For every E2M1 magnitude x positive E4M3 scale and 4000 tensor amaxes over 10 decades: 1/(2688/amax)
    is within one float32 ulp of amax/2688, and the decoded value within two ulps of fp4lm's (e2m1·s)·(amax/2688)
    (two roundings on each side: the bound is reached, so two is the honest figure)."""
    e2m1 = np.array([0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
    scales = np.arange(1, 127, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    products = (e2m1[:, None] * scales[None, :]).reshape(-1)
    amaxes = np.exp(np.random.default_rng(0).uniform(np.log(1e-6), np.log(1e4), 4000)).astype(np.float32)
    worst_scale = worst_value = 0
    for amax in amaxes:
        decode = np.float32(amax) / np.float32(2688)
        global_scale = np.float32(2688) / np.float32(amax)
        recovered = np.float32(1) / global_scale
        worst_scale = max(worst_scale, abs(int(recovered.view(np.int32)) - int(decode.view(np.int32))))
        ours = products * decode
        theirs = products / global_scale
        worst_value = max(worst_value, int(np.abs(ours.view(np.int32) - theirs.view(np.int32)).max()))
    assert worst_scale <= 1
    assert worst_value <= 2
