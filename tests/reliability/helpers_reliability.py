"""Shared pieces of the reliability tests: a tiny run config, the CLI in a subprocess or in-process,
metrics.jsonl parsing, and reading checkpoints back with Orbax the way a later run would.

The runs use the tiny model and data (fp4lm.config.tiny); each reuses one JAX persistent compilation cache,
so only the first process of a given configuration pays for XLA compilation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

from fp4lm.config.tiny import TINY_DATA, TINY_MODEL
from tests.compile_flags import xla_flags

REPO = pathlib.Path(__file__).resolve().parents[2]

QUIET = [
    "metrics.log_every=1",
    "metrics.quant_stats_every=1000",
    "metrics.tensorboard=false",
    "metrics.progress=plain",
    "eval.batches=1",
    "eval.sample_tokens=0",
    "optimizer.warmup_steps=5",
]
# Fields of a training record that must be identical between two runs of one config (timings excluded).
DETERMINISTIC_FIELDS = ("step", "loss", "lr", "grad_norm", "loss_scale", "skipped_steps")
SUMMARY_FIELDS = ("steps", "final_train_loss", "final_val_loss", "skipped_steps", "param_count", "recipe")


def write_corpus(path: pathlib.Path, *, lines: int = 900, seed: int = 0) -> pathlib.Path:
    """A small, learnable plain-text corpus (~45 kB of ASCII)."""
    rng = random.Random(seed)
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "a",
        "lazy",
        "dog",
        "while",
        "seven",
        "cats",
        "sing",
        "of",
        "rain",
        "and",
        "the",
        "sea",
    ]
    path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(10)) for _ in range(lines)) + "\n")
    return path


def tiny_overrides(
    corpus: pathlib.Path, cache_dir: pathlib.Path | None, run_dir: pathlib.Path, *extra: str
) -> list[str]:
    cache = [f"train.compilation_cache_dir={cache_dir}"] if cache_dir is not None else []
    return [*TINY_MODEL, *TINY_DATA, *QUIET, f"data.path={corpus}", *cache, f"train.run_dir={run_dir}", *extra]


def train_tiny_run(root: pathlib.Path, *extra: str, lines: int = 200) -> pathlib.Path:
    """Trains the tiny model on a fresh corpus in `root` (`fp4lm train` with `extra` overrides, in this process:
    the callers need a trained run, not a fresh process); returns the run directory, root/run."""
    run_dir = root / "run"
    overrides = tiny_overrides(write_corpus(root / "corpus.txt", lines=lines), root / "cache", run_dir, *extra)
    result = run_cli_in_process("train", *overrides)
    assert result.code == 0, result.stderr
    return run_dir


def subprocess_env() -> dict[str, str]:
    """CPU only, one device, and a persistent compilation cache that keeps even small programs."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"XLA_FLAGS": xla_flags()}
    env.update(
        JAX_PLATFORMS="cpu",
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        PYTHONPATH=str(REPO),
    )
    return env


def fp4lm_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "fp4lm", *args]


@dataclasses.dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip() and not _is_library_noise(line)]


def _is_library_noise(line: str) -> bool:
    """Log lines that libraries print on stderr on their own (absl warnings), not fp4lm's answer."""
    return line.startswith(("WARNING:absl:", "I0000", "W0000", "E0000"))


def run_cli(*args: str, timeout: float = 300, cwd: pathlib.Path | None = None) -> Result:
    """`python -m fp4lm ARGS` in a fresh process."""
    done = subprocess.run(
        fp4lm_command(*args), capture_output=True, text=True, timeout=timeout, env=subprocess_env(), cwd=cwd or REPO
    )
    return Result(done.returncode, done.stdout, done.stderr)


WAIT_S = 240


class TrainProcess:
    """One `fp4lm train` process whose output goes to files, so the test can watch its progress."""

    def __init__(self, args: list[str], log_dir, attempt: int):
        env = subprocess_env() | {"PYTHONUNBUFFERED": "1"}
        self.stdout_path = log_dir / f"attempt{attempt}.out"
        self.stderr_path = log_dir / f"attempt{attempt}.err"
        with self.stdout_path.open("w") as out, self.stderr_path.open("w") as err:
            self.popen = subprocess.Popen(fp4lm_command("train", *args), stdout=out, stderr=err, env=env)
        self.started = time.monotonic()
        self.started_wall = time.time()

    def running(self) -> bool:
        return self.popen.poll() is None

    def resumed_from(self) -> int | None:
        """The step the process resumed from, once its banner is out (stale metrics are dropped by then)."""
        for line in self.stdout_path.read_text().splitlines():
            if line.startswith("fp4lm train:"):
                if "resuming from step" in line:
                    return int(line.split("resuming from step ")[1].split(")")[0])
                return 0
        return None

    def wait_for(self, condition, timeout: float = WAIT_S, poll_s: float = 0.002) -> bool:
        """Polls `condition()` until true (True) or the process ends first (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            if not self.running():
                return bool(condition())
            time.sleep(poll_s)
        raise AssertionError(f"timed out; see {self.stdout_path} and {self.stderr_path}")

    def kill(self) -> bool:
        """SIGKILL; False when the process had already exited."""
        if not self.running():
            return False
        os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait()
        return True


def run_cli_in_process(*args: str) -> Result:
    """`fp4lm.cli.main(ARGS)` in this process: stdout/stderr captured, the SystemExit code returned.

    Anything escaping main() other than SystemExit is a bug (a traceback for the user), so it propagates.
    """
    from fp4lm import cli

    out, err = io.StringIO(), io.StringIO()
    code = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main(list(args))
        except SystemExit as exit_:
            code = exit_.code
    assert code is not None, "fp4lm.cli.main returned without sys.exit"
    return Result(int(code), out.getvalue(), err.getvalue())


# How a one-line answer shows the way out: "<problem>; <fix>" (the team's form), or a valid example / range.
FIX_MARKERS = ("; ", "e.g.", "one of", "must be", "must divide", "may be")


def names_a_fix(line: str) -> bool:
    return any(marker in line for marker in FIX_MARKERS)


def assert_one_line_user_error(result: Result, *, expect_in: tuple[str, ...] = ()) -> str:
    """Exit code 2, no traceback, exactly one 'error: <problem>; <fix>' line on stderr; returns the line."""
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr[-3000:]
    assert result.code == 2, (result.code, result.stderr[-3000:])
    lines = result.error_lines
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("error: "), line
    assert names_a_fix(line), f"the message names no fix (expected '<problem>; <fix>'): {line}"
    for text in expect_in:
        assert text in line, (text, line)
    return line


# ------------------------------------------------------------------ metrics.jsonl and summary.json


def metrics_lines(run_dir: pathlib.Path) -> list[str]:
    path = run_dir / "metrics.jsonl"
    return path.read_text(encoding="utf-8").splitlines() if path.is_file() else []


def metrics_records(run_dir: pathlib.Path) -> list[dict]:
    """All records; a line that is not one complete JSON object fails the test (torn write)."""
    records = []
    for number, line in enumerate(metrics_lines(run_dir), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise AssertionError(f"metrics.jsonl line {number} is torn: {line[:120]!r} ({error})") from None
        assert isinstance(record, dict), line
        records.append(record)
    return records


def train_records(run_dir: pathlib.Path) -> list[dict]:
    return [{k: r[k] for k in DETERMINISTIC_FIELDS} for r in metrics_records(run_dir) if "loss" in r]


def eval_records(run_dir: pathlib.Path) -> list[dict]:
    return [r for r in metrics_records(run_dir) if "val_loss" in r]


def summary_fields(run_dir: pathlib.Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    return {k: summary[k] for k in SUMMARY_FIELDS}


def last_metrics_step(run_dir: pathlib.Path) -> int:
    """The highest step among complete training lines of metrics.jsonl (0 if none); tolerates a torn tail."""
    best = 0
    for line in metrics_lines(run_dir):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "loss" in record:
            best = max(best, int(record["step"]))
    return best


# ------------------------------------------------------------------ files


def snapshot(directory: pathlib.Path) -> dict[str, str]:
    """relative path -> sha256 of every file below `directory` (to prove nothing was written)."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


# ------------------------------------------------------------------ checkpoints, read as a later run would


def checkpoint_root(run_dir: pathlib.Path) -> pathlib.Path:
    return run_dir / "checkpoints"


def committed_steps(run_dir: pathlib.Path) -> list[int]:
    """Steps whose checkpoint Orbax considers complete (temporary, uncommitted directories excluded)."""
    import orbax.checkpoint as ocp

    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    manager = ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(read_only=True))
    try:
        return sorted(manager.all_steps())
    finally:
        manager.close()


def temporary_entries(run_dir: pathlib.Path) -> list[str]:
    root = checkpoint_root(run_dir)
    return sorted(p.name for p in root.iterdir() if "tmp" in p.name) if root.is_dir() else []


def restore_checkpoint(run_dir: pathlib.Path, step: int) -> dict:
    """Every item of checkpoint `step` as saved (state as numpy arrays), restored with Orbax."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    manager = ocp.CheckpointManager(
        checkpoint_root(run_dir),
        options=ocp.CheckpointManagerOptions(read_only=True),
        item_names=("state", "data_iter", "config", "tokenizer"),
    )
    try:
        items = manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(),
                data_iter=ocp.args.JsonRestore(),
                config=ocp.args.JsonRestore(),
                tokenizer=ocp.args.JsonRestore(),
            ),
        )
    finally:
        manager.close()
    state = jax.tree.map(np.asarray, items.state)
    return {"state": state, "data_iter": items.data_iter, "config": items.config, "tokenizer": items.tokenizer}


def state_leaves(state) -> dict[str, object]:
    import jax

    flat, _ = jax.tree_util.tree_flatten_with_path(state)
    return {jax.tree_util.keystr(path): leaf for path, leaf in flat}


def assert_state_finite(state) -> None:
    import numpy as np

    for name, leaf in state_leaves(state).items():
        if np.issubdtype(leaf.dtype, np.floating):
            assert np.all(np.isfinite(leaf)), f"checkpoint leaf {name} holds non-finite values"


def assert_states_bit_equal(a, b) -> None:
    import numpy as np

    leaves_a, leaves_b = state_leaves(a), state_leaves(b)
    assert leaves_a.keys() == leaves_b.keys()
    for name in leaves_a:
        x, y = np.asarray(leaves_a[name]), np.asarray(leaves_b[name])
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert x.tobytes() == y.tobytes(), f"checkpoint leaf {name} differs"


def checkpoint_step_of(restored: dict) -> int:
    import numpy as np

    return int(np.asarray(restored["state"]["step"]))
