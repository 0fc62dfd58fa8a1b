"""`fp4lm train configs/qwen3-30b-a3b.yaml --dry-run` on 8 fake CPU devices: Qwen3-30B-A3B's whole training
step (48 blocks of 128 experts, 4,096 tokens a sequence) compiles with its experts split over the mesh's expert
axis (16 per device), nothing allocated or written. About 3 minutes and 3.3 GB on a 2-core machine, most of it
XLA's compiler (the blocks are scanned: one block's program, not 48).
"""

import os
import pathlib
import subprocess
import sys

import pytest

from tests.compile_flags import xla_flags

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "qwen3-30b-a3b.yaml"

pytestmark = pytest.mark.slow  # about 3 minutes of XLA compilation

VOCAB, D, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, EXPERT_WIDTH = 151936, 2048, 32, 4, 128, 128, 768


def qwen3_parameters(layers: int) -> int:
    """Qwen3-30B-A3B's parameters with `layers` blocks: embedding and LM head, then per block the attention
    (q, k, v, o and the q/k norms), two norms, the router and the experts' gate, up and down."""
    attention = 2 * D * HEADS * HEAD_DIM + 2 * D * KV_HEADS * HEAD_DIM + 2 * HEAD_DIM
    block = attention + 2 * D + D * EXPERTS + 3 * EXPERTS * D * EXPERT_WIDTH
    return 2 * VOCAB * D + layers * block + D


def test_the_shapes_are_qwen3_30b_a3b():
    assert 30.4e9 < qwen3_parameters(48) < 30.6e9  # Qwen's 30.5B in all


def test_qwen3_30b_a3b_compiles_on_8_devices_with_the_experts_split(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COORDINATOR")}
    flags = xla_flags("--xla_force_host_platform_device_count=8")
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=flags, PYTHONPATH=str(REPO))
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "fp4lm", "train", str(CONFIG), "--dry-run", f"train.run_dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "mesh: data=1, fsdp=1, expert=8, tensor=1 (8 cpu devices)" in out
    count = int(out.split(" parameters")[0].rsplit(": ", 1)[-1].replace(",", ""))
    assert count == qwen3_parameters(48)
    # Experts over the expert axis; the other parameters over it along embed, as over fsdp.
    assert "blocks.[0-47].mlp.gate.kernel    [128x2048x768] (expert, embed, mlp) -> (expert, None, None)" in out
    assert "blocks.[0-47].attn.q.kernel      [2048x4096] (embed, heads) -> (expert, None)" in out
    assert not run_dir.exists()
