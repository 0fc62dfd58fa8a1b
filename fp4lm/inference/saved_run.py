"""A trained run read back from its directory, for `fp4lm eval` and `fp4lm sample`: read only (the checkpoint
holds the config and the tokenizer; the token cache is used when present, never written)."""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from collections.abc import Callable

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
from fp4lm.train.run_dir import moved_aside_checkpoints
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
    params: dict  # the model variables: parameters and the routers' biases (TrainState.model_variables)
    apply: ApplyFn  # apply(params, tokens) -> logits, with the policy in force at `step`
    policy: Policy  # that policy


@dataclasses.dataclass
class SavedCheckpoint:
    """One checkpoint of a run directory as the trainer reads it back on one device."""

    run_dir: pathlib.Path
    config: Config
    quantized_policy: Policy  # the policy before any late switch to bf16
    setup: RunSetup
    restored: Restored

    @property
    def bf16_switch(self) -> int | None:
        """The step after which the run trained in bf16, as the checkpoint records it (None: not by its step)."""
        restored = self.restored
        return model_setup.bf16_switch_made(restored.step, restored.config, restored.precision)


def read_checkpoint(run_dir: str, step: int | None = None) -> SavedCheckpoint:
    """Checkpoint `step` of `run_dir` (None: the newest usable one), read only, on one device, with the config
    and tokenizer saved beside it; the same fingerprint and finiteness checks as resuming."""
    path = pathlib.Path(run_dir)
    moved = moved_aside_checkpoints(path)
    if not checkpoint_dir(path).is_dir():
        fix = _move_back(moved, path) or "pass a run directory that `fp4lm train` wrote (train.run_dir)"
        raise UserError(f"{run_dir} has no checkpoints; {fix}")
    checkpointer = Checkpointer(path, read_only=True, async_save=False)
    try:
        saved = checkpointer.read_config()
        if saved is None:
            fix = _move_back(moved, path) or "wait for the first save (checkpoint.every)"
            raise UserError(f"{run_dir} has no complete checkpoint yet; {fix}")
        config = from_dict(saved, source=f"{run_dir} checkpoint config")
        config = dataclasses.replace(config, mesh=MeshConfig(data=1, fsdp=1, tensor=1))
        validate(config)
        use_compilation_cache(config.train.compilation_cache_dir)
        check_config_for_training(config)
        quantized = Policy.from_config(config)
        mesh = make_mesh(config.mesh, devices=jax.local_devices()[:1])
        setup = build_run(config, mesh, quantized, _model_vocab_size(run_dir, config))  # as trained
        restored = _restore(checkpointer, step, setup.restore_target(), run_dir)
    finally:
        checkpointer.close()
    return SavedCheckpoint(path, config, quantized, setup, restored)


def _move_back(moved: list[pathlib.Path], run_dir: pathlib.Path) -> str | None:
    """The fix when the run's checkpoints were moved aside (a --force of an earlier fp4lm): put them back."""
    if not moved:
        return None
    return f"its checkpoints were moved to {moved[-1]}: rename that folder back to {checkpoint_dir(run_dir)}"


def _restore(checkpointer: Checkpointer, step: int | None, target, run_dir: str) -> Restored:
    """Checkpoint `step`, or the newest usable one (a damaged newer one is named on stderr); a damaged checkpoint
    is one line naming its directory, never a library traceback."""
    steps = checkpointer.steps()
    listed = ", ".join(str(s) for s in steps) or "none"
    if step is not None and step not in steps:
        raise UserError(f"{run_dir} has no checkpoint at step {step} (saved steps: {listed}); pass one of those")
    if not steps:
        raise UserError(f"no usable checkpoint in {run_dir}; train again (a new train.run_dir)")
    problems: list[str] = []  # "DIR: what is wrong", newest first
    for candidate in [step] if step is not None else steps[::-1]:
        restored, problem = _restore_step(checkpointer, candidate, target)
        if restored is not None:
            for damaged in problems:  # said only when an older checkpoint serves instead
                print(f"note: the checkpoint {damaged} is damaged; using step {candidate}", file=sys.stderr)
            return restored
        problems.append(f"{checkpoint_dir(pathlib.Path(run_dir)) / str(candidate)} ({problem})")
    if step is not None:
        others = ", ".join(str(s) for s in steps if s != step)
        fix = f"pick another --step ({others})" if others else "restore the run directory from a copy"
        raise UserError(f"the checkpoint at step {step} is damaged: {problems[0]}; {fix}")
    raise UserError(
        f"every checkpoint of {run_dir} is damaged (the newest: {problems[0]}); restore the run directory from "
        "a copy, or train again"
    )


def _restore_step(checkpointer: Checkpointer, step: int, target) -> tuple[Restored | None, str]:
    """(the checkpoint, "") or (None, what is wrong with it, in a few words)."""
    try:
        restored, problem = checkpointer.restore_step(step, target)
    except Exception as error:  # noqa: BLE001 - a damaged file makes Orbax/TensorStore raise anything
        restored, problem = None, f"{type(error).__name__}: {str(error).strip()}"
    problem = (problem or "").splitlines()[0] if problem else ""
    problem = problem.split(". See full TensorStore details")[0]
    return restored, problem[:160]


def _model_vocab_size(run_dir: str, config: Config) -> int:
    """The model vocabulary as trained, from the run's saved tokenizer; a damaged one is named as the run's file
    (the reader's own fix, a data.tokenizer setting, does not apply to a finished run)."""
    try:
        return saved_model_vocab_size(run_dir, config.data)
    except UserError as error:
        raise UserError(
            f"the run's tokenizer is damaged: {str(error).split(';')[0]}; restore the run directory {run_dir} from "
            "a copy (the run writes its tokenizer once, when it starts)"
        ) from None


def load_run(run_dir: str) -> SavedRun:
    """The newest usable checkpoint of `run_dir` (on one device), with its config and tokenizer."""
    saved = read_checkpoint(run_dir)
    step = saved.restored.step
    policy = model_setup.policy_at(step, saved.config, saved.quantized_policy, switch=saved.bf16_switch)
    apply = RunFunctions.apply_only(saved.setup.model, policy)
    tokenizer = tokenizer_from_json(saved.restored.tokenizer_json, origin=f"{run_dir} checkpoint tokenizer")
    return SavedRun(saved.run_dir, saved.config, step, tokenizer, saved.restored.state.model_variables(), apply, policy)


def check_eval_batches(batches: int | None) -> None:
    """`fp4lm eval --batches`: at least one (None: the run's eval.batches). Checked before loading the run."""
    if batches is not None and batches <= 0:
        raise UserError(f"--batches {batches}: evaluate at least one batch, e.g. --batches 8")


def evaluate(run: SavedRun, *, batches: int | None = None) -> float:
    """The run checkpoint's validation loss over its fixed validation batches (see `evaluate_sources`)."""
    return evaluate_sources(run, batches=batches)[0]


def evaluate_sources(
    run: SavedRun, *, batches: int | None = None, log: Callable[[str], object] | None = None
) -> tuple[float, dict[str, float]]:
    """(val_loss, per-source losses) of the run's checkpoint, as training reports them: each validation set's
    mean loss over its fixed batches, and val_loss their mean weighted by the mixture weights (`Data.val_loss`).
    The per-source losses are keyed by source name, and empty when there is one validation set. `batches`
    beyond what a validation set holds evaluates all it has; `log` gets a note saying so."""
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
    sets = data.eval_sets(count)
    held = min(len(set_batches) for set_batches in sets.values())
    if log is not None and batches is not None and held < batches:
        log(f"note: --batches {batches:,}: the validation data holds {held:,} batches; evaluated all of them")
    per_set = {
        name: float(np.mean(jax.device_get([eval_loss(run.params, b) for b in set_batches])))
        for name, set_batches in sets.items()
    }
    return data.val_loss(per_set), (per_set if len(per_set) > 1 else {})
