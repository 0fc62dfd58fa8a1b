"""What an export reads: one checkpoint of a run directory, its config, tokenizer and precision policy.

Read only, on one device, through the trainer's own checkpoint machinery (fp4lm.train.checkpoint with
`read_only=True`), so an export can run beside a training run that is still writing checkpoints.
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import numpy as np

from fp4lm.hf.export import HFCheckpoint
from fp4lm.inference.saved_run import read_checkpoint
from fp4lm.quant import Policy
from fp4lm.train import model_setup


@dataclasses.dataclass
class ExportSource(HFCheckpoint):
    run_dir: pathlib.Path
    step: int
    quantized_policy: Policy  # the policy before any late switch to bf16
    policy: Policy  # the policy the forward pass used after `step` steps
    bf16_switch: int | None  # the step after which the run trained in bf16 (precision.bf16_after), if it did


def load_source(run_dir: str, step: int | None = None) -> ExportSource:
    """Checkpoint `step` of `run_dir` (None: the newest usable one)."""
    saved = read_checkpoint(run_dir, step)
    restored, config, quantized = saved.restored, saved.config, saved.quantized_policy
    params = jax.tree.map(lambda leaf: np.asarray(jax.device_get(leaf), np.float32), restored.state.model_variables())
    return ExportSource(
        run_dir=saved.run_dir,
        config=config,
        step=restored.step,
        params=params,
        tokenizer_json=restored.tokenizer_json,
        quantized_policy=quantized,
        policy=model_setup.policy_at(restored.step, config, quantized, switch=saved.bf16_switch),
        bf16_switch=saved.bf16_switch if saved.bf16_switch is not None else model_setup.bf16_switch_step(config),
    )
