"""What an export reads: one checkpoint of a run directory, its config, tokenizer and precision policy.

Read only, on one device, through the trainer's own checkpoint machinery (fp4lm.train.checkpoint with
`read_only=True`), so an export can run beside a training run that is still writing checkpoints.
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import numpy as np

from fp4lm.config import Config, MeshConfig, from_dict, validate
from fp4lm.data.tokenizer import saved_model_vocab_size
from fp4lm.errors import UserError
from fp4lm.quant import Policy
from fp4lm.sharding import make_mesh
from fp4lm.train import model_setup
from fp4lm.train.checkpoint import Checkpointer, checkpoint_dir
from fp4lm.train.setup import build_run
from fp4lm.train.validate import check_config_for_training


@dataclasses.dataclass
class ExportSource:
    run_dir: pathlib.Path
    config: Config
    step: int
    params: dict  # float32 NumPy arrays, the model's pure-dict parameters
    tokenizer_json: str  # as the checkpoint saved it (fp4lm.data.tokenizer's file format)
    quantized_policy: Policy  # the policy before any late switch to bf16
    policy: Policy  # the policy the forward pass used after `step` steps


def _restore_step(checkpointer: Checkpointer, step: int | None, target, run_dir: str):
    if step is None:
        return checkpointer.restore_latest(target)
    steps = checkpointer.steps()
    if step not in steps:
        listed = ", ".join(str(s) for s in steps) or "none"
        raise UserError(f"{run_dir} has no checkpoint at step {step} (saved steps: {listed}); pass one of those")
    # The same read with fingerprint and finiteness checks that resuming uses, at the requested step.
    restored, problem = checkpointer._restore(step, target)  # no public single-step restore exists
    if restored is None:
        raise UserError(f"the checkpoint at step {step} of {run_dir} is unusable ({problem}); pick another --step")
    return restored


def load_source(run_dir: str, step: int | None = None) -> ExportSource:
    """Checkpoint `step` of `run_dir` (None: the newest usable one)."""
    path = pathlib.Path(run_dir)
    if not checkpoint_dir(path).is_dir():
        raise UserError(f"{run_dir} has no checkpoints; pass a run directory that `fp4lm train` wrote (train.run_dir)")
    checkpointer = Checkpointer(path, read_only=True, async_save=False)
    try:
        saved = checkpointer.read_config()
        if saved is None:
            raise UserError(f"{run_dir} has no complete checkpoint yet; wait for the first save (checkpoint.every)")
        config = from_dict(saved, source=f"{run_dir} checkpoint config")
        config = dataclasses.replace(config, mesh=MeshConfig(data=1, fsdp=1, tensor=1))
        validate(config)
        quantized = check_config_for_training(config)
        mesh = make_mesh(config.mesh, devices=jax.local_devices()[:1])
        setup = build_run(config, mesh, quantized, saved_model_vocab_size(path, config.data))  # as trained
        restored = _restore_step(checkpointer, step, setup.restore_target(), run_dir)
        if restored is None:
            raise UserError(f"no usable checkpoint in {run_dir}; train again (a new train.run_dir)")
    finally:
        checkpointer.close()
    params = jax.tree.map(lambda leaf: np.asarray(jax.device_get(leaf), np.float32), restored.state.params)
    return ExportSource(
        run_dir=path,
        config=config,
        step=restored.step,
        params=params,
        tokenizer_json=restored.tokenizer_json,
        quantized_policy=quantized,
        policy=model_setup.policy_at(restored.step, config, quantized),
    )
