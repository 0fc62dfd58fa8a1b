"""`train.init_from=HF_DIR`: the checkpoint decides shape and tokenizer, conflicting settings are refused,
training starts from its weights at step 0; export -> import gives identical parameters; Llama 3.1 RoPE."""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import ml_dtypes
import numpy as np
import pytest

from fp4lm.config import Config, load_config
from fp4lm.errors import UserError
from fp4lm.export.source import load_source
from fp4lm.hf import export as hf
from fp4lm.hf.init_from import config_from_checkpoint
from fp4lm.model.layers import Llama3RopeScaling, rope_inverse_frequencies
from fp4lm.quant import Policy
from fp4lm.sharding import make_mesh
from fp4lm.train.setup import build_run
from tests.export import fp4lm_forward


@pytest.fixture(scope="module")
def source(trained_run):
    return load_source(str(trained_run))


def _imported_state(directory, overrides=()):
    config = config_from_checkpoint(load_config(None, [f"train.init_from={directory}", *overrides]))
    vocab = config.data.vocab_size
    mesh = make_mesh(config.mesh, devices=jax.local_devices()[:1])
    setup = build_run(config, mesh, Policy(config.precision.recipe, num_layers=config.model.num_layers), vocab)
    return config, setup.fresh_state()


def _flat(tree):
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_export_then_import_gives_back_the_parameters_at_step_zero(source, tmp_path, dtype):
    hf.export_hf(source, tmp_path, dtype=dtype, max_shard_bytes=30_000)  # sharded, with an index
    config, state = _imported_state(tmp_path)
    for key in ("num_layers", "d_model", "num_heads", "num_kv_heads", "mlp_dim", "tie_embeddings", "rope_theta"):
        assert getattr(config.model, key) == getattr(source.config.model, key), key
    assert config.data.tokenizer == str(tmp_path.absolute())
    expected = _flat(source.params)
    if dtype == "bfloat16":
        expected = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in expected.items()}
    imported = _flat(state.params)
    assert sorted(imported) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(imported[key].view(np.uint32), value.view(np.uint32), err_msg=key)
    assert int(state.step) == 0
    assert all(not np.any(np.asarray(leaf)) for leaf in jax.tree.leaves(state.opt_state) if np.ndim(leaf) > 0)


def test_an_explicit_setting_that_conflicts_with_the_checkpoint_is_refused(source, tmp_path):
    hf.export_hf(source, tmp_path)
    with pytest.raises(UserError, match=r"model\.d_model=64 conflicts with train\.init_from=.*d_model=32"):
        config_from_checkpoint(load_config(None, [f"train.init_from={tmp_path}", "model.d_model=64"]))
    agreeing = config_from_checkpoint(load_config(None, [f"train.init_from={tmp_path}", "model.d_model=32"]))
    assert agreeing.model.d_model == 32


def test_non_llama_architectures_and_missing_shards_are_refused(source, tmp_path):
    hf.export_hf(source, tmp_path, max_shard_bytes=30_000)
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    shards[-1].unlink()
    with pytest.raises(UserError, match=f"shard {shards[-1].name} named in its index is missing"):
        _imported_state(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["MistralForCausalLM"]}))
    with pytest.raises(UserError, match="the architecture is MistralForCausalLM, not one of LlamaForCausalLM, Mixtral"):
        config_from_checkpoint(
            dataclasses.replace(Config(), train=dataclasses.replace(Config().train, init_from=str(tmp_path)))
        )


def _hf_llama3_frequencies(head_dim, theta, factor, low, high, original):
    """Llama 3.1's scaled RoPE frequencies, written from Meta's reference description, in float64."""
    result = []
    for i in range(0, head_dim, 2):
        frequency = 1.0 / theta ** (i / head_dim)
        wavelength = 2 * math.pi / frequency
        if wavelength < original / high:
            result.append(frequency)
        elif wavelength > original / low:
            result.append(frequency / factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            result.append((1 - smooth) * frequency / factor + smooth * frequency)
    return np.array(result)


def test_llama3_rope_scaling_matches_the_reference_frequencies():
    scaling = Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8192)
    ours = np.asarray(rope_inverse_frequencies(128, 500000.0, scaling))
    reference = _hf_llama3_frequencies(128, 500000.0, 8.0, 1.0, 4.0, 8192)
    np.testing.assert_allclose(ours, reference, rtol=2e-6)
    plain = np.asarray(rope_inverse_frequencies(128, 500000.0))
    assert ours[0] == plain[0] and ours[-1] == pytest.approx(plain[-1] / 8, rel=1e-6)  # kept / divided
    assert np.any((ours != plain) & (ours != plain / 8))  # and blended in between


def test_llama3_rope_scaling_round_trips_through_config_json(source, tmp_path):
    model = dataclasses.replace(source.config.model, rope_scaling="llama3", rope_scaling_factor=32.0)
    scaled = dataclasses.replace(source, config=dataclasses.replace(source.config, model=model))
    hf.export_hf(scaled, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())["rope_scaling"]
    assert written["rope_type"] == "llama3" and written["factor"] == 32.0
    config = config_from_checkpoint(load_config(None, [f"train.init_from={tmp_path}"]))
    assert (config.model.rope_scaling, config.model.rope_scaling_factor) == ("llama3", 32.0)
    assert config.model.rope_original_max_positions == 8192


def test_the_attention_applies_llama3_rope_scaling(source):
    tokens = np.arange(32) % 200
    model = dataclasses.replace(source.config.model, rope_scaling="llama3", rope_original_max_positions=4)
    scaled = dataclasses.replace(source.config, model=model)
    plain = fp4lm_forward.logits(source.config, source.params, tokens)
    assert not np.array_equal(fp4lm_forward.logits(scaled, source.params, tokens), plain)
