"""`fp4lm export --format nvfp4 | nvfp4-ct` of a mixture-of-experts run: every expert's weights are the forward
pass's own codes and scales, one tensor per expert under the Qwen3-MoE (or Mixtral) names that ModelOpt's and
compressed-tensors' MoE checkpoints use; an expert's gate and up share one global scale (served fused); the
router and the norms stay bfloat16 and are listed as excluded."""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lm.config import ModelConfig
from fp4lm.export import calibration
from fp4lm.export.nvfp4 import export_nvfp4
from fp4lm.export.source import load_source
from fp4lm.hf import tensor_names
from fp4lm.quant import dot
from tests.export import nvfp4_decoder
from tests.export.safetensors_reading import read_checkpoint

pytestmark = pytest.mark.slow

ARCHITECTURE = "Qwen3MoeForCausalLM"


@pytest.fixture(scope="module")
def source(moe_run):
    return load_source(str(moe_run))


@functools.partial(jax.jit, static_argnums=1)
def forward_operands(w3, spec, amax):
    """What the grouped GEMM builds for an expert's fprop W [1, out, in] with the given (shared) amax: the
    quantized copy and the operand the emulated GEMM multiplies (grouped._weight_operand's per-expert call)."""
    return dot.quantize_operand(w3, spec, None, amax), dot.gemm_input(w3, spec, None, "emulated", amax)


def _experts(source):
    mlp = source.params["blocks"][1]["mlp"]
    return {name: mlp[name]["kernel"] for name in ("gate", "up", "down")}


def test_each_expert_is_the_forward_passs_own_codes_with_gate_and_up_sharing_a_scale(source, tmp_path):
    lines = []
    export_nvfp4(source, tmp_path, layout="modelopt", log=lines.append)
    assert not any("re-quantized" in line for line in lines)  # shared_weight_scale: nothing quantized again
    tensors = read_checkpoint(tmp_path)
    kernels = _experts(source)
    spec = source.policy.recipe_for("blocks.1.mlp.experts.gate").fprop_w
    bf16 = {name: jnp.asarray(k, jnp.bfloat16) for name, k in kernels.items()}
    for expert in range(source.config.model.num_experts):
        gate_up_amax = jnp.maximum(*(jnp.abs(bf16[n][expert]).max().astype(jnp.float32) for n in ("gate", "up")))
        for name in ("gate", "up", "down"):
            module = tensor_names.expert_module(f"blocks.1.mlp.experts.{name}", expert, ARCHITECTURE)
            assert module == f"model.layers.1.mlp.experts.{expert}.{name}_proj"
            weight, scale, scale_2 = (tensors[f"{module}.{n}"] for n in ("weight", "weight_scale", "weight_scale_2"))
            amax = None if name == "down" else gate_up_amax
            trained, operand = forward_operands(bf16[name][expert].T[None], spec, amax)
            np.testing.assert_array_equal(weight, np.asarray(trained.packed)[0], err_msg=module)
            np.testing.assert_array_equal(scale.view(np.uint8), np.asarray(trained.scales)[0].view(np.uint8))
            block_scaled = nvfp4_decoder.block_scaled(weight, scale)
            np.testing.assert_array_equal(block_scaled, np.asarray(operand.values, np.float32)[0], err_msg=module)
            assert scale_2.view(np.uint32) == np.asarray(operand.global_scale).view(np.uint32)
        gate, up = (
            tensor_names.expert_module(f"blocks.1.mlp.experts.{n}", expert, ARCHITECTURE) for n in ("gate", "up")
        )
        assert tensors[f"{gate}.weight_scale_2"] == tensors[f"{up}.weight_scale_2"]
    router = tensors["model.layers.1.mlp.gate.weight"]
    assert router.dtype.name == "bfloat16" and router.shape == (4, source.config.model.d_model)
    assert tensors["model.layers.1.self_attn.q_norm.weight"].dtype.name == "bfloat16"
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURE]
    excluded = config["quantization_config"]["exclude_modules"]
    assert "model.layers.1.mlp.gate" in excluded  # the router, a Linear to transformers and vLLM, stays bf16
    assert not any(".experts." in module for module in excluded)


def test_without_shared_scales_each_experts_gate_and_up_are_quantized_again_together(source, tmp_path):
    policy = dataclasses.replace(source.quantized_policy, shared_weight_scale=False)
    lines = []
    export_nvfp4(dataclasses.replace(source, quantized_policy=policy), tmp_path, layout="modelopt", log=lines.append)
    requantized = [line for line in lines if line.startswith("re-quantized blocks.1.mlp.experts.gate.")]
    assert requantized and all("blocks.1.mlp.experts.up." in line for line in requantized)
    tensors = read_checkpoint(tmp_path)
    for expert in range(source.config.model.num_experts):
        gate, up = (
            tensor_names.expert_module(f"blocks.1.mlp.experts.{n}", expert, ARCHITECTURE) for n in ("gate", "up")
        )
        assert tensors[f"{gate}.weight_scale_2"] == tensors[f"{up}.weight_scale_2"]


def test_the_compressed_tensors_moe_export_holds_the_same_codes(source, tmp_path):
    for name, layout in (("ct", "compressed-tensors"), ("mo", "modelopt")):
        (tmp_path / name).mkdir()
        export_nvfp4(source, tmp_path / name, layout=layout, log=lambda line: None)
    ct, mo = read_checkpoint(tmp_path / "ct"), read_checkpoint(tmp_path / "mo")
    modules = [name.removesuffix(".weight_packed") for name in ct if name.endswith(".weight_packed")]
    assert sum(".experts." in m for m in modules) == 3 * source.config.model.num_experts
    for module in modules:
        np.testing.assert_array_equal(ct[f"{module}.weight_packed"], mo[f"{module}.weight"])
        decoded = nvfp4_decoder.decode_compressed_tensors(
            *(ct[f"{module}.{n}"] for n in ("weight_packed", "weight_scale", "weight_global_scale"))
        )
        exact = nvfp4_decoder.decode_modelopt(
            *(mo[f"{module}.{n}"] for n in ("weight", "weight_scale", "weight_scale_2"))
        )
        ulps = np.abs(decoded.view(np.int32).astype(np.int64) - exact.view(np.int32).astype(np.int64))
        assert ulps.max() <= 2, module
    ignore = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]["ignore"]
    assert {"lm_head", "model.layers.1.mlp.gate"} <= set(ignore)
    assert not any(".experts." in module for module in ignore)


def test_w4a4_gives_each_expert_its_own_input_scale_shared_by_its_gate_and_up(source, tmp_path):
    amax = calibration.input_amaxes(source, 1)
    experts = source.config.model.num_experts
    gate = [amax[f"blocks.1.mlp.experts.gate.{e}"] for e in range(experts)]
    assert gate == [amax[f"blocks.1.mlp.experts.up.{e}"] for e in range(experts)]  # one fused GEMM per expert
    assert len(set(gate)) > 1  # each expert's own tokens
    assert all(0 < g <= amax["blocks.1.attn.q"] * 10 for g in gate)
    export_nvfp4(source, tmp_path, layout="modelopt", log=lambda line: None, input_amax=amax)
    tensors = read_checkpoint(tmp_path)
    for e in range(experts):
        module = tensor_names.expert_module("blocks.1.mlp.experts.gate", e, ARCHITECTURE)
        assert tensors[f"{module}.input_scale"] == np.float32(gate[e]) / np.float32(2688)


def test_an_expert_calibration_routed_nothing_to_takes_its_blocks_largest_scale():
    model = dataclasses.replace(ModelConfig(), num_layers=1, num_experts=3, moe_mlp_dim=32)
    amax = {f"blocks.0.mlp.experts.{p}.{e}": v for p in ("gate", "up") for e, v in enumerate((2.0, 0.0, 5.0))}
    amax.update({f"blocks.0.mlp.experts.down.{e}": v for e, v in enumerate((1.0, 0.0, 3.0))})
    shared = calibration.shared_input_amaxes(model, amax)
    assert [shared[f"blocks.0.mlp.experts.up.{e}"] for e in range(3)] == [2.0, 5.0, 5.0]
    assert [shared[f"blocks.0.mlp.experts.down.{e}"] for e in range(3)] == [1.0, 3.0, 3.0]


def test_a_qwen2_moe_export_quantizes_the_shared_expert_and_keeps_its_gate_bf16(source, tmp_path):
    """Shared experts export as Qwen2-MoE: the shared expert's codes are the forward pass's, its down
    projection's global scale twice the trained one (the zero gate's sigmoid halves it back), and the gate and
    the zero q/k/v biases stay bfloat16, the gate listed as excluded like the router."""
    from tests.hf.test_hf_moe import moe_source

    moe = moe_source(source, qk_norm=False, num_shared_experts=1)
    export_nvfp4(moe, tmp_path, layout="modelopt", log=lambda line: None)
    tensors = read_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["Qwen2MoeForCausalLM"]
    excluded = config["quantization_config"]["exclude_modules"]
    assert "model.layers.1.mlp.shared_expert_gate" in excluded
    assert not any("shared_expert." in module for module in excluded)
    for name in ("model.layers.1.mlp.shared_expert_gate.weight", "model.layers.0.self_attn.q_proj.bias"):
        assert tensors[name].dtype.name == "bfloat16" and not tensors[name].astype(np.float32).any()
    spec = source.policy.recipe_for("blocks.1.mlp.shared.down").fprop_w
    down = jnp.asarray(moe.params["blocks"][1]["mlp"]["shared"]["down"]["kernel"], jnp.bfloat16)
    trained, operand = forward_operands(down.T[None], spec, None)
    module = "model.layers.1.mlp.shared_expert.down_proj"
    np.testing.assert_array_equal(tensors[f"{module}.weight"], np.asarray(trained.packed)[0])
    scales = np.asarray(trained.scales)[0].view(np.uint8)
    np.testing.assert_array_equal(tensors[f"{module}.weight_scale"].view(np.uint8), scales)
    assert tensors[f"{module}.weight_scale_2"] == 2 * np.asarray(operand.global_scale)
    gate, up = (f"model.layers.1.mlp.shared_expert.{n}_proj.weight_scale_2" for n in ("gate", "up"))
    assert tensors[gate] == tensors[up]  # served as one fused GEMM


def test_nvfp4_ct_of_experts_says_what_transformers_cannot_load(source, tmp_path):
    """The consumer notes (fp4lm.export.consumer_notes): NVFP4 experts, whose global scales transformers drops
    (transformers#48371); experts the run kept in bf16 (the last block, configs/moe.yaml), which transformers
    drops whole. ModelOpt's layout, which transformers does not read, gets neither."""
    quantized = dataclasses.replace(source.quantized_policy, bf16_last_layers=1)
    bf16_last = dataclasses.replace(source, quantized_policy=quantized, policy=quantized)
    notes = {}
    for name, run, layout in (
        ("nvfp4", source, "compressed-tensors"),
        ("bf16-last", bf16_last, "compressed-tensors"),
        ("modelopt", bf16_last, "modelopt"),
    ):
        lines = []
        (tmp_path / name).mkdir()
        export_nvfp4(run, tmp_path / name, layout=layout, log=lines.append)
        notes[name] = [line for line in lines if line.startswith("note: ")]
    assert len(notes["nvfp4"]) == 1 and "without their weight_global_scale" in notes["nvfp4"][0]
    assert len(notes["bf16-last"]) == 1 and "drops the bf16 routed experts of block(s) 1" in notes["bf16-last"][0]
    assert notes["modelopt"] == []
    ignored = json.loads((tmp_path / "bf16-last" / "config.json").read_text())["quantization_config"]["ignore"]
    assert "model.layers.1.mlp.experts.0.gate_proj" in ignored  # as its tensors are named
