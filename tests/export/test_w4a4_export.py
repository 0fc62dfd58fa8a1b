"""`--activations nvfp4 --calibration-batches N`: each quantized layer's input scale is its input amax over the
calibration batches (shared by the layers reading one activation), written as ModelOpt's input_scale and
compressed-tensors' input_global_scale."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import fp4lm.data
import fp4lm.errors
from fp4lm.export import calibration
from fp4lm.export.nvfp4 import export_nvfp4
from fp4lm.export.source import load_source
from fp4lm.hf import tensor_names
from fp4lm.tokenizer import tokenizer_from_json
from tests.export.safetensors_reading import read_checkpoint


@pytest.fixture(scope="module")
def source(trained_run):
    return load_source(str(trained_run))


def _first_block_input_amax(source) -> float:
    """max |attn_norm(embedding)| over the first validation batch, computed here as the model defines it."""
    config = source.config
    data = fp4lm.data.build(
        config.data,
        run_dir=source.run_dir,
        seed=config.train.seed,
        batch_size=config.train.batch_size,
        tokenizer=tokenizer_from_json(source.tokenizer_json),
    )
    tokens = np.asarray(data.eval_batches(1)[0]["inputs"])
    x = source.params["embed"]["table"][tokens].astype(ml_dtypes.bfloat16).astype(np.float32)
    scale = source.params["blocks"][0]["attn_norm"]["scale"]
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + config.model.norm_eps) * scale
    return float(np.abs(y.astype(ml_dtypes.bfloat16).astype(np.float32)).max())


def test_input_scales_are_the_calibrated_input_amax(source, tmp_path):
    amax = calibration.input_amaxes(source, 1)
    assert amax["blocks.0.attn.q"] == amax["blocks.0.attn.k"] == amax["blocks.0.attn.v"]
    assert amax["blocks.0.mlp.gate"] == amax["blocks.0.mlp.up"]
    assert amax["blocks.0.attn.q"] == pytest.approx(_first_block_input_amax(source), rel=1e-2)
    for name, layout in (("mo", "modelopt"), ("ct", "compressed-tensors")):
        (tmp_path / name).mkdir()
        export_nvfp4(source, tmp_path / name, layout=layout, log=print, input_amax=amax)
    mo, ct = read_checkpoint(tmp_path / "mo"), read_checkpoint(tmp_path / "ct")
    for path, value in amax.items():
        module = tensor_names.hf_module(path)
        assert mo[f"{module}.input_scale"] == np.float32(value) / np.float32(2688)
        assert ct[f"{module}.input_global_scale"][0] == np.float32(2688) / np.float32(value)
    assert json.loads((tmp_path / "mo" / "hf_quant_config.json").read_text())["quantization"]["quant_algo"] == "NVFP4"
    group = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]
    assert group["input_activations"]["strategy"] == "tensor_group" and group["input_activations"]["group_size"] == 16


def test_w4a4_without_calibration_batches_is_refused():
    with pytest.raises(fp4lm.errors.UserError, match="--calibration-batches"):
        calibration.check_calibration_batches("nvfp4", 0)
    calibration.check_calibration_batches("none", 0)
