"""Runs one recipe's training as a subprocess (`python -m fp4lm train ...`), teeing its output to a log.

A subprocess per recipe gives each run a fresh JAX process (no compilation cache or memory carried from
one recipe into the next, so throughput numbers are comparable) and lets an interrupted comparison
resume: the trainer resumes a run directory from its latest checkpoint.

Stopping a comparison stops its training child too, never leaving it running on its own: on Ctrl-C or
SIGTERM (what a scheduler sends) the child is sent SIGTERM, so it saves its step and stops, its last lines
are still copied, and then the comparison stops with Ctrl-C's message. A second Ctrl-C kills the child.

The children import the fp4lm this process runs, never a folder named `fp4lm` in the current directory:
they start with `python -P` (the current directory is not put on their path), and when this fp4lm is not
installed in site-packages (a checkout, PYTHONPATH) its directory leads their PYTHONPATH.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import site
import subprocess
import sys
import time
from typing import IO, TextIO

from fp4lm.host_load import load_average
from fp4lm.sigterm import sigterm_handled_by


@dataclasses.dataclass(frozen=True)
class TrainOutcome:
    exit_code: int
    wall_s: float
    load_before: float | None  # the host's one-minute load average when training started and ended: tokens/s
    load_after: float | None  # measured on a busy host is not the recipe's speed


def train_command(config_path: str | None, overrides: list[str]) -> list[str]:
    return [sys.executable, "-P", "-m", "fp4lm", "train", *([config_path] if config_path else []), *overrides]


def child_env() -> dict[str, str]:
    """The environment of a training child: unbuffered output, and this process's fp4lm first on its path."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    root = pathlib.Path(__file__).resolve().parents[2]  # the directory that holds this fp4lm package
    installed = {pathlib.Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}
    if root not in installed:
        env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def run_training(command: list[str], log_path: pathlib.Path, echo: TextIO | None = None) -> TrainOutcome:
    """Runs `command`, copying its stdout+stderr line by line to `echo` and appending it to `log_path`."""
    stream: TextIO = echo if echo is not None else sys.stdout
    log_path.parent.mkdir(parents=True, exist_ok=True)
    load_before = load_average()
    start = time.perf_counter()
    with log_path.open("a") as log:
        log.write(f"$ {' '.join(command)}\n")
        with (
            sigterm_handled_by(_interrupt),
            subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=child_env()
            ) as process,
        ):
            assert process.stdout is not None
            try:
                _copy_lines(process.stdout, stream, log)
            except KeyboardInterrupt:
                _stop(process, stream, log)
                raise
            exit_code = process.wait()
    wall_s = time.perf_counter() - start
    return TrainOutcome(exit_code=exit_code, wall_s=wall_s, load_before=load_before, load_after=load_average())


def _copy_lines(source: IO[str], stream: TextIO, log: TextIO) -> None:
    for line in source:
        stream.write(line)
        stream.flush()
        log.write(line)


def _stop(process: subprocess.Popen, stream: TextIO, log: TextIO) -> None:
    """Asks the child to save and stop (SIGTERM), copies what it still prints, waits; kills it on a second Ctrl-C."""
    if process.poll() is None:
        process.terminate()
    try:
        assert process.stdout is not None
        _copy_lines(process.stdout, stream, log)
        process.wait()
    except KeyboardInterrupt:
        process.kill()
        raise


def _interrupt(signum, frame):
    """SIGTERM as Ctrl-C: a scheduler's stop takes the KeyboardInterrupt path, which stops the child first."""
    raise KeyboardInterrupt
