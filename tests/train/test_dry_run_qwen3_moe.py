"""`fp4lm train configs/qwen3-30b-a3b.yaml --dry-run` on 8 fake CPU devices: Qwen3-30B-A3B's training step
compiles with its 128 experts split over the mesh's expert axis (16 per device), nothing allocated or written."""

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "qwen3-30b-a3b.yaml"

pytestmark = pytest.mark.slow  # 48 MoE blocks with their backward: minutes of XLA compilation on a CPU


def test_qwen3_30b_a3b_compiles_on_8_devices_with_the_experts_split(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COORDINATOR")}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8", PYTHONPATH=str(REPO))
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "fp4lm", "train", str(CONFIG), "--dry-run", f"train.run_dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=2400,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "mesh: data=1, fsdp=1, expert=8, tensor=1 (8 cpu devices)" in out
    count = int(out.split(" parameters")[0].rsplit(": ", 1)[-1].replace(",", ""))
    assert 30.4e9 < count < 30.7e9, count  # Qwen's 30.5B
    expert_kernels = [line for line in out.splitlines() if ".mlp.gate.kernel" in line]
    assert expert_kernels and all("-> (expert" in line for line in expert_kernels), expert_kernels
    assert not run_dir.exists()
