"""Mixture-of-experts runs out to Hugging Face and back: the architecture (Mixtral, Qwen3-MoE or Qwen2-MoE)
follows the run's settings, the names and layouts are checked by the NumPy forward written from transformers'
definitions, export -> import gives back identical parameters, and what neither class expresses is refused."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest
from flax import nnx

from fp4lm.config import ModelConfig, load_config
from fp4lm.errors import UserError
from fp4lm.export.source import load_source
from fp4lm.hf import architectures, tensor_names
from fp4lm.hf import export as hf
from fp4lm.hf.init_from import config_from_checkpoint
from fp4lm.quant import Policy
from fp4lm.train import model_setup
from tests.export import fp4lm_forward, numpy_llama
from tests.export.safetensors_reading import read_checkpoint
from tests.hf.test_hf_import import _flat, _imported_state

pytestmark = pytest.mark.slow

MOE = {"num_layers": 3, "num_experts": 4, "experts_per_token": 2, "moe_mlp_dim": 32}
SHAPES = {
    "MixtralForCausalLM": MOE,
    "Qwen3MoeForCausalLM": {**MOE, "qk_norm": True, "first_dense_layers": 1, "router_renormalize": False},
    "Qwen2MoeForCausalLM": {**MOE, "num_shared_experts": 2, "first_dense_layers": 1},
}
MOE_KEYS = (
    "num_experts",
    "experts_per_token",
    "moe_mlp_dim",
    "qk_norm",
    "first_dense_layers",
    "router_renormalize",
    "num_shared_experts",
)


@pytest.fixture(scope="module")
def source(trained_run):
    return load_source(str(trained_run))


def moe_source(source, seed=0, **model):
    """The dense run's tokenizer with an MoE model of `model`'s settings and large random weights (sharp
    attention, decisive routing), so a wrong name, layout or expert order shows in the logits."""
    config = dataclasses.replace(source.config, model=dataclasses.replace(source.config.model, **model))
    vocab = int(source.params["embed"]["table"].shape[0])
    abstract = model_setup.abstract_model(config, vocab, Policy.bf16(config.model.num_layers))
    shapes = nnx.to_pure_dict(nnx.state(abstract, nnx.Param))
    rng = np.random.default_rng(seed)

    def draw(shape_dtype):
        shape = shape_dtype.shape
        if len(shape) == 1:
            return (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        return (0.35 * rng.standard_normal(shape)).astype(np.float32)

    return dataclasses.replace(source, config=config, params=jax.tree.map(draw, shapes))


@pytest.fixture
def float32_compute(monkeypatch):
    fp4lm_forward.compute_in_float32(monkeypatch)


@pytest.mark.parametrize("architecture", list(SHAPES))
def test_the_numpy_hf_model_on_the_export_gives_fp4lm_logits(source, tmp_path, float32_compute, architecture):
    moe = moe_source(source, **SHAPES[architecture])
    hf.export_hf(moe, tmp_path, dtype="float32")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [architecture]
    weights = read_checkpoint(tmp_path)
    assert sorted(weights) == sorted(tensor_names.expected_tensor_names(moe.config.model))
    tokens = np.random.default_rng(1).integers(0, config["vocab_size"], size=24)
    ours = fp4lm_forward.logits(moe.config, moe.params, tokens)
    theirs = numpy_llama.forward(tokens, weights, config)
    scale = np.abs(theirs).max()
    assert np.abs(ours - theirs).max() / scale < 1e-4
    assert np.array_equal(ours.argmax(-1), theirs.argmax(-1))
    # The check can fail: two experts of the last block swapped (names in the wrong order) change the logits.
    last = moe.config.model.num_layers - 1
    first, second = (
        f"{tensor_names.expert_module(f'blocks.{last}.mlp.experts.gate', e, architecture)}.weight" for e in (0, 1)
    )
    swapped = {**weights, first: weights[second], second: weights[first]}
    assert np.abs(ours - numpy_llama.forward(tokens, swapped, config)).max() / scale > 1e-3


@pytest.mark.parametrize("architecture", list(SHAPES))
def test_export_then_import_gives_back_the_moe_parameters(source, tmp_path, architecture):
    moe = moe_source(source, **SHAPES[architecture])
    hf.export_hf(moe, tmp_path, dtype="float32", max_shard_bytes=60_000)
    config, state = _imported_state(tmp_path)
    for key in MOE_KEYS:
        assert getattr(config.model, key) == getattr(moe.config.model, key), key
    expected, imported = _flat(moe.params), _flat(state.params)
    assert sorted(imported) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(imported[key].view(np.uint32), value.view(np.uint32), err_msg=key)


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"num_shared_experts": 1, "qk_norm": True}, r"model\.num_shared_experts=1 with model\.qk_norm=True"),
        ({"router_score": "sigmoid"}, r"model\.router_score=sigmoid"),
        ({"router_bias_update": 0.01}, r"model\.router_bias_update=0\.01"),
        ({"first_dense_layers": 1}, r"model\.first_dense_layers=1 without model\.qk_norm or shared experts"),
        ({"router_renormalize": False}, r"model\.router_renormalize=False without model\.qk_norm or shared"),
    ],
)
def test_what_no_moe_class_expresses_is_refused_by_name(settings, named):
    with pytest.raises(UserError, match=named):
        architectures.architecture_of(ModelConfig(**{**MOE, **settings}))


def test_settings_that_only_shape_training_need_no_equivalent():
    moe = {**MOE, "load_balance_loss": 0.1, "router_z_loss": 1e-3, "capacity_factor": 1.25}
    assert architectures.architecture_of(ModelConfig(**moe)) == "MixtralForCausalLM"
    assert architectures.architecture_of(ModelConfig()) == "LlamaForCausalLM"
    with pytest.raises(UserError, match=r"model\.qk_norm=True in a dense model is Qwen3's attention"):
        architectures.architecture_of(ModelConfig(qk_norm=True))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"decoder_sparse_step": 2}, "decoder_sparse_step=2"),
        ({"mlp_only_layers": [1]}, r"mlp_only_layers=\[1\]"),
        ({"use_sliding_window": True}, "use_sliding_window=true"),
    ],
)
def test_a_qwen3_moe_layout_fp4lm_does_not_have_is_refused_on_import(source, tmp_path, change, named):
    hf.export_hf(moe_source(source, **SHAPES["Qwen3MoeForCausalLM"]), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(UserError, match=f"train.init_from={tmp_path}: it has {named}"):
        config_from_checkpoint(load_config(None, [f"train.init_from={tmp_path}"]))


def test_qwen2_moe_export_writes_zero_biases_and_gates_and_twice_the_shared_down(source, tmp_path):
    """Qwen2-MoE's gated shared expert and q/k/v biases, made exact (fp4lm.hf.architectures)."""
    moe = moe_source(source, **SHAPES["Qwen2MoeForCausalLM"])
    hf.export_hf(moe, tmp_path, dtype="float32")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["shared_expert_intermediate_size"] == 2 * 32 and config["qkv_bias"] is True
    weights = read_checkpoint(tmp_path)
    zeros = tensor_names.zero_tensor_names(moe.config.model)
    assert len(zeros) == 3 * 3 + 2  # q/k/v biases of 3 blocks, the gates of the 2 MoE blocks
    assert all(not weights[name].any() for name in zeros)
    down = moe.params["blocks"][2]["mlp"]["shared"]["down"]["kernel"]
    np.testing.assert_array_equal(weights["model.layers.2.mlp.shared_expert.down_proj.weight"], 2 * down.T)


@pytest.mark.parametrize(
    "name", ["model.layers.1.mlp.shared_expert_gate.weight", "model.layers.0.self_attn.k_proj.bias"]
)
def test_a_qwen2_moe_with_a_trained_gate_or_bias_is_refused_on_import(source, tmp_path, name):
    """Qwen1.5-MoE's learned shared-expert gates and q/k/v biases have no place in fp4lm's model."""
    from fp4lm.hf import safetensors_files

    hf.export_hf(moe_source(source, **SHAPES["Qwen2MoeForCausalLM"]), tmp_path, dtype="float32")
    weights = read_checkpoint(tmp_path)
    weights[name] = np.full_like(weights[name], 0.25)
    safetensors_files.write_checkpoint(tmp_path, weights.items())
    with pytest.raises(UserError, match=f"train.init_from={tmp_path}: {name} is not zero"):
        _imported_state(tmp_path)


def test_a_qwen2_moe_shared_width_fp4lm_cannot_split_is_refused_on_import(source, tmp_path):
    hf.export_hf(moe_source(source, **SHAPES["Qwen2MoeForCausalLM"]), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "shared_expert_intermediate_size": 48}))
    with pytest.raises(UserError, match=r"it has shared_expert_intermediate_size=48, not a positive multiple"):
        config_from_checkpoint(load_config(None, [f"train.init_from={tmp_path}"]))
