"""`fp4lm export RUN --format nvfp4` of a run trained in bf16: its projections are quantized
post-training from the bf16 weights, and the output line and the metadata say so; the weights written are
NVFP4 codes (checked against an independent quantization). W4A4 has no quantized forward to calibrate on:
refused in one line."""

from __future__ import annotations

import json

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import safetensors

from fp4lm.export.nvfp4_weights import FUSED_GROUPS
from fp4lm.export.source import load_source
from fp4lm.hf import tensor_names
from fp4lm.numerics import nvfp4
from tests.export import nvfp4_decoder
from tests.export.safetensors_reading import read_checkpoint
from tests.reliability.helpers_reliability import (
    assert_one_line_user_error,
    run_cli_in_process,
    snapshot,
    train_tiny_run,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    return train_tiny_run(
        tmp_path_factory.mktemp("bf16_run"),
        "precision.recipe=bf16",
        "train.steps=2",
        "checkpoint.async_save=false",
        "eval.batches=1",
    )


def test_a_bf16_run_is_quantized_post_training_and_says_so(bf16_run, tmp_path):
    out = tmp_path / "nvfp4"
    done = run_cli_in_process("export", str(bf16_run), "--format", "nvfp4", "--out", str(out))
    assert done.code == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith(f"exported {bf16_run} step 2 as nvfp4 to {out}"), last
    assert "post-training quantization" in last and "trained in bf16" in last, last
    producer = json.loads((out / "hf_quant_config.json").read_text())["producer"]
    assert "post-training" in producer["weights"]
    with safetensors.safe_open(str(out / "model.safetensors"), framework="numpy") as opened:
        assert opened.metadata()["fp4lm_nvfp4_weights"] == "post-training"
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["quant_algo"] == "W4A16_NVFP4"
    assert config["exclude_modules"] == [tensor_names.LM_HEAD, tensor_names.EMBEDDING]  # every projection quantized

    tensors = read_checkpoint(out)
    source = load_source(str(bf16_run))
    kernels = dict(tensor_names.block_projection_kernels(source.params, source.config.model))
    for group in FUSED_GROUPS:  # the members of a fused group share one amax: quantized stacked
        paths = [f"blocks.0.{name}" for name in group]
        weights = [kernels[p].astype(ml_dtypes.bfloat16).T for p in paths]
        expected = nvfp4.quantize(jnp.asarray(np.concatenate(weights)), block=(16, 16), rounding="nearest")
        packed = np.concatenate([tensors[f"{tensor_names.hf_module(p)}.weight"] for p in paths])
        scales = np.concatenate([tensors[f"{tensor_names.hf_module(p)}.weight_scale"] for p in paths])
        assert packed.dtype == np.uint8 and packed.shape[1] * 2 == weights[0].shape[1]
        np.testing.assert_array_equal(packed, np.asarray(expected.packed))
        np.testing.assert_array_equal(scales.view(np.uint8), np.asarray(expected.scales).view(np.uint8))
        scale_2 = tensors[f"{tensor_names.hf_module(paths[0])}.weight_scale_2"]
        decoded = nvfp4_decoder.decode_modelopt(packed, scales, scale_2)
        bf16 = np.concatenate(weights).astype(np.float32)
        assert 0 < np.linalg.norm(decoded - bf16) / np.linalg.norm(bf16) < 0.2  # NVFP4's error, not zero


def test_w4a4_of_a_bf16_run_is_refused(bf16_run, tmp_path):
    before = snapshot(bf16_run)
    argv = ["export", str(bf16_run), "--format", "nvfp4", "--out", str(tmp_path / "w4a4")]
    done = run_cli_in_process(*argv, "--activations", "nvfp4", "--calibration-batches", "1")
    assert_one_line_user_error(done, expect_in=("--activations nvfp4", "trained in bf16", "--activations none"))
    assert snapshot(bf16_run) == before and not (tmp_path / "w4a4").exists()
