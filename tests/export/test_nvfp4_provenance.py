"""Through the CLI: every output of an NVFP4 export says the same about its weights,
from one decision (fp4lm.export.provenance): the output line, the safetensors header (`fp4lm_nvfp4_weights`)
and hf_quant_config.json's producer. A 4over6 run that switches to bf16 after step 2 of 4
(`precision.bf16_after=0.5`) is exported at step 2, all of whose steps were NVFP4 ("trained": its own 4over6
codes and scales, decoded bit for bit as the forward pass dequantizes them), and at step 4, after two bf16 steps
("post-training"); the plain nvfp4 run is "trained"."""

from __future__ import annotations

import json
import re

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors

from fp4lm.export.nvfp4_weights import FUSED_GROUPS
from fp4lm.export.source import load_source
from fp4lm.hf import tensor_names
from fp4lm.quant import dot
from fp4lm.quant.recipes import RECIPES
from tests.export import nvfp4_decoder
from tests.export.safetensors_reading import read_checkpoint
from tests.export.test_nvfp4_export import _paths, kernel_of
from tests.reliability.helpers_reliability import run_cli_in_process, train_tiny_run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def switched_4over6_run(tmp_path_factory):
    return train_tiny_run(
        tmp_path_factory.mktemp("switched_4over6"),
        "model.num_layers=2",
        "precision.recipe=nvfp4_4over6",
        "precision.shared_weight_scale=true",
        "precision.bf16_after=0.5",
        "train.steps=4",
        "checkpoint.every=2",
        "checkpoint.async_save=false",
        "eval.batches=0",
    )


def _export(run, out, fmt: str, *extra: str) -> str:
    """The export's last output line (`exported ... (<what its weights are>)`)."""
    done = run_cli_in_process("export", str(run), "--format", fmt, "--out", str(out), *extra)
    assert done.code == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def _assert_outputs_agree(last_line: str, out, label: str, *, modelopt: bool) -> None:
    """The output line, the safetensors header and (ModelOpt) hf_quant_config.json's producer all say `label`."""
    text = re.fullmatch(r"exported .* to \S+ \((.*)\)", last_line)
    assert text is not None, last_line
    assert text.group(1).startswith(f"{label}: " if label != "post-training" else "post-training quantization: ")
    with safetensors.safe_open(str(out / "model.safetensors"), framework="numpy") as opened:
        assert opened.metadata()["fp4lm_nvfp4_weights"] == label
    if modelopt:
        producer = json.loads((out / "hf_quant_config.json").read_text())["producer"]
        assert producer["weights_provenance"] == label and producer["weights"] == text.group(1)


def test_a_4over6_run_at_its_switch_step_exports_its_own_codes_labelled_trained(switched_4over6_run, tmp_path):
    mo, ct = tmp_path / "mo", tmp_path / "ct"
    _assert_outputs_agree(_export(switched_4over6_run, mo, "nvfp4", "--step", "2"), mo, "trained", modelopt=True)
    _assert_outputs_agree(_export(switched_4over6_run, ct, "nvfp4-ct", "--step", "2"), ct, "trained", modelopt=False)
    source = load_source(str(switched_4over6_run), 2)
    mo_tensors, ct_tensors = read_checkpoint(mo), read_checkpoint(ct)
    spec = RECIPES["nvfp4_4over6"].fprop_w
    weights = {p: jnp.asarray(kernel_of(source, p), jnp.bfloat16).T for p in _paths(source)}
    for path in _paths(source):
        module = tensor_names.hf_module(path)
        _, block, name = path.split(".", 2)
        members = [f"blocks.{block}.{member}" for member in next(g for g in FUSED_GROUPS if name in g)]
        shared_amax = max(jnp.abs(weights[p].astype(jnp.float32)).max() for p in members)  # what training used
        expected = np.asarray(dot.quantize_operand(weights[path], spec, None, tensor_amax=shared_amax).dequantize())
        decoded = nvfp4_decoder.decode_modelopt(
            *(mo_tensors[f"{module}.{n}"] for n in ("weight", "weight_scale", "weight_scale_2"))
        )
        np.testing.assert_array_equal(decoded.view(np.uint32), expected.view(np.uint32), err_msg=path)
        ct_decoded = nvfp4_decoder.decode_compressed_tensors(
            *(ct_tensors[f"{module}.{n}"] for n in ("weight_packed", "weight_scale", "weight_global_scale"))
        )
        ulps = np.abs(ct_decoded.view(np.int32).astype(np.int64) - expected.view(np.int32).astype(np.int64))
        assert ulps.max() <= 2, (path, ulps.max())


def test_a_run_past_its_bf16_switch_is_labelled_post_training_everywhere(switched_4over6_run, tmp_path):
    mo, ct = tmp_path / "mo", tmp_path / "ct"
    last = _export(switched_4over6_run, mo, "nvfp4")
    assert "switched to bf16 after step 2 (precision.bf16_after), so its step-4 weights were trained in bf16" in last
    _assert_outputs_agree(last, mo, "post-training", modelopt=True)
    _assert_outputs_agree(_export(switched_4over6_run, ct, "nvfp4-ct"), ct, "post-training", modelopt=False)


def test_a_plain_nvfp4_run_is_labelled_trained_everywhere(trained_run, tmp_path):
    mo, ct = tmp_path / "mo", tmp_path / "ct"
    _assert_outputs_agree(_export(trained_run, mo, "nvfp4"), mo, "trained", modelopt=True)
    _assert_outputs_agree(_export(trained_run, ct, "nvfp4-ct"), ct, "trained", modelopt=False)
