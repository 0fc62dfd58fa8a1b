"""`fp4lm train CONFIG --dry-run`: one training step compiled for the mesh on abstract inputs (8 fake CPU
devices in a subprocess), its figures printed, nothing allocated and nothing written. (The config it compiles
is train's: tests/train/test_dry_run_init_from.py.)"""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from fp4lm.config import load_config
from fp4lm.config.tiny import TINY_DATA, TINY_MODEL
from fp4lm.errors import UserError
from fp4lm.train.dry_run import check_mesh_fits, group_by_block
from tests.compile_flags import xla_flags

pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT_S = 600
TINY = [
    *TINY_MODEL,
    *TINY_DATA,
    "model.num_layers=2",
    "train.batch_size=8",  # one sequence per fake device
    # bf16 compiles fast; one nvfp4 layer shows the precision table mixing recipes.
    "precision.recipe=bf16",
    r"precision.rules=blocks\.1\.mlp\.down=nvfp4",
]
# The peak RSS the dry-run process prints (bytes) on its last stderr line, after fp4lm's own output.
_RUN_AND_REPORT_RSS = (
    "import resource, sys\n"
    "from fp4lm.cli import main\n"
    "try:\n"
    "    main(sys.argv[1:])\n"
    "finally:\n"
    "    print('maxrss_kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
)


def _dry_run(*overrides: str, cwd: pathlib.Path, xla_log_level: str | None = None):
    """(the finished `fp4lm train OVERRIDES --dry-run` on 8 fake devices, its peak RSS in bytes);
    `xla_log_level`: TF_CPP_MIN_LOG_LEVEL as the user sets it (None: unset, fp4lm's default)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COORDINATOR") and k != "TF_CPP_MIN_LOG_LEVEL"}
    if xla_log_level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = xla_log_level
    env.update(
        JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=8"), PYTHONPATH=str(REPO)
    )
    done = subprocess.run(
        [sys.executable, "-c", _RUN_AND_REPORT_RSS, "train", *overrides, "--dry-run"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        cwd=cwd,
    )
    rss_lines = [line for line in done.stderr.splitlines() if line.startswith("maxrss_kib ")]
    return done, int(rss_lines[-1].split()[1]) * 1024


def test_tiny_config_on_8_devices_prints_every_section_and_writes_nothing(tmp_path):
    run_dir = tmp_path / "run"  # a run stopped before its first checkpoint: train would start it again
    run_dir.mkdir()
    (run_dir / "config.json").write_text('{"checkpoint": {"enabled": true}}')
    (run_dir / "keep.txt").write_text("untouched")
    plan = "gpu=gb200,gpus=16,tokens=1B,price=2,recipes=bf16,nvfp4"  # fp4lm plan of the compiled config
    done, _ = _dry_run(
        *TINY, "model.scan_layers=true", "mesh.fsdp=4", "mesh.tensor=2", f"train.run_dir={run_dir}", "--plan", plan,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for section in ("memory per device", "FLOPs per step", "collectives:", "parameter shardings", "precision:"):
        assert section in out, out
    assert "mesh: data=1, fsdp=4, expert=1, tensor=2 (8 cpu devices)" in out
    # XLA counts a scanned group's block once: the dry run says so, and points at the analytic figure.
    assert "XLA counts each scanned group's block once" in out
    for figure in ("parameters", "optimizer state", "activations, temp", "peak", "XLA's cost analysis"):
        assert figure in out, figure
    # fsdp gathers the weights; the figures are test_collectives.py's.
    assert re.search(r"^  all-gather +[\d.]+ KiB in \d+ calls \(f32 ", out, re.MULTILINE), out
    # Logical axes -> mesh axes, the layers of both blocks on one line.
    assert "blocks.[0-1].mlp.gate.kernel  [32x64] (embed, mlp) -> (fsdp, tensor)" in out
    assert "final_norm.scale" in out and "(norm) -> (replicated)" in out
    assert "precision: bf16: 13 of 14 linear layers; nvfp4: 1 of 14 linear layers" in out
    # the plan takes the compiled mesh's tensor parallelism and FSDP, and its batch: 8 sequences over the
    # data x fsdp x expert = 4 devices that share it, 2 per data-parallel GPU (not project.batch_per_device's 1)
    assert "plan: the compiled config on GB200, TP2 PP1 VP1 CP1 EP1 DP8 FSDP MBS2 GBS16" in out
    assert [line.split()[:2] for line in out.splitlines()[-2:]] == [["16", "bf16"], ["16", "nvfp4"]]
    assert re.search(r"^  blocks\.0\.mlp\.down +bf16$", out, re.MULTILINE)
    assert re.search(r"^  blocks\.1\.mlp\.down +nvfp4$", out, re.MULTILINE)
    assert re.search(r"^  blocks\.\[0-1\]\.attn\.q +bf16$", out, re.MULTILINE)
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.json", "keep.txt"]
    assert not (tmp_path / "runs").exists()  # nor the default run directory


def test_a_model_too_large_to_allocate_compiles_without_allocating(tmp_path):
    """About 27 billion parameters: 108 GB of float32 weights and 325 GB with AdamW's moments, more than this
    machine has; the dry run only plans them, so the process stays small."""
    huge = [
        "model.num_layers=1",
        "model.d_model=8192",
        "model.num_heads=64",
        "model.num_kv_heads=8",
        "model.mlp_dim=28672",
        "data.tokenizer=byte",
        "data.vocab_size=1600000",
        "data.seq_len=32",
        "train.batch_size=8",
        "precision.recipe=bf16",
    ]
    config = load_config(None, huge)
    from fp4lm.model.memory_estimate import parameter_count

    assert 4 * parameter_count(config) > 100e9
    done, peak_rss = _dry_run(*huge, f"train.run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    count_text = done.stdout.split(" parameters")[0].rsplit(": ", 1)[-1]
    assert int(count_text.replace(",", "")) == parameter_count(config)
    assert "GiB  (float32 master weights" in done.stdout
    assert "XLA counts each scanned" not in done.stdout  # one block, unscanned: its count is the whole step
    assert peak_rss < 8e9, f"the dry run used {peak_rss / 1e9:.1f} GB: did it allocate the parameters?"
    assert not (tmp_path / "run").exists()


def test_a_mesh_larger_than_the_devices_is_refused_with_the_stand_in_flag():
    config = load_config(None, ["mesh.data=2", "mesh.fsdp=8"])
    with pytest.raises(UserError, match="needs 16 devices but 8 are visible.*device_count=16"):
        check_mesh_fits(config, 8)
    check_mesh_fits(load_config(None, ["mesh.data=2", "mesh.fsdp=-1"]), 8)  # -1 takes the rest


def test_rows_of_alike_blocks_are_merged():
    rows = [(f"blocks.{i}.attn.q", "nvfp4") for i in range(4)] + [("blocks.4.attn.q", "bf16"), ("embed", "x")]
    rows.insert(1, ("blocks.0.mlp.up", "nvfp4"))
    assert group_by_block(rows) == [
        ("blocks.[0-3].attn.q", "nvfp4"),
        ("blocks.0.mlp.up", "nvfp4"),
        ("blocks.4.attn.q", "bf16"),
        ("embed", "x"),
    ]
    assert group_by_block([(f"blocks.{i}.w", "a") for i in (0, 1, 3)]) == [("blocks.[0-1,3].w", "a")]


@pytest.mark.parametrize(
    ("config_file", "held", "active"),
    [("qwen3-235b-a22b", 235.1e9, 22.2e9), ("mixtral-8x7b", 46.7e9, 12.9e9)],  # their published sizes
)
def test_the_moe_line_counts_the_parameters_a_token_uses(config_file, held, active):
    from jax.sharding import AbstractMesh

    from fp4lm.model.memory_estimate import parameter_count
    from fp4lm.sharding import MESH_AXES
    from fp4lm.tokenizer import planned_model_vocab_size
    from fp4lm.train.dry_run import moe_fields, moe_line

    config = load_config(REPO / "configs" / f"{config_file}.yaml")
    one_device = AbstractMesh((1,) * len(MESH_AXES), MESH_AXES)
    fields = moe_fields(config.model, planned_model_vocab_size(config.data), one_device)
    total, counted = fields["parameters"], fields["active_parameters"]
    assert total == parameter_count(config) == pytest.approx(held, rel=0.002)
    assert counted == pytest.approx(active, rel=0.01)
    line = moe_line(fields)
    m = config.model
    assert line.startswith(f"experts: blocks 0-{m.num_layers - 1} each route every token to {m.experts_per_token} of ")
    assert f"; {counted:,} active parameters per token of {total:,} ({100 * counted / total:.1f}%)" in line
    assert "softmax router" in line and "dropless" in line and f"{m.num_experts} per device" in line


MOE = ["model.num_experts=4", "model.experts_per_token=2", "model.moe_mlp_dim=32", "model.first_dense_layers=1"]
MOE_MESH = ["mesh.expert=2", "mesh.fsdp=2", "mesh.tensor=2"]
XLA_LOG_LINE = re.compile(r"^[IWEF]\d{4} ", re.M)  # XLA's C++ log: I1207 21:08:40.5 ... file.cc:666] text
XLA_INFO = "PjRt-IFRT device count"  # a line XLA logs at info level on every start


def test_a_moe_config_on_8_devices_prints_its_experts(tmp_path):
    """... and XLA's log shows where the user asks for it (TF_CPP_MIN_LOG_LEVEL=0), without the SPMD
    partitioner's "Involuntary full rematerialization" it gave when the embedding's gradient, a scatter into a
    table split over fsdp, made XLA replicate the activations' gradient (fp4lm.sharding.fsdp_gathered)."""
    bf16 = [setting for setting in TINY if not setting.startswith("precision.rules")]  # no blocks.1.mlp.down here
    done, _ = _dry_run(*bf16, *MOE, *MOE_MESH, f"train.run_dir={tmp_path / 'run'}", cwd=tmp_path, xla_log_level="0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert XLA_INFO in done.stderr
    assert "Involuntary full rematerialization" not in done.stderr, done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"^experts: blocks 1 each route every token to 2 of 4 experts of width 32 \(", out, re.M), out
    assert "router " in out.split("FLOPs per step:")[1]  # the routers' FLOPs, beside the linear layers'
    assert re.search(r"^  blocks\.1\.mlp\.gate\.kernel +\[4x32x32\] \(expert, embed, mlp\)", out, re.M)
    assert not (tmp_path / "run").exists()


def test_a_moe_dry_run_gives_its_experts_as_fields_counted_as_the_projection_counts(tmp_path, capsys):
    """--json's "experts" holds fields, not a sentence; its active parameters (counted by hand below: the norms
    included) are the ones `fp4lm project` gives for the same config."""
    from fp4lm import cli

    bf16 = [setting for setting in TINY if not setting.startswith("precision.rules")]
    overrides = [*bf16, *MOE, *MOE_MESH]
    done, _ = _dry_run(*overrides, f"train.run_dir={tmp_path / 'run'}", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not XLA_LOG_LINE.search(done.stderr), done.stderr[-3000:]  # XLA's log stays out of the terminal
    report = json.loads(done.stdout)
    blocks = 2 * (2 * 32 * 32 + 2 * 32 * 16 + 2 * 32)  # q, o; k, v; the two norms
    outside = 2 * 256 * 32 + 32  # embedding, LM head, final norm
    dense_mlp, router, expert = 3 * 32 * 64, 32 * 4, 3 * 32 * 32
    held = blocks + outside + dense_mlp + router + 4 * expert
    assert report["experts"] == {
        "moe_blocks": [1],
        "experts": 4,
        "experts_per_token": 2,
        "shared_experts": 0,
        "expert_width": 32,
        "router_score": "softmax",
        "router_renormalize": True,
        "capacity_factor": None,
        "expert_parallel": 2,
        "experts_per_expert_shard": 2,
        "experts_per_device": 1,  # the 4 devices of a shard (fsdp x tensor) split its 2 experts
        "parameters": held,
        "active_parameters": held - 2 * expert,
        "active_fraction": (held - 2 * expert) / held,
    }
    assert report["model"]["parameters"] == held  # the built model's own count
    assert cli.run(["project", "--model", "default", "--gpu", "gb200", "--json", *overrides]) == 0
    projected = json.loads(capsys.readouterr().out)["moe"]
    assert (projected["params"], projected["active_params"]) == (held, held - 2 * expert)
