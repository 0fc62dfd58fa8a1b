"""transformers reads fp4lm's exports as a user of it would: LlamaForCausalLM from the float32 Hugging Face
export gives fp4lm's logits (max abs difference 1e-4) and the same greedy continuation; the compressed-tensors
NVFP4 export, decompressed by transformers' own compressed-tensors support, has the validation loss of
`fp4lm eval` on the same run within 1%."""

from __future__ import annotations

import numpy as np

import fp4lm.data
from fp4lm.export.source import load_source
from fp4lm.inference import saved_run
from fp4lm.model import layers
from tests.export import fp4lm_forward


def test_llama_from_the_hf_export_gives_fp4lm_logits_and_greedy_tokens(
    interop_run, exports, consumer, tmp_path, monkeypatch
):
    assert layers in fp4lm_forward.compute_in_float32(monkeypatch)  # to compare with the float32 torch model
    source = load_source(str(interop_run))
    tokens = np.random.default_rng(0).integers(0, 256, size=24)
    np.save(tmp_path / "tokens.npy", tokens)
    theirs = consumer(
        "logits", str(exports["hf"]), str(tmp_path / "tokens.npy"), "--greedy-prefix", "8", "--greedy-steps", "8"
    )
    ours = fp4lm_forward.logits(source.config, source.params, tokens)
    assert np.abs(ours - theirs["logits"]).max() <= 1e-4
    sequence = list(tokens[:8])
    for _ in range(8):
        sequence.append(int(fp4lm_forward.logits(source.config, source.params, np.array(sequence))[-1].argmax()))
    np.testing.assert_array_equal(np.array(sequence), theirs["greedy"])


def test_the_compressed_tensors_export_has_fp4lm_eval_validation_loss(interop_run, exports, consumer, tmp_path):
    run = saved_run.load_run(str(interop_run))
    ours = saved_run.evaluate(run)  # what `fp4lm eval` prints: NVFP4 weights and activations, as trained
    assert ours < 0.8 * np.log(256)  # the run has learned something, so the comparison means something
    data = fp4lm.data.build(
        run.config.data,
        run_dir=run.run_dir,
        seed=run.config.train.seed,
        batch_size=run.config.train.batch_size,
        tokenizer=run.tokenizer,
    )
    batches = data.eval_batches(run.config.eval.batches)
    np.savez(
        tmp_path / "batches.npz",
        inputs=np.stack([b["inputs"] for b in batches]),
        targets=np.stack([b["targets"] for b in batches]),
    )
    theirs = float(consumer("loss", str(exports["nvfp4-ct"]), str(tmp_path / "batches.npz"))["loss"])
    assert abs(theirs - ours) / ours <= 0.01, (theirs, ours)
