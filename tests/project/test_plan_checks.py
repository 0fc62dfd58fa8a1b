"""`fp4lm plan` and `fp4lm project` as an adversarial user drives them, through the CLI's own entry in this
process: every value that means nothing is refused in one line (exit 2, nothing written), a layout that cannot
fit on its GPUs is marked or refused with its per-GPU bytes, small figures keep their units, unmodelled
settings are named, and `--dry-run --plan` plans the compiled config's batch and mesh as `fp4lm plan` does."""

import json

import pytest

from fp4lm.project import resolve_model, units
from fp4lm.project.command import main_plan, plan_for_dry_run
from tests.reliability.helpers_reliability import run_cli_in_process

PLAN = ["plan", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "16", "--tp", "2", "--tokens", "1T"]
PROJECT = ["project", "--model", "llama3-8b", "--gpu", "h100"]


def _refused(*args: str) -> str:
    result = run_cli_in_process(*args)
    lines = result.stderr.strip().splitlines()
    assert result.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (result.code, result.stderr)
    assert not result.stdout
    return lines[0]


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--price", "nan"], "--price nan is outside [0, 1000]"),
        (["--price", "inf"], "--price inf is outside"),
        (["--price", "1e30"], "--price 1e+30 is outside"),
        (["--pue", "nan"], "--pue nan is outside [1, 3]"),
        (["--pue", "inf"], "--pue inf is outside"),
        (["--scaleout-gbps", "nan"], "--scaleout-gbps nan is outside"),
        (["--scaleout-gbps", "0"], "--scaleout-gbps 0.0 is outside"),
        (["--nvlink-domain", "0"], "--nvlink-domain must be a positive integer"),
        (["--tp", "0"], "--tp must be a positive integer, got 0"),
        (["--gbs", "0"], "--gbs must be a positive integer, got 0"),
        (["--mbs", "0"], "--mbs must be a positive integer, got 0"),
        (["--gpus", "2000000"], "--gpus 2,000,000 is more than 1,048,576"),
        (["--tokens", "1e30"], "--tokens 1e30 is more than 10,000T tokens"),
        (["--tokens", "1000"], "--tokens 1000 is less than one step"),
        (["--tokens", "nan"], "--tokens must be a positive number"),
        (["--sweep", ""], "--sweep is empty"),
        (["--sweep", "2000000"], "--sweep 2,000,000 is more than"),
        (["--recipes", ""], "--recipes is empty"),
        (["--power", "foo=0.5"], "--power names foo, which is not planned"),
        (["--power", "fp8=0.5,fp8=0.9"], "--power names fp8 twice"),
        (["--gbs", str(10**30)], "is less than one step"),
        (["--gbs", "1024000"], "tokens per GPU per step, more than the 4,194,304"),
    ],
)
def test_each_meaningless_plan_flag_is_refused_in_one_line(extra, words):
    assert words in _refused(*PLAN, *extra)


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--gpus", "8", "--tp", "0"], "--tp must be a positive integer"),
        (["--gpus", "8", "--scaleout-gbps", "inf"], "--scaleout-gbps inf is outside"),
        (["--gpus", "8", "--nvlink-domain", "0"], "--nvlink-domain must be"),
        (["--recipes", ""], "--recipes is empty"),
        (["--batch", "0"], "--batch must be a positive integer"),
    ],
)
def test_each_meaningless_project_flag_is_refused_in_one_line(extra, words):
    assert words in _refused(*PROJECT, *extra)


def test_a_refused_plot_writes_nothing(tmp_path):
    keep = tmp_path / "plan.png"
    keep.write_bytes(b"earlier plot")
    assert "is not a .png, .svg, .pdf file" in _refused(*PLAN, "--plot", str(tmp_path / "plan.txt"))
    assert "cannot be written" in _refused(*PLAN, "--plot", str(tmp_path / "no" / "such" / "plan.png"))
    assert "--price nan" in _refused(*PLAN, "--plot", str(keep), "--price", "nan")
    too_large = ["plan", "--model", "llama3.1-405b", "--gpu", "h100", "--gpus", "8", "--tokens", "15T"]
    assert "no planned layout fits" in _refused(*too_large, "--plot", str(keep))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.png"] and keep.read_bytes() == b"earlier plot"


def test_405b_on_8_h100s_without_model_parallelism_is_refused_with_its_bytes_per_gpu():
    line = _refused("plan", "--model", "llama3.1-405b", "--gpu", "h100", "--gpus", "8", "--tokens", "15T")
    assert "no planned layout fits" in line and "the GPU has 80.0 GiB" in line
    tib = float(line.split("does not fit (")[1].split(" TiB per GPU")[0])
    assert 6.6 < tib < 7.0  # 405.9B parameters x 18 bytes of weights, AdamW state and gradient: 6.65 TiB, and more


def test_project_names_a_layout_that_cannot_fit_and_its_bytes():
    args = ["project", "--model", "llama3.1-405b", "--gpu", "h100", "--gpus", "8", "--recipes", "nvfp4"]
    assert run_cli_in_process(*args).stdout.splitlines()[-1].startswith("  note: nvfp4: does not fit (6.")
    data = json.loads(run_cli_in_process(*args, "--json").stdout)
    assert data["nvfp4"]["fits"] is False and data["nvfp4"]["memory_per_gpu_bytes"] > 405e9 * 18
    split = ["--tp", "8", "--pp", "8", "--gpus", "512", "--gbs", "512", "--fsdp", "--json"]  # the last --gpus wins
    fits = json.loads(run_cli_in_process(*args, *split).stdout)
    assert fits["nvfp4"]["fits"] is True and "notes" not in fits


def test_rows_that_cannot_fit_are_marked_and_those_that_fit_priced_as_before():
    """FSDP over 8 H100s leaves each 70.6B x 18 / 8 bytes = 148 GiB of state, more than 1.6 x 80 GiB: marked.
    Over 64 or 128 it fits, and is priced as without the sweep."""
    args = ["plan", "--model", "llama3-70b", "--gpu", "h100", "--tokens", "2T", "--fsdp", "--gbs", "128"]
    args += ["--gpus", "64", "--recipes", "nvfp4"]
    alone = json.loads(run_cli_in_process(*args, "--json").stdout)["plan"]
    swept = run_cli_in_process(*args, "--json", "--sweep", "8,128")
    rows = json.loads(swept.stdout, parse_constant=_no_constants)["plan"]
    assert [(r["gpus"], r["fits"]) for r in rows] == [(8, False), (64, True), (128, True)]
    assert rows[0]["days"] is None and rows[0]["does_not_fit"].startswith("does not fit (")
    assert "GiB per GPU, the GPU has 80.0 GiB)" in rows[0]["does_not_fit"]
    assert rows[0]["memory_per_gpu_bytes"] > 70e9 * 18 / 8
    assert rows[1] == alone[0] and alone[0]["days"] > 0
    table = run_cli_in_process(*args, "--sweep", "8,128").stdout.splitlines()
    assert table[2].split()[:5] == ["8", "nvfp4", "does", "not", "fit"]


def _no_constants(name):
    raise AssertionError(f"{name} is not JSON")


def test_small_figures_keep_their_units():
    assert [units.seconds(s) for s in (2.5, 0.0123, 4.5e-5, 0)] == ["2.50 s", "12.3 ms", "45.0 us", "0 s"]
    assert [units.count(n) for n in (15e12, 3e11, 1.5e6, 512, 0.25)] == ["15.0T", "300B", "1.50M", "512", "0.25"]
    assert [units.duration(s) for s in (27.2 * 86400, 3 * 3600, 90, 0.5)] == [
        "27.2 days",
        "3.00 h",
        "1.50 min",
        "500 ms",
    ]
    assert units.energy(45_000) == "45.0 kWh" and units.dollars(12.3) == "$12.3" and units.figure(0.004) == "0.004"
    out = run_cli_in_process(*PLAN, "--tokens", "5M", "--price", "2").stdout.splitlines()
    assert out[0].startswith("plan: llama3-8b on H100, TP2 PP1 VP1 CP1 EP1 DP8 MBS1 GBS8, 5.00M tokens")
    fields = out[-1].split()
    assert fields[1] == "nvfp4" and fields[3] in ("ms", "s") and fields[6] in ("s", "min") and fields[-2] == "Wh"
    small = run_cli_in_process("project", "--model", "shakespeare", "--gpu", "gb300", "--seq", "8").stdout
    assert " us " in small and "0.0 ms" not in small


def test_settings_the_projection_does_not_model_are_named():
    overrides = ["precision.attention=fp8", "precision.fp4_param_gather=true"]
    text = run_cli_in_process(*PLAN, *overrides).stdout
    assert "note: precision.attention=fp8 is not modelled" in text
    assert "note: precision.fp4_param_gather=true is not modelled" in text
    moe = run_cli_in_process(*PROJECT[:2], "mixtral-8x7b", *PROJECT[3:], "--json", "model.capacity_factor=1.25")
    assert json.loads(moe.stdout)["notes"] == [
        "model.capacity_factor=1.25 is not modelled: every routed token is projected (dropless)"
    ]


@pytest.mark.parametrize(
    "spec, words",
    [
        ("gpu=h100,gpus=16,tokens=1T,price=nan", "--price nan is outside"),
        ("gpu=h100,gpus=16,tokens=1T,gpus=32", "--plan gives gpus twice"),
        ("gpu=h100,gpus=1.5,tokens=1T", "--gpus '1.5' is not a whole number"),
        ("gpu=h100,gpus=16,tokens=1T,fsdp=maybe", "fsdp='maybe' is not true or false"),
        ("gpu=h100,gpus=16,tokens=1T,scaleout_gbps=inf", "--scaleout-gbps inf is outside"),
        ("gpu=h100,gpus=16,tokens=1T,sweep=8,0", "--sweep '8,0' is not a list"),
    ],
)
def test_each_dry_run_plan_key_gets_the_same_checks(spec, words):
    config, _ = resolve_model("llama3-8b")
    with pytest.raises(Exception) as info:
        plan_for_dry_run(config, spec, num_devices=8)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_dry_run_plan_spec_reads_list_values_over_commas():
    config, _ = resolve_model("llama3-8b", ["mesh.tensor=2", "mesh.fsdp=-1", "train.batch_size=2"])
    spec = "gpu=h100,gpus=16,tokens=1T,recipes=fp8,nvfp4,power=fp8=0.9,nvfp4=0.5,price=2"
    rows = plan_for_dry_run(config, spec, num_devices=2).rows
    assert [r.recipe for r in rows] == ["fp8", "nvfp4"] and [r.watts_per_gpu for r in rows] == [630, 350]
    assert rows[0].dollars == pytest.approx(2 * rows[0].gpu_hours)


def test_the_dry_runs_plan_is_the_compiled_configs_batch_and_mesh():
    """On 8 devices, mesh.tensor=2 leaves mesh.fsdp=-1 four devices: FSDP over them, TP2, and each
    data-parallel GPU runs 32 / (1 x 4 x 1) = 8 sequences a step in 2 microbatches of 4; on one device the -1
    resolves to 1, so no FSDP. `fp4lm plan` with those flags gives the same rows."""
    overrides = [
        "train.batch_size=32",
        "train.grad_accum_steps=2",
        "mesh.tensor=2",
        "mesh.fsdp=-1",
        "data.seq_len=2048",
    ]
    config, _ = resolve_model("llama3-8b", overrides)
    dry = plan_for_dry_run(config, "gpu=h100,gpus=64,tokens=1T,recipes=bf16,nvfp4", num_devices=8)
    assert "TP2 PP1 VP1 CP1 EP1 DP32 FSDP MBS4 GBS256" in dry.label  # 32 DP ranks x 8 sequences
    flags = dict(gpu="h100", gpus=64, tokens="1T", recipes="bf16,nvfp4", tp=2, fsdp=True, mbs=4, gbs=256)
    planned = json.loads(main_plan({"model": "llama3-8b", "overrides": overrides, "json": True, **flags}))
    assert dry.as_json()["plan"] == planned["plan"]
    one_device = plan_for_dry_run(config, "gpu=h100,gpus=64,tokens=1T", num_devices=2)  # data=1, fsdp=1
    assert "DP32 MBS16 GBS1024" in one_device.label and "FSDP" not in one_device.label
