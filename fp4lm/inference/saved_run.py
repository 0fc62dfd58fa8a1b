"""A trained run read back from its directory, for `fp4lm eval` and `fp4lm sample`: read only (the checkpoint
holds the config and the tokenizer; the token cache is used when present, never written)."""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import numpy as np

import fp4lm.data
from fp4lm.config import Config, MeshConfig, from_dict, validate
from fp4lm.errors import UserError
from fp4lm.quant import Policy
from fp4lm.sharding import make_mesh
from fp4lm.tokenizer import Tokenizer, saved_model_vocab_size, tokenizer_from_json
from fp4lm.train import model_setup
from fp4lm.train.checkpoint import Checkpointer, Restored, checkpoint_dir
from fp4lm.train.hosts import use_compilation_cache
from fp4lm.train.run_functions import RunFunctions
from fp4lm.train.setup import RunSetup, build_run
from fp4lm.train.step import ApplyFn, make_eval_step
from fp4lm.train.validate import check_config_for_training


@dataclasses.dataclass
class SavedRun:
    run_dir: pathlib.Path
    config: Config
    step: int
    tokenizer: Tokenizer
    params: dict
    apply: ApplyFn  # apply(params, tokens) -> logits, with the policy in force at `step`


@dataclasses.dataclass
class SavedCheckpoint:
    """One checkpoint of a run directory as the trainer reads it back on one device."""

    run_dir: pathlib.Path
    config: Config
    quantized_policy: Policy  # the policy before any late switch to bf16
    setup: RunSetup
    restored: Restored


def read_checkpoint(run_dir: str, step: int | None = None) -> SavedCheckpoint:
    """Checkpoint `step` of `run_dir` (None: the newest usable one), read only, on one device, with the config
    and tokenizer saved beside it; the same fingerprint and finiteness checks as resuming."""
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
        use_compilation_cache(config.train.compilation_cache_dir)
        check_config_for_training(config)
        quantized = Policy.from_config(config)
        mesh = make_mesh(config.mesh, devices=jax.local_devices()[:1])
        setup = build_run(config, mesh, quantized, saved_model_vocab_size(path, config.data))  # as trained
        restored = _restore(checkpointer, step, setup.restore_target(), run_dir)
    finally:
        checkpointer.close()
    return SavedCheckpoint(path, config, quantized, setup, restored)


def _restore(checkpointer: Checkpointer, step: int | None, target, run_dir: str) -> Restored:
    if step is None:
        restored = checkpointer.restore_latest(target)
        if restored is None:
            raise UserError(f"no usable checkpoint in {run_dir}; train again (a new train.run_dir)")
        return restored
    steps = checkpointer.steps()
    if step not in steps:
        listed = ", ".join(str(s) for s in steps) or "none"
        raise UserError(f"{run_dir} has no checkpoint at step {step} (saved steps: {listed}); pass one of those")
    restored, problem = checkpointer.restore_step(step, target)
    if restored is None:
        raise UserError(f"the checkpoint at step {step} of {run_dir} is unusable ({problem}); pick another --step")
    return restored


def load_run(run_dir: str) -> SavedRun:
    """The newest usable checkpoint of `run_dir` (on one device), with its config and tokenizer."""
    saved = read_checkpoint(run_dir)
    step = saved.restored.step
    policy = model_setup.policy_at(step, saved.config, saved.quantized_policy)
    apply = RunFunctions.apply_only(saved.setup.model, policy)
    tokenizer = tokenizer_from_json(saved.restored.tokenizer_json, origin=f"{run_dir} checkpoint tokenizer")
    return SavedRun(saved.run_dir, saved.config, step, tokenizer, saved.restored.state.params, apply)


def check_eval_batches(batches: int | None) -> None:
    """`fp4lm eval --batches`: at least one (None: the run's eval.batches). Checked before loading the run."""
    if batches is not None and batches <= 0:
        raise UserError(f"--batches {batches}: evaluate at least one batch, e.g. --batches 8")


def evaluate(run: SavedRun, *, batches: int | None = None) -> float:
    """The run checkpoint's validation loss over its fixed validation batches (see `evaluate_sources`)."""
    return evaluate_sources(run, batches=batches)[0]


def evaluate_sources(run: SavedRun, *, batches: int | None = None) -> tuple[float, dict[str, float]]:
    """(val_loss, per-source losses) of the run's checkpoint, as training reports them: each validation set's
    mean loss over its fixed batches, and val_loss their mean weighted by the mixture weights (`Data.val_loss`).
    The per-source losses are keyed by source name, and empty when there is one validation set."""
    config = run.config
    count = batches if batches is not None else config.eval.batches
    check_eval_batches(count)  # before the data is built
    data = fp4lm.data.build(
        config.data,
        run_dir=run.run_dir,
        seed=config.train.seed,
        batch_size=config.train.batch_size,
        tokenizer=run.tokenizer,
    )  # reads only
    eval_loss = jax.jit(make_eval_step(run.apply))
    per_set = {
        name: float(np.mean(jax.device_get([eval_loss(run.params, b) for b in set_batches])))
        for name, set_batches in data.eval_sets(count).items()
    }
    return data.val_loss(per_set), (per_set if len(per_set) > 1 else {})
