"""Refused before it hangs, aborts or runs out of memory: each case runs
`python -m fp4lm` for real, and must answer with one line, exit 2, in seconds, touching nothing.

- a data path that is a FIFO (would block forever) or /dev/zero (would never end);
- sizes no machine holds (d_model 1e9, vocabulary 1e9, 60k-token sequences, 1e8 layers): refused by the
  memory estimate before the model is built (fp4lm.train.memory), not by XLA after a minute;
- JAX_PLATFORMS=cuda on a machine without a GPU: one line naming the platform and what is available;
- `fp4lm project | head`: a reader that goes away is no error; quiet exit 141, as `cat` gives.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import time

import pytest

from tests.reliability.bad_inputs import expand, make_existing_run, make_restartable_run
from tests.reliability.helpers_reliability import (
    REPO,
    assert_one_line_user_error,
    fp4lm_command,
    run_cli,
    snapshot,
    subprocess_env,
    write_corpus,
)

pytestmark = pytest.mark.slow

QUICK_S = 60  # "in seconds": the slowest of these takes ~3 s on the 2-core machine, jax import included


@pytest.fixture
def paths(tmp_path) -> dict[str, pathlib.Path]:
    return {
        "corpus": write_corpus(tmp_path / "corpus.txt"),
        "existing_run": make_existing_run(tmp_path / "run"),
        "restartable_run": make_restartable_run(tmp_path / "restartable_run"),
    }


def _refused_quickly(argv: list[str], expect: tuple[str, ...], untouched: pathlib.Path, **env) -> str:
    before = snapshot(untouched)
    started = time.monotonic()
    result = run_cli(*argv, timeout=QUICK_S) if not env else _run_with_env(argv, env)
    line = assert_one_line_user_error(result, expect_in=expect)
    assert time.monotonic() - started < QUICK_S
    after = snapshot(untouched)
    assert all(after.get(name) == digest for name, digest in before.items()), "a refused command changed a file"
    return line


def _run_with_env(argv: list[str], env: dict[str, str]):
    from tests.reliability.helpers_reliability import Result

    done = subprocess.run(
        fp4lm_command(*argv), capture_output=True, text=True, timeout=QUICK_S, env=subprocess_env() | env, cwd=REPO
    )
    return Result(done.returncode, done.stdout, done.stderr)


@pytest.mark.timeout(120)
def test_data_path_fifo_is_refused_not_waited_on(paths, tmp_path):
    fifo = tmp_path / "corpus.fifo"
    os.mkfifo(fifo)
    argv = expand(["TRAIN", f"data.path={fifo}"], paths)
    _refused_quickly(argv, ("corpus.fifo", "named pipe", "data.path"), paths["restartable_run"])


@pytest.mark.timeout(120)
def test_data_path_dev_zero_is_refused(paths):
    argv = expand(["TRAIN", "data.path=/dev/zero"], paths)
    _refused_quickly(argv, ("/dev/zero", "character device", "data.path"), paths["restartable_run"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "override, names",
    [
        ("model.d_model=1000000000", ("parameters", "model.d_model")),
        ("data.vocab_size=1000000000", ("logits", "data.vocab_size")),
        ("data.seq_len=60000", ("activations", "data.seq_len")),
        ("model.num_layers=100000000", ("parameters", "model.num_layers")),
    ],
)
def test_impossible_size_is_refused_before_compiling(override, names, paths):
    argv = expand(["TRAIN", override], paths)
    line = _refused_quickly(argv, ("per device", "more than", *names), paths["restartable_run"])
    assert "RESOURCE_EXHAUSTED" not in line


@pytest.mark.timeout(120)
def test_unavailable_platform_is_one_line(paths):
    argv = expand(["TRAIN"], paths)
    line = _refused_quickly(
        argv,
        ("JAX_PLATFORMS=cuda", "available here: cpu"),
        paths["restartable_run"],
        JAX_PLATFORMS="cuda",
        CUDA_VISIBLE_DEVICES="",
    )
    assert "AssertionError" not in line


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["eval", "sample"])
def test_unavailable_platform_is_one_line_for_a_saved_run(paths, command):
    argv = [command, str(paths["existing_run"]), *(["--prompt", "hi"] if command == "sample" else [])]
    _refused_quickly(
        argv,
        ("JAX_PLATFORMS=cuda", "available here: cpu"),
        paths["existing_run"],
        JAX_PLATFORMS="cuda",
        CUDA_VISIBLE_DEVICES="",
    )


@pytest.mark.timeout(120)
def test_closed_stdout_is_a_quiet_exit():
    """The reader closes its end before fp4lm writes (a `| head` that already has its lines)."""
    process = subprocess.Popen(
        fp4lm_command("project", "--model", "llama3-8b", "--gpu", "gb200"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=subprocess_env(),
        cwd=REPO,
    )
    process.stdout.close()
    stderr = process.stderr.read().decode()
    process.stderr.close()
    assert process.wait(timeout=QUICK_S) == 141
    assert stderr.strip() == "", stderr


@pytest.mark.timeout(120)
def test_project_into_head_prints_its_lines_and_no_error():
    """The shell's form: `fp4lm project ... | head -2` gives two lines and nothing on stderr."""
    command = " ".join(fp4lm_command("project", "--model", "llama3-8b", "--gpu", "gb200")) + " | head -2"
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=QUICK_S, env=subprocess_env(), cwd=REPO
    )
    assert done.returncode == 0
    assert len(done.stdout.splitlines()) == 2
    assert "error" not in done.stderr and "Broken pipe" not in done.stderr, done.stderr
