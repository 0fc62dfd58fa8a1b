"""The interop tests: fp4lm's exports read by the real consumers (transformers, compressed-tensors) in their
own environment. `make test-interop` builds it (.venv-interop: torch CPU, transformers, compressed-tensors,
pinned in tests/interop/requirements.txt) and runs these tests; INTEROP_PYTHON names another interpreter
that has them. Without one, every test here is skipped with that reason.

One small NVFP4 run, trained with precision.shared_weight_scale so that its NVFP4 export is the forward
pass's own codes, is trained once per session and exported in all three formats."""

from __future__ import annotations

import os
import pathlib
import subprocess

import numpy as np
import pytest

from tests.reliability.helpers_reliability import REPO, run_cli, train_tiny_run

CONSUMER = pathlib.Path(__file__).with_name("consumer.py")
REQUIRED = ("torch", "transformers", "compressed_tensors", "safetensors")


def _interop_python() -> tuple[str | None, str]:
    """(the interop interpreter, or None with the reason it cannot be used)."""
    python = os.environ.get("INTEROP_PYTHON") or str(REPO / ".venv-interop" / "bin" / "python")
    if not pathlib.Path(python).is_file():
        return (
            None,
            f"no interop environment at {python}: run `make test-interop` (torch, transformers, compressed-tensors)",
        )
    probe = subprocess.run([python, "-c", f"import {', '.join(REQUIRED)}"], capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"{python} cannot import {', '.join(REQUIRED)} ({last}): run `make test-interop`"
    return python, ""


@pytest.fixture(scope="session")
def consumer(tmp_path_factory):
    """`consumer(command, *args) -> dict of arrays`: tests/interop/consumer.py run by the interop Python."""
    python, reason = _interop_python()
    if python is None:
        pytest.skip(reason)
    out_dir = tmp_path_factory.mktemp("consumer")

    def run(command: str, *args: str) -> dict[str, np.ndarray]:
        out = out_dir / f"{command}-{len(list(out_dir.iterdir()))}.npz"
        done = subprocess.run(
            [python, str(CONSUMER), command, *args, str(out)], capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, done.stderr[-4000:]
        with np.load(out) as result:
            return dict(result)

    return run


@pytest.fixture(scope="session")
def interop_run(tmp_path_factory, consumer) -> pathlib.Path:
    """A 2-block NVFP4 run trained far enough to have learned the corpus (60 steps), shared weight scales."""
    del consumer  # requested first, so the run is not trained where the tests would be skipped anyway
    return train_tiny_run(
        tmp_path_factory.mktemp("interop_run"),
        "model.num_layers=2",
        "train.steps=60",
        "checkpoint.every=60",
        "checkpoint.async_save=false",
        "eval.every=60",
        "eval.batches=2",
        "precision.shared_weight_scale=true",
        lines=400,
    )


@pytest.fixture(scope="session")
def exports(interop_run, tmp_path_factory) -> dict[str, pathlib.Path]:
    """The run exported as hf (float32), nvfp4 and nvfp4-ct, through the CLI as a user would."""
    root = tmp_path_factory.mktemp("interop_exports")
    paths = {}
    for fmt, extra in (("hf", ["--dtype", "float32"]), ("nvfp4", []), ("nvfp4-ct", [])):
        paths[fmt] = root / fmt
        result = run_cli("export", str(interop_run), "--format", fmt, "--out", str(paths[fmt]), *extra, timeout=600)
        assert result.code == 0, result.stderr
        assert "re-quantized" not in result.stdout  # shared weight scales: nothing quantized again
    return paths


MOE_SHAPES = {
    "Qwen3MoeForCausalLM": ("model.qk_norm=true", "model.first_dense_layers=1"),
    "MixtralForCausalLM": (),
    "Qwen2MoeForCausalLM": ("model.num_shared_experts=1", "model.first_dense_layers=1"),
}
"""Two-block MoE runs (four experts of width 32, top-2) of each architecture fp4lm exports to."""


@pytest.fixture(scope="session")
def moe_runs(tmp_path_factory, consumer) -> dict[str, pathlib.Path]:
    """An NVFP4 MoE run per architecture (40 steps, shared gate/up amaxes), exported as hf (float32),
    nvfp4 and nvfp4-ct through the CLI: {architecture: {"run" | format: path}}."""
    del consumer  # requested first: no training where the tests would be skipped
    runs = {}
    for architecture, shape in MOE_SHAPES.items():
        root = tmp_path_factory.mktemp(f"interop_{architecture}")
        run = train_tiny_run(
            root,
            "model.num_layers=2",
            "model.num_experts=4",
            "model.moe_mlp_dim=32",
            *shape,
            "train.steps=40",
            "checkpoint.every=40",
            "checkpoint.async_save=false",
            "eval.every=40",
            "eval.batches=2",
            "precision.shared_weight_scale=true",
            lines=400,
        )
        runs[architecture] = {"run": run}
        for fmt, extra in (("hf", ["--dtype", "float32"]), ("nvfp4", []), ("nvfp4-ct", [])):
            out = root / fmt
            result = run_cli("export", str(run), "--format", fmt, "--out", str(out), *extra, timeout=600)
            assert result.code == 0, result.stderr
            assert "re-quantized" not in result.stdout
            runs[architecture][fmt] = out
    return runs


@pytest.fixture(scope="session")
def moe_bf16_last_run(tmp_path_factory, consumer) -> dict[str, pathlib.Path]:
    """configs/moe.yaml's shape in small: a Qwen2-MoE run (dense block 0, shared expert) whose last block is
    bf16 (`precision.bf16_last_layers=1`), 40 steps, exported as nvfp4-ct: {"run" | "nvfp4-ct": path, "stdout":
    the export's output}."""
    del consumer  # requested first: no training where the tests would be skipped
    root = tmp_path_factory.mktemp("interop_moe_bf16_last")
    run = train_tiny_run(
        root,
        "model.num_layers=3",
        "model.num_experts=4",
        "model.moe_mlp_dim=32",
        *MOE_SHAPES["Qwen2MoeForCausalLM"],
        "precision.bf16_last_layers=1",
        "precision.shared_weight_scale=true",
        "train.steps=40",
        "checkpoint.every=40",
        "checkpoint.async_save=false",
        "eval.every=40",
        "eval.batches=2",
        lines=400,
    )
    out = root / "nvfp4-ct"
    result = run_cli("export", str(run), "--format", "nvfp4-ct", "--out", str(out), timeout=600)
    assert result.code == 0, result.stderr
    return {"run": run, "nvfp4-ct": out, "stdout": result.stdout}
