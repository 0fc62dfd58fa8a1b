"""The interop tests' shared checks: fp4lm's side of a comparison with a consumer (tests/interop/consumer.py)."""

from __future__ import annotations

import pathlib

import ml_dtypes
import numpy as np

import fp4lm.data
from fp4lm.export.source import load_source
from fp4lm.inference import saved_run
from tests.export import fp4lm_forward, nvfp4_decoder


def assert_logits_and_greedy_tokens(consumer, run_dir, export_dir, tmp_path: pathlib.Path) -> None:
    """transformers' logits of 24 tokens on the float32 export within 1e-4 of fp4lm's (computed in float32:
    `fp4lm_forward.compute_in_float32`), and the same 8-token greedy continuation of their first 8."""
    source = load_source(str(run_dir))
    tokens = np.random.default_rng(0).integers(0, 256, size=24)
    np.save(tmp_path / "tokens.npy", tokens)
    theirs = consumer(
        "logits", str(export_dir), str(tmp_path / "tokens.npy"), "--greedy-prefix", "8", "--greedy-steps", "8"
    )
    ours = fp4lm_forward.logits(source.config, source.params, tokens)
    assert np.abs(ours - theirs["logits"]).max() <= 1e-4
    sequence = list(tokens[:8])
    for _ in range(8):
        sequence.append(int(fp4lm_forward.logits(source.config, source.params, np.array(sequence))[-1].argmax()))
    np.testing.assert_array_equal(np.array(sequence), theirs["greedy"])


def eval_loss_and_batches(run_dir, path: pathlib.Path) -> float:
    """What `fp4lm eval` prints for the run (NVFP4 weights and activations, as trained), after writing its
    validation batches to `path` for the consumer; asserts the run has learned something, so that a
    comparison of losses means something."""
    run = saved_run.load_run(str(run_dir))
    ours = saved_run.evaluate(run)
    assert ours < 0.8 * np.log(256)
    data = fp4lm.data.build(
        run.config.data,
        run_dir=run.run_dir,
        seed=run.config.train.seed,
        batch_size=run.config.train.batch_size,
        tokenizer=run.tokenizer,
    )
    batches = data.eval_batches(run.config.eval.batches)
    inputs, targets = (np.stack([b[key] for b in batches]) for key in ("inputs", "targets"))
    np.savez(path, inputs=inputs, targets=targets)
    return ours


def assert_decompressed_weights_are_ours(theirs: dict, ct: dict, modelopt: dict) -> None:
    """compressed-tensors' decompression (`theirs`, bfloat16 values) of every module equals our decoder of the
    nvfp4-ct tensors and of the ModelOpt export (the forward pass's codes), both rounded to bfloat16."""
    for module, weight in theirs.items():
        ours = nvfp4_decoder.decode_compressed_tensors(
            *(ct[f"{module}.{name}"] for name in ("weight_packed", "weight_scale", "weight_global_scale"))
        )
        np.testing.assert_array_equal(weight, ours.astype(ml_dtypes.bfloat16).astype(np.float32), err_msg=module)
        forward = nvfp4_decoder.decode_modelopt(
            *(modelopt[f"{module}.{name}"] for name in ("weight", "weight_scale", "weight_scale_2"))
        )
        np.testing.assert_array_equal(weight, forward.astype(ml_dtypes.bfloat16).astype(np.float32), err_msg=module)
