"""`fp4lm export --format hf`: files the safetensors library reads, the names and layouts transformers'
LlamaForCausalLM expects (checked by a NumPy forward written from its definition), sharding, dtypes."""

from __future__ import annotations

import dataclasses
import json

import ml_dtypes
import numpy as np
import pytest

from fp4lm.config import ModelConfig
from fp4lm.errors import UserError
from fp4lm.export.source import load_source
from fp4lm.hf import export as hf
from fp4lm.hf import tensor_names
from fp4lm.model import layers
from tests.export import fp4lm_forward, numpy_llama
from tests.export.safetensors_reading import read_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def source(trained_run):
    return load_source(str(trained_run))


def _peaky(source, seed=0):
    """The run with larger random weights, so attention is sharp and a wrong layout shows in the logits."""
    rng = np.random.default_rng(seed)

    def draw(value):
        if value.ndim == 1:
            return (1.0 + 0.2 * rng.standard_normal(value.shape)).astype(np.float32)
        return (0.35 * rng.standard_normal(value.shape)).astype(np.float32)

    params = {
        "embed": {"table": draw(source.params["embed"]["table"])},
        "final_norm": {"scale": draw(source.params["final_norm"]["scale"])},
        "lm_head": draw(source.params["lm_head"]),
        "blocks": {
            i: {
                "attn_norm": {"scale": draw(b["attn_norm"]["scale"])},
                "mlp_norm": {"scale": draw(b["mlp_norm"]["scale"])},
                "attn": {n: {"kernel": draw(p["kernel"])} for n, p in b["attn"].items()},
                "mlp": {n: {"kernel": draw(p["kernel"])} for n, p in b["mlp"].items()},
            }
            for i, b in source.params["blocks"].items()
        },
    }
    return dataclasses.replace(source, params=params)


def test_float32_export_holds_the_master_weights_under_hf_names(source, tmp_path):
    hf.export_hf(source, tmp_path, dtype="float32")
    tensors = read_checkpoint(tmp_path)
    assert sorted(tensors) == sorted(tensor_names.expected_tensor_names(source.config.model))
    assert all(t.dtype == np.float32 for t in tensors.values())
    q0 = source.params["blocks"][0]["attn"]["q"]["kernel"]
    np.testing.assert_array_equal(tensors["model.layers.0.self_attn.q_proj.weight"], q0.T)  # [out, in]
    np.testing.assert_array_equal(tensors["lm_head.weight"], source.params["lm_head"].T)
    config = json.loads((tmp_path / "config.json").read_text())
    m = source.config.model
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_key_value_heads"]) == (
        m.d_model,
        m.num_layers,
        m.num_kv_heads,
    )
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (tmp_path / name).is_file()


def test_bfloat16_export_rounds_to_nearest_even(source, tmp_path):
    hf.export_hf(source, tmp_path, dtype="bfloat16")
    tensors = read_checkpoint(tmp_path)
    expected = source.params["embed"]["table"].astype(ml_dtypes.bfloat16)
    assert tensors["model.embed_tokens.weight"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(tensors["model.embed_tokens.weight"].view(np.uint16), expected.view(np.uint16))


def test_numpy_hf_llama_on_the_export_matches_fp4lm_logits(source, tmp_path, monkeypatch):
    assert layers in fp4lm_forward.compute_in_float32(monkeypatch)
    peaky = _peaky(source)
    hf.export_hf(peaky, tmp_path, dtype="float32")
    weights = read_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    tokens = np.random.default_rng(1).integers(0, config["vocab_size"], size=32)
    ours = fp4lm_forward.logits(peaky.config, peaky.params, tokens)
    theirs = numpy_llama.forward(tokens, weights, config)
    scale = np.abs(theirs).max()
    error = np.abs(ours - theirs).max() / scale
    assert error < 1e-4, error
    assert np.array_equal(ours.argmax(-1), theirs.argmax(-1))
    # The check can fail: the same weights with q's heads in the interleaved RoPE layout (channel pairs
    # 2i, 2i+1, the other common convention) give clearly different logits.
    E = config["head_dim"]
    interleaved = np.concatenate([np.arange(0, E, 2), np.arange(1, E, 2)]).argsort()
    wrong = dict(weights)
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    wrong["model.layers.0.self_attn.q_proj.weight"] = q.reshape(-1, E, q.shape[-1])[:, interleaved].reshape(q.shape)
    k = weights["model.layers.0.self_attn.k_proj.weight"]
    wrong["model.layers.0.self_attn.k_proj.weight"] = k.reshape(-1, E, k.shape[-1])[:, interleaved].reshape(k.shape)
    wrong_error = np.abs(ours - numpy_llama.forward(tokens, wrong, config)).max() / scale
    assert wrong_error > 1e-2, wrong_error


def test_a_checkpoint_above_the_shard_size_is_split_with_an_index(source, tmp_path):
    files = hf.export_hf(source, tmp_path, dtype="bfloat16", max_shard_bytes=20_000)
    assert "model.safetensors.index.json" in files and len(files) > 2
    assert not (tmp_path / "model.safetensors").exists()
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    tensors = read_checkpoint(tmp_path)
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in tensors.values())
    single = tmp_path / "single"
    single.mkdir()
    hf.export_hf(source, single, dtype="bfloat16")
    unsharded = read_checkpoint(single)
    assert sorted(unsharded) == sorted(tensors)
    assert all(np.array_equal(unsharded[n].view(np.uint16), tensors[n].view(np.uint16)) for n in tensors)


def test_a_model_setting_no_hf_architecture_expresses_is_refused_by_name():
    hf.check_expressible(ModelConfig())
    with pytest.raises(UserError, match=r"model\.qk_norm=True in a dense model is Qwen3's attention"):
        hf.check_expressible(ModelConfig(qk_norm=True))
    hf.check_expressible(ModelConfig(remat="full", init_std=0.05))  # training-only settings need no equivalent
    hf.check_expressible(ModelConfig(attention="xla", scan_layers=True))  # how it runs, not what it computes
