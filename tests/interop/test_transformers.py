"""transformers reads fp4lm's exports as a user of it would: LlamaForCausalLM from the float32 Hugging Face
export gives fp4lm's logits (max abs difference 1e-4) and the same greedy continuation; the compressed-tensors
NVFP4 export, decompressed by transformers' own compressed-tensors support, has the validation loss of
`fp4lm eval` on the same run within 1%."""

from __future__ import annotations

import pytest

from fp4lm.model import layers
from tests.export import fp4lm_forward
from tests.interop.checks import assert_logits_and_greedy_tokens, eval_loss_and_batches

pytestmark = pytest.mark.slow


def test_llama_from_the_hf_export_gives_fp4lm_logits_and_greedy_tokens(
    interop_run, exports, consumer, tmp_path, monkeypatch
):
    assert layers in fp4lm_forward.compute_in_float32(monkeypatch)  # to compare with the float32 torch model
    assert_logits_and_greedy_tokens(consumer, interop_run, exports["hf"], tmp_path)


def test_the_compressed_tensors_export_has_fp4lm_eval_validation_loss(interop_run, exports, consumer, tmp_path):
    ours = eval_loss_and_batches(interop_run, tmp_path / "batches.npz")
    theirs = float(consumer("loss", str(exports["nvfp4-ct"]), str(tmp_path / "batches.npz"))["loss"])
    assert abs(theirs - ours) / ours <= 0.01, (theirs, ours)
