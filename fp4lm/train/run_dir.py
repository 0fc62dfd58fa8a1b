"""The directory train.run_dir names, and what `fp4lm train` may do with it.

fp4lm marks a run directory by writing RUN_DIR/config.json (the run's resolved config) first, atomically.
`inspect_run_dir` only reads, and finds one of:

- new: the directory does not exist, or is empty (fp4lm's lock file and unfinished temporary files aside);
- resume: it holds a complete checkpoint: the run resumes from the newest usable one;
- restart: fp4lm's config.json, no complete checkpoint and no summary.json, with checkpoint.enabled: a run
  stopped before its first checkpoint, which starts again from step 0;
- refused: anything else: a user's files, or an fp4lm run that cannot be resumed (finished without
  checkpoints, or made with checkpoint.enabled=false), whose results training would overwrite;
- move aside: with train.overwrite=true (`fp4lm train --force`) a directory that is not empty is renamed to
  RUN_DIR.old-<YYYYmmdd-HHMMSS> beside it (never deleted) and the run starts afresh.

A directory inside another training run (its checkpoints/, any folder below it) is refused, with or without
--force, and so is a --force onto a directory that holds other training runs: moving it would take their
checkpoints away (`refuse_inside_training_run`, which `fp4lm export --out` and `fp4lm compare --out` use too).

`RunDirClaim` (the main process, once every check has passed) makes the directory ready and holds its lock
for the run. A directory that this command created is removed again if the set-up fails before
`set_up_done()`, and one it moved aside is renamed back, so a refused command leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil

from fp4lm.config import Config, from_dict, load_config, load_value, load_yaml, parse_override
from fp4lm.errors import UserError
from fp4lm.jsonio import write_json_atomically
from fp4lm.train.checkpoint import CHECKPOINT_SUBDIR, Checkpointer, has_complete_checkpoint, holds_a_committed_step
from fp4lm.train.metrics import METRICS_FILE
from fp4lm.train.run_lock import LOCK_FILE, RunDirLock
from fp4lm.train.validate import check_resume_compatible, describe_os_error
from fp4lm.user_dirs import holds, move_aside

RUN_CONFIG_FILE = "config.json"
SUMMARY_FILE = "summary.json"
NEW, RESUME, RESTART, REFUSED, MOVE_ASIDE = "new", "resume", "restart", "refused", "move aside"


@dataclasses.dataclass(frozen=True)
class RunDir:
    path: pathlib.Path
    setting: str  # train.run_dir as given
    kind: str  # NEW, RESUME, RESTART, REFUSED or MOVE_ASIDE
    problem: str = ""  # why a REFUSED directory is refused
    fix: str = ""  # what to do instead, when the general fix (a new train.run_dir, or --force) is not the best

    @property
    def reusable(self) -> pathlib.Path | None:
        """The directory whose tokenizer and token cache the run reuses (None: it starts from nothing)."""
        return self.path if self.kind in (RESUME, RESTART) else None

    def saved_config(self) -> dict | None:
        """The run's saved config: the newest checkpoint's (resume), config.json (restart), else None."""
        if self.kind == RESTART:
            return _read_marker(self.path)
        if self.kind != RESUME:
            return None
        checkpointer = Checkpointer(self.path, read_only=True, async_save=False)
        try:
            return checkpointer.read_config()
        finally:
            checkpointer.close()

    def latest_config(self) -> dict | None:
        """The run's latest settings, the base of `fp4lm train train.run_dir=X`: config.json, rewritten
        (atomically) at each accepted start, so it holds a change made after the newest checkpoint (a raised
        train.steps, a switched recipe); else the newest checkpoint's config. None: nothing to continue."""
        if self.kind not in (RESUME, RESTART):
            return None
        marker = _read_marker(self.path)
        return marker if marker is not None else self.saved_config()

    def check_accepted(self) -> None:
        """A one-line UserError for a refused directory."""
        if self.kind == REFUSED:
            raise UserError(
                f"{self.problem}; {self.fix or 'choose a new train.run_dir'}, or start over there with `fp4lm train "
                f"--force` (train.overwrite=true), which moves its contents to {self.path.name}.old-<date-time>/ "
                "beside it"
            )


def inspect_run_dir(setting: str, *, overwrite: bool = False) -> RunDir:
    """What train.run_dir=`setting` holds (reads only)."""
    if not setting.strip():
        raise UserError("train.run_dir is empty; name the run's directory, e.g. train.run_dir=runs/my_run")
    path = pathlib.Path(setting)
    if path.exists() and not path.is_dir():
        raise UserError(f"train.run_dir={setting} exists and is not a directory; choose another train.run_dir")
    refuse_inside_training_run(path, f"train.run_dir={setting}")
    try:
        entries = sorted(name for name in os.listdir(path) if not _left_by_a_start(name))
    except (FileNotFoundError, NotADirectoryError):  # created later (which names a path below a file)
        return RunDir(path, setting, NEW)
    except OSError as error:
        raise UserError(describe_os_error(error, f"train.run_dir={setting}")) from None
    if not entries:
        return RunDir(path, setting, NEW)
    if overwrite:
        if holds(path, pathlib.Path.cwd()):
            raise UserError(
                f"train.run_dir={setting} holds the current directory, which train.overwrite would move aside; "
                "name a directory of its own for the run, e.g. train.run_dir=runs/my_run"
            )
        other = None if training_run_markers(path) else find_training_run(path)
        if other is not None:
            raise UserError(
                f"train.run_dir={setting} holds the fp4lm training run {other}, which train.overwrite would move "
                "aside with it; name a directory of its own for the run, e.g. train.run_dir=runs/my_run"
            )
        return RunDir(path, setting, MOVE_ASIDE)
    if has_complete_checkpoint(path):
        return RunDir(path, setting, RESUME)
    moved = moved_aside_checkpoints(path)
    if moved:
        problem = f"train.run_dir={setting} has no checkpoints/ but its checkpoints were moved to {moved[-1]}"
        fix = f"rename that folder back to {path / CHECKPOINT_SUBDIR} to resume the run"
        return RunDir(path, setting, REFUSED, problem, fix)
    marker = _read_marker(path)
    finished = (path / SUMMARY_FILE).exists()
    if marker is not None and not finished and marker.get("checkpoint", {}).get("enabled", True):
        return RunDir(path, setting, RESTART)
    if marker is None and _is_hf_checkpoint(path):
        problem = f"train.run_dir={setting} holds a Hugging Face checkpoint (an export), not an fp4lm run to resume"
        fix = f"to train from its weights, pass train.init_from={setting} and a new train.run_dir"
        return RunDir(path, setting, REFUSED, problem, fix)
    if marker is None:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        problem = f"train.run_dir={setting} is not empty ({shown}) and holds no fp4lm checkpoint to resume"
    elif finished:
        problem = f"train.run_dir={setting} holds a finished run without checkpoints, which cannot be resumed"
    else:
        problem = f"train.run_dir={setting} holds a run made with checkpoint.enabled=false, which cannot be resumed"
    return RunDir(path, setting, REFUSED, problem + ": training there would overwrite its results")


def training_run_markers(path: pathlib.Path) -> list[str]:
    """The names in `path` that make it an fp4lm training run: its checkpoints, metrics, summary, or its
    config.json when that is fp4lm's (a Hugging Face export's config.json is not)."""
    found = [name for name in (CHECKPOINT_SUBDIR, METRICS_FILE, SUMMARY_FILE) if (path / name).exists()]
    return [*found, RUN_CONFIG_FILE] if _holds_run_config(path) else found


def is_training_run(path: pathlib.Path) -> bool:
    """Whether `path` is an fp4lm training run: fp4lm's config.json (written first, by every run) or a
    complete checkpoint. Stricter than `training_run_markers`, so that a user's own folder that happens to hold
    a checkpoints/ or a metrics.jsonl is not taken for one when its subfolders are checked."""
    return _holds_run_config(path) or has_complete_checkpoint(path)


def _holds_run_config(path: pathlib.Path) -> bool:
    """Whether `path` holds the config.json of an fp4lm training run (an export's or a bare marker's is not)."""
    marker = _read_marker(path)
    return marker is not None and isinstance(marker.get("train"), dict)


def enclosing_training_run(path: str | os.PathLike) -> pathlib.Path | None:
    """The fp4lm training run that `path` lies inside, below its top (None: none); symbolic links resolved."""
    return next((parent for parent in pathlib.Path(path).resolve().parents if is_training_run(parent)), None)


def refuse_inside_training_run(path: str | os.PathLike, flag: str) -> None:
    """A one-line UserError when `path` (named by `flag`, e.g. "--out X") lies inside a training run: writing or
    moving anything there (its checkpoints/ above all) would leave the run unable to resume, evaluate or export."""
    run = enclosing_training_run(path)
    if run is not None:
        raise UserError(
            f"{flag} lies inside the fp4lm training run {run}, whose files fp4lm will not replace or add to; "
            "choose a directory outside it"
        )


def moved_aside_checkpoints(run_dir: pathlib.Path) -> list[pathlib.Path]:
    """Folders beside `run_dir`'s checkpoints/ named checkpoints.old-<date-time> (what a --force of an earlier
    fp4lm moved aside) that hold a complete checkpoint, oldest first."""
    return [path for path in sorted(run_dir.glob(f"{CHECKPOINT_SUBDIR}.old-*")) if holds_a_committed_step(path)]


def find_training_run(directory: pathlib.Path) -> pathlib.Path | None:
    """The first fp4lm training run at or below `directory` (None: none there)."""
    for parent, subdirs, _ in os.walk(directory):
        if training_run_markers(pathlib.Path(parent)):
            return pathlib.Path(parent)
        subdirs.sort()
    return None


def started_run_config(run_dir: pathlib.Path) -> dict | None:
    """The settings of the latest start of the run in `run_dir`: its config.json, which every run writes first
    and rewrites at each accepted start (None: no run was started there)."""
    return _read_marker(run_dir)


def _left_by_a_start(name: str) -> bool:
    """What a `fp4lm train` killed right at its start may leave in a new directory: the lock file, and the
    temporary file of an atomic write (fp4lm.jsonio) that did not finish."""
    return name == LOCK_FILE or (name.startswith(".") and name.endswith(".tmp"))


def _read_json(path: pathlib.Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _read_marker(run_dir: pathlib.Path) -> dict | None:
    """fp4lm's config.json in `run_dir` (None: none, or another tool's config.json, such as an export's)."""
    marker = _read_json(run_dir / RUN_CONFIG_FILE)
    sections = {field.name for field in dataclasses.fields(Config)}
    return marker if isinstance(marker, dict) and set(marker) <= sections else None


def _is_hf_checkpoint(path: pathlib.Path) -> bool:
    """A Hugging Face model directory (`fp4lm export`'s output): its config.json names an architecture."""
    found = _read_json(path / RUN_CONFIG_FILE)
    return isinstance(found, dict) and ("architectures" in found or "model_type" in found)


def _make_dirs(path: pathlib.Path) -> pathlib.Path | None:
    """Creates `path` and missing parents; returns the top-most directory created (None: it existed)."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    return missing[-1] if missing else None


class RunDirClaim:
    """The main process's hold on the run directory, for the whole run (see the module docstring)."""

    def __init__(self, run: RunDir, config: dict):
        self.run, self.config = run, config
        self.moved_to: pathlib.Path | None = None
        self._done = False
        self._created: pathlib.Path | None = None
        self._lock: RunDirLock | None = None

    def __enter__(self) -> RunDirClaim:
        run, where = self.run, f"train.run_dir={self.run.setting}"
        try:
            if run.kind == MOVE_ASIDE:
                with RunDirLock(run.path, run_dir_setting=run.setting, create=False):  # not while in use
                    self.moved_to = move_aside(run.path)
            self._created = _make_dirs(run.path)
            self._lock = RunDirLock(run.path, run_dir_setting=run.setting).__enter__()
            if run.kind in (NEW, MOVE_ASIDE):
                write_json_atomically(run.path / RUN_CONFIG_FILE, self.config)  # the mark of an fp4lm run
            else:
                _prove_writable(run.path)
        except BaseException as error:
            self.__exit__(type(error), error, None)
            if isinstance(error, OSError):
                raise UserError(describe_os_error(error, where)) from None
            raise
        return self

    def set_up_done(self) -> None:
        """From here on the directory is the run's: it is kept whatever happens."""
        self._created = None
        self._done = True

    def __exit__(self, exc_type, exc, traceback) -> None:
        if self._lock is not None:
            self._lock.__exit__(exc_type, exc, traceback)
            self._lock = None
        if exc_type is not None and self._created is not None:
            shutil.rmtree(self._created, ignore_errors=True)  # made by this command, which failed to set up
            self._created = None
        if exc_type is not None and not self._done and self.moved_to is not None:
            try:  # the user's directory, moved aside by a set-up that did not finish: renamed back
                os.rename(self.moved_to, self.run.path)
                self.moved_to = None
            except OSError:
                pass  # kept under its new name


def _prove_writable(path: pathlib.Path) -> None:
    probe = path / f".write_probe_{os.getpid()}"
    probe.write_bytes(b"ok")
    probe.unlink()


def _unvalidated(config_path: str | None, overrides: list[str]) -> Config:
    """defaults <- CONFIG.yaml <- overrides, not validated: only to find train.run_dir and train.overwrite."""
    config = Config()
    if config_path is not None:
        config = from_dict(load_yaml(config_path), config, source=config_path)
    for text in overrides:
        section, key, value = parse_override(text)
        config = from_dict({section: {key: load_value(value, f"{section}.{key}")}}, config)
    return config


def load_train_config(config_path: str | None, overrides: list[str]) -> Config:
    """The config of `fp4lm train [CONFIG.yaml] [overrides]`: defaults <- CONFIG.yaml <- overrides, except that
    when train.run_dir holds a run to continue, the run's latest config (`RunDir.latest_config`) takes the
    place of the defaults (the file and the overrides still apply on top; train.overwrite=true starts over
    from the defaults). Validated once, at the end: an override is checked against the base it applies to."""
    found = _unvalidated(config_path, overrides)
    if found.train.overwrite:
        return load_config(config_path, overrides)
    run = inspect_run_dir(found.train.run_dir)
    latest = run.latest_config()
    if latest is None:
        return load_config(config_path, overrides)
    base = from_dict(latest, source=f"the config saved in train.run_dir={run.setting}")
    base = dataclasses.replace(
        base,
        train=dataclasses.replace(base.train, run_dir=found.train.run_dir, overwrite=False, allow_recipe_change=False),
    )
    config = load_config(config_path, overrides, base=base)
    trained = run.saved_config() or {}
    trained_recipe = trained.get("precision", {}).get("recipe", config.precision.recipe)
    if config.precision.recipe == base.precision.recipe != trained_recipe:
        # A recipe switch accepted at an earlier start (train.allow_recipe_change=true), not yet checkpointed.
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, allow_recipe_change=True))
    return config


def resolve_train_config(config_path: str | None, overrides: list[str]) -> Config:
    """The config `fp4lm train` trains and `fp4lm train --dry-run` compiles (one function, so the two agree):
    `load_train_config` (an existing run's latest config is the base), then the model shape and tokenizer of
    train.init_from's checkpoint (fp4lm.hf.init_from)."""
    config = load_train_config(config_path, overrides)
    _check_init_from_unchanged(config)
    if config.train.init_from:
        from fp4lm.hf.init_from import config_from_checkpoint

        config = config_from_checkpoint(config)
    return config


def _check_init_from_unchanged(config: Config) -> None:
    """train.init_from only starts a run: on a run to continue it must be the one the run started from (else
    the checkpoint's shape would be blamed on settings the user never gave, or the new weights ignored)."""
    if config.train.overwrite:
        return
    run = inspect_run_dir(config.train.run_dir)
    latest = run.latest_config()
    if latest is None:
        return
    started_from = latest.get("train", {}).get("init_from") or None
    asked = config.train.init_from or None
    if started_from == asked or (started_from and asked and os.path.abspath(started_from) == os.path.abspath(asked)):
        return
    origin = f"from train.init_from={started_from}" if started_from else "from scratch (no train.init_from)"
    raise UserError(
        f"train.init_from={asked or '(none)'}: train.run_dir={run.setting} holds a run started {origin}, which "
        "continues from its own checkpoints; leave train.init_from out to resume it, or start a new run from the "
        "checkpoint in a new train.run_dir"
    )


def check_run_dir_accepts(config: Config) -> RunDir:
    """What `train` checks of train.run_dir before it builds anything (fp4lm.train.loop.train, and the dry run),
    reading only: a refused directory, and the settings a resumed run must keep. Returns the directory."""
    target = inspect_run_dir(config.train.run_dir, overwrite=config.train.overwrite)
    target.check_accepted()
    saved = target.saved_config()
    if saved is not None:
        check_resume_compatible(saved, config)
    return target
