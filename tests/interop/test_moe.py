"""transformers reads fp4lm's mixture-of-experts exports with its own classes: MixtralForCausalLM,
Qwen3MoeForCausalLM and Qwen2MoeForCausalLM (shared experts) from the float32 export give fp4lm's logits and
greedy tokens; compressed-tensors' own
decompression of the nvfp4-ct export equals our decoder and the forward pass's weights for every expert, and
that model has `fp4lm eval`'s validation loss within 1%, also where the last block's experts stayed bf16
(configs/moe.yaml). transformers' own loading of NVFP4 experts drops their global scales (transformers#48371),
and of bf16 experts beside NVFP4 ones drops the bf16 ones: strict xfails pin both until a release fixes them,
and the export says so in one line each."""

from __future__ import annotations

import json

import pytest

from tests.export import fp4lm_forward
from tests.export.safetensors_reading import read_checkpoint
from tests.interop.checks import (
    assert_decompressed_weights_are_ours,
    assert_logits_and_greedy_tokens,
    eval_loss_and_batches,
)
from tests.interop.conftest import MOE_SHAPES

pytestmark = pytest.mark.slow

ARCHITECTURES = list(MOE_SHAPES)


@pytest.fixture
def float32_compute(monkeypatch):
    fp4lm_forward.compute_in_float32(monkeypatch)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_transformers_moe_class_gives_fp4lm_logits_and_greedy_tokens(
    moe_runs, consumer, tmp_path, float32_compute, architecture
):
    assert_logits_and_greedy_tokens(consumer, moe_runs[architecture]["run"], moe_runs[architecture]["hf"], tmp_path)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_compressed_tensors_decompresses_every_expert_to_the_forward_weights(moe_runs, consumer, architecture):
    exports = moe_runs[architecture]
    ct, modelopt = read_checkpoint(exports["nvfp4-ct"]), read_checkpoint(exports["nvfp4"])
    theirs = consumer("decompress", str(exports["nvfp4-ct"]))
    config = json.loads((exports["nvfp4-ct"] / "config.json").read_text())
    moe_blocks = config["num_hidden_layers"] - len(config.get("mlp_only_layers", []))
    assert sum(".experts." in module for module in theirs) == moe_blocks * 3 * 4  # gate, up, down of 4 experts
    assert_decompressed_weights_are_ours(theirs, ct, modelopt)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_decompressed_moe_export_has_fp4lm_eval_validation_loss(moe_runs, consumer, tmp_path, architecture):
    ours = eval_loss_and_batches(moe_runs[architecture]["run"], tmp_path / "batches.npz")
    export = str(moe_runs[architecture]["nvfp4-ct"])
    theirs = float(consumer("loss-decompressed", export, str(tmp_path / "batches.npz"))["loss"])
    assert abs(theirs - ours) / ours <= 0.01, (theirs, ours)


@pytest.mark.xfail(
    strict=True,
    reason="transformers 5.24 and 5.25 dequantize per-expert NVFP4 weights without weight_global_scale "
    "(huggingface/transformers#48371, fix in #48372): when this passes, drop the xfail and the consumer's "
    "loss-decompressed workaround",
)
def test_transformers_own_loading_of_the_moe_export_has_fp4lm_eval_validation_loss(moe_runs, consumer, tmp_path):
    architecture = "Qwen3MoeForCausalLM"
    ours = eval_loss_and_batches(moe_runs[architecture]["run"], tmp_path / "batches.npz")
    theirs = float(consumer("loss", str(moe_runs[architecture]["nvfp4-ct"]), str(tmp_path / "batches.npz"))["loss"])
    assert abs(theirs - ours) / ours <= 0.01, (theirs, ours)


def test_the_moe_export_with_bf16_last_experts_decompressed_has_fp4lm_eval_validation_loss(
    moe_bf16_last_run, consumer, tmp_path
):
    notes = [line for line in moe_bf16_last_run["stdout"].splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "drops the bf16 routed experts of block(s) 2" in notes[0], notes
    ours = eval_loss_and_batches(moe_bf16_last_run["run"], tmp_path / "batches.npz")
    export = str(moe_bf16_last_run["nvfp4-ct"])
    theirs = float(consumer("loss-decompressed", export, str(tmp_path / "batches.npz"))["loss"])
    assert abs(theirs - ours) / ours <= 0.01, (theirs, ours)


@pytest.mark.xfail(
    strict=True,
    reason="transformers 5.24 and 5.25 gather nothing from routed experts written unquantized beside NVFP4 ones "
    "(their compressed-tensors dequantize step reads only weight_packed; 'Concatenate on tensors destined for "
    "model.layers.2.mlp.experts.gate_up_proj. Ckpt contains: 0'), whatever `ignore` names them: when this "
    "passes, drop the xfail and the export's note (fp4lm/export/consumer_notes.py)",
)
def test_transformers_own_loading_of_the_moe_export_with_bf16_last_experts(moe_bf16_last_run, consumer, tmp_path):
    ours = eval_loss_and_batches(moe_bf16_last_run["run"], tmp_path / "batches.npz")
    export = str(moe_bf16_last_run["nvfp4-ct"])
    theirs = float(consumer("loss", export, str(tmp_path / "batches.npz"))["loss"])
    assert abs(theirs - ours) / ours <= 0.01, (theirs, ours)
