"""Orbax checkpoints of a run: train state + data-iterator position + resolved config + tokenizer + the
precision switch made (fp4lm.train.bf16_switch: a raised train.steps must not move a switch already made).

Layout: RUN_DIR/checkpoints/<step>/{state, data_iter, config, tokenizer, fingerprint, precision}. Orbax writes
each checkpoint into a temporary directory and renames it into place only when every item is complete, so a process
killed mid-save leaves no half-written checkpoint that looks finished; leftover temporary directories are
removed when the next run opens the manager. Saves run in the background; `close()` waits for them.

Restoring walks from the newest checkpoint to older ones: a checkpoint that cannot be read (truncated or
corrupted files), whose arrays no longer match the fingerprint recorded when they were saved (bytes
changed in place), or that holds non-finite values is reported in one line and the previous one is used;
a training run then deletes the unusable one, so the step is saved again when the run gets there. When
no checkpoint is usable the run stops with one line and deletes nothing: starting afresh would discard it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import pathlib
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from fp4lm.errors import UserError
from fp4lm.train.orbax_echoes import OrbaxEchoes
from fp4lm.train.state import TrainState, all_state_finite
from fp4lm.train.validate import describe_os_error

_log = logging.getLogger(__name__)

CHECKPOINT_SUBDIR = "checkpoints"
ITEMS = ("state", "data_iter", "config", "tokenizer", "fingerprint", "precision")
# After a failed save, how long close() waits for Orbax's other writers to fail too (on a full disk, at once):
# each logs its error with a traceback as it ends, which must come while the echo filter is in place.
WORKERS_AFTER_FAILURE_S = 20.0


def _leaf_fingerprint(leaf: jax.Array) -> jax.Array:
    """A position-weighted sum of the leaf's 32-bit patterns, modulo 2^32 (exact whatever the sharding)."""
    leaf = jnp.asarray(leaf)
    if leaf.dtype.itemsize != 4:
        leaf = leaf.astype(jnp.float32)
    bits = jax.lax.bitcast_convert_type(leaf, jnp.uint32).reshape(-1)
    weights = jnp.arange(bits.size, dtype=jnp.uint32) * jnp.uint32(2654435761) + jnp.uint32(1)
    return jnp.sum(bits * weights, dtype=jnp.uint32)


@jax.jit
def _inspect(state: TrainState) -> tuple[jax.Array, list[jax.Array]]:
    """(all finite?, one fingerprint per leaf) of a train state."""
    return all_state_finite(state), [_leaf_fingerprint(leaf) for leaf in jax.tree.leaves(state)]


@dataclasses.dataclass
class Restored:
    step: int
    state: TrainState
    data_iter: Any  # the data iterator's JSON state
    config: dict
    tokenizer_json: str
    precision: dict | None = None  # {"bf16_after_step": int | None}; None: saved before this record existed


def checkpoint_dir(run_dir: str | pathlib.Path) -> pathlib.Path:
    return pathlib.Path(run_dir).resolve() / CHECKPOINT_SUBDIR


def has_complete_checkpoint(run_dir: str | pathlib.Path) -> bool:
    """Whether the run directory holds a complete checkpoint, without opening Orbax."""
    return holds_a_committed_step(checkpoint_dir(run_dir))


def holds_a_committed_step(directory: str | pathlib.Path) -> bool:
    """Whether a checkpoints folder (a run's, or one moved aside) holds a complete checkpoint: a checkpoint is
    named by its step only once complete (a save in progress is a temporary directory)."""
    try:
        return any(name.isdigit() for name in os.listdir(directory))
    except OSError:
        return False


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


def storage_error(error: BaseException, where: str) -> UserError | None:
    """A UserError for a failed write (disk full, permissions), or None when `error` is something else.

    Orbax / tensorstore raise ValueError("RESOURCE_EXHAUSTED: ... [os_error_code='28']") for OS errors."""
    code = error.errno if isinstance(error, OSError) else None
    found = re.search(r"os_error_code='?(\d+)", str(error))
    if code is None and found:
        code = int(found.group(1))
    if code is None and "No space left" in str(error):
        code = errno.ENOSPC
    if code is None:
        return None
    return UserError(describe_os_error(OSError(code, os.strerror(code)), where))


def _await_temporary_cleanup(manager: ocp.CheckpointManager) -> None:
    """Orbax's CheckpointManager removes leftover temporary directories in a background thread that its
    `close()` does not wait for: a process that ends soon after opening a run (a data error, say) had that
    thread fail at interpreter shutdown with a logged traceback. Wait for it (Orbax has no public call)."""
    wait = getattr(manager, "_maybe_await_cleanup_tmp_directory", None)
    if wait is not None:
        wait()


def _legacy_fields(abstract_state: TrainState) -> dict:
    """The restore target of a checkpoint written before `TrainState.router_biases`: the other fields."""
    return {
        field.name: getattr(abstract_state, field.name)
        for field in dataclasses.fields(abstract_state)
        if field.name != "router_biases"
    }


def _names_a_router_bias(tree) -> bool:
    if not hasattr(tree, "items"):
        return False
    return any(key == "router_bias" or _names_a_router_bias(value) for key, value in tree.items())


class Checkpointer:
    """Saves every `every` steps (and on request), keeps the newest `keep`, restores with fallback."""

    def __init__(
        self,
        run_dir,
        *,
        keep: int = 1,
        async_save: bool = True,
        log: Callable[[str], None] = print,
        read_only: bool = False,
    ):
        """`read_only`: for `fp4lm eval` / `sample`, which must not touch a run that may still be training."""
        self.directory = checkpoint_dir(run_dir)
        self.log = log
        self.read_only = read_only
        self._echoes = OrbaxEchoes()
        self._echoes.install()  # removed by close(); first, so Orbax's read-only notices are dropped too
        try:
            options = ocp.CheckpointManagerOptions(
                max_to_keep=None if read_only else keep,
                create=not read_only,
                cleanup_tmp_directories=not read_only,
                enable_async_checkpointing=async_save and not read_only,
                read_only=read_only,
                # Directories are made in save() itself: a failure (disk full, permissions) raises there,
                # instead of leaving Orbax's writer threads waiting up to 20 minutes for a signal that never comes.
                async_options=ocp.AsyncOptions(create_directories_asynchronously=False),
            )
            with self._echoes.settled_on_failure():
                self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)
        except BaseException:
            self._echoes.remove()
            raise

    def steps(self) -> list[int]:
        """Steps of complete checkpoints, oldest first."""
        self.manager.reload()
        return sorted(self.manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def save(
        self, step: int, state: TrainState, *, data_iter: Any, config: dict, tokenizer_json: str, precision: dict
    ) -> bool:
        """Starts an asynchronous save; refuses (logs, returns False) when the state is not all finite.
        `precision`: the switch to bf16 the run has made ({"bf16_after_step": int | None})."""
        finite, fingerprints = jax.device_get(_inspect(state))
        if not bool(finite):
            self.log(f"checkpoint at step {step} skipped: the train state holds non-finite values")
            return False
        if step in self.manager.all_steps():
            return False
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data_iter=ocp.args.JsonSave(data_iter),
            config=ocp.args.JsonSave(config),
            tokenizer=ocp.args.JsonSave({"json": tokenizer_json}),
            fingerprint=ocp.args.JsonSave({"leaves": [int(f) for f in fingerprints]}),
            precision=ocp.args.JsonSave(precision),
        )
        with self._storage_errors():
            return bool(self.manager.save(step, args=args, force=True))

    def restore_latest(self, abstract_state: TrainState) -> Restored | None:
        """The newest readable, finite checkpoint (None when there is none).

        `abstract_state` gives shapes, dtypes and shardings (jax.ShapeDtypeStruct leaves with `.sharding`).
        """
        steps = self.steps()
        unusable: list[int] = []
        first_problem = None
        for position in range(len(steps) - 1, -1, -1):
            step = steps[position]
            try:
                restored, problem = self.restore_step(step, abstract_state)
            except UserError:
                raise  # readable, but not to be resumed (restore_step says why)
            except Exception as error:  # noqa: BLE001 - any failure to read means: use an older one
                restored, problem = None, _first_line(error)
            if problem is None:
                self._remove(unusable)
                return restored
            unusable.append(step)
            first_problem = first_problem or problem
            if position == 0:
                # Starting afresh would discard the run; the user decides, and nothing is deleted.
                raise UserError(
                    f"no usable checkpoint in {self.directory} (the newest, step {steps[-1]}: {first_problem}); "
                    "move that directory away to start the run afresh, or choose another train.run_dir"
                )
            replaced = "" if self.read_only else " (it is removed and saved again when training gets there)"
            self.log(
                f"checkpoint at step {step} is unusable ({problem}); falling back to step "
                f"{steps[position - 1]}{replaced}"
            )
        return None

    def _remove(self, steps: list[int]) -> None:
        if not self.read_only:
            for step in steps:
                self.manager.delete(step)

    def restore_step(self, step: int, abstract_state: TrainState) -> tuple[Restored | None, str | None]:
        """Checkpoint `step`: (the checkpoint, None) or (None, what is wrong with it); `restore_latest` falls back
        from one to the next this way."""
        legacy = self._refuse_or_legacy(step)
        target = _legacy_fields(abstract_state) if legacy else abstract_state
        items = {
            "state": ocp.args.StandardRestore(target),
            "data_iter": ocp.args.JsonRestore(),
            "config": ocp.args.JsonRestore(),
            "tokenizer": ocp.args.JsonRestore(),
        }
        # Checkpoints written before fingerprints existed have no such item; they are checked for finiteness only.
        has_fingerprint = (self.directory / str(step) / "fingerprint").exists()
        if has_fingerprint:
            items["fingerprint"] = ocp.args.JsonRestore()
        has_precision = (self.directory / str(step) / "precision").exists()  # likewise
        if has_precision:
            items["precision"] = ocp.args.JsonRestore()
        with self._echoes.settled_on_failure():
            items = self.manager.restore(step, args=ocp.args.Composite(**items))
        state = TrainState(**items["state"], router_biases={}) if legacy else items["state"]
        finite, fingerprints = jax.device_get(_inspect(state))
        if has_fingerprint and [int(f) for f in fingerprints] != items["fingerprint"]["leaves"]:
            return None, "its arrays do not match the fingerprint saved with them: the files were changed"
        if not bool(finite):
            return None, "non-finite values"
        restored_step = int(np.asarray(jax.device_get(state.step)))
        if restored_step != step:
            return None, f"it holds the state of step {restored_step}"
        restored = Restored(
            step=step,
            state=state,
            data_iter=items["data_iter"],
            config=items["config"],
            tokenizer_json=items["tokenizer"]["json"],
            precision=items["precision"] if has_precision else None,
        )
        return restored, None

    def _refuse_or_legacy(self, step: int) -> bool:
        """Whether checkpoint `step` was written before the train state held the MoE routers' selection biases
        (`TrainState.router_biases`): it restores as it is, with no biases. One that held them among the
        parameters (with AdamW moments for them) is refused in one line."""
        saved: Any = ocp.StandardCheckpointHandler().metadata(epath.Path(self.directory / str(step) / "state"))
        if saved is None:
            raise ValueError("its state has no tree metadata")
        if "router_biases" in saved:
            return False
        if _names_a_router_bias(saved["params"]):
            raise UserError(
                f"checkpoint {step} in {self.directory} holds model.router_bias_update's selection biases among "
                "the parameters, as fp4lm wrote them before they became train state of their own; resume it "
                "with the fp4lm that wrote it, or start this run afresh in another train.run_dir"
            )
        return True

    def read_config(self) -> dict | None:
        """The resolved config saved with the newest readable checkpoint (None when there is none)."""
        for step in reversed(self.steps()):
            try:
                with self._echoes.settled_on_failure():
                    only_config = ocp.args.Composite(config=ocp.args.JsonRestore())
                    return self.manager.restore(step, args=only_config)["config"]
            except Exception as error:  # noqa: BLE001 - unreadable: try the previous one
                _log.info(
                    "the config saved at step %d cannot be read (%s); trying the previous one", step, _first_line(error)
                )
        return None

    def wait(self) -> None:
        with self._storage_errors():
            self.manager.wait_until_finished()

    def close(self) -> None:
        """Waits for saves in flight, then releases Orbax's threads (also when the wait failed)."""
        try:
            try:
                with self._storage_errors():
                    self.manager.wait_until_finished()
                    _await_temporary_cleanup(self.manager)
            except BaseException:
                with contextlib.suppress(Exception):  # the wait's error is the one to report
                    self.manager.close()
                self._echoes.drain(WORKERS_AFTER_FAILURE_S)  # their own reports of it, still filtered
                raise
            with self._storage_errors():
                self.manager.close()
        finally:
            self._echoes.remove()

    @contextlib.contextmanager
    def _storage_errors(self):
        """A failed write (here or in a background save finishing now) becomes a one-line UserError."""
        try:
            with self._echoes.settled_on_failure():
                yield
        except Exception as error:  # noqa: BLE001 - re-raised unless it is a storage error
            translated = storage_error(error, f"a checkpoint in {self.directory}")
            if translated is None:
                raise
            raise translated from None
