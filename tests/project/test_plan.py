"""`fp4lm plan`: a projected step turned into days, GPU-hours, $ and MWh per recipe, at several GPU counts."""

import json
import subprocess
import sys

import pytest

from fp4lm.errors import UserError
from fp4lm.project import Layout, Network, get_gpu, project, resolve_model, workload_from_config
from fp4lm.project.command import main_plan
from fp4lm.project.plan import parse_power, parse_tokens, plan_rows, scaled_layout

PLAN = dict(model="llama3-70b", gpu="gb200", gpus=512, tp=2, pp=4, vp=5, gbs=1024, tokens="2T", price=3.0)


def test_each_figure_follows_from_the_projected_step():
    config, _ = resolve_model("llama3-70b")
    work = workload_from_config(config)
    gb200 = get_gpu("gb200")
    layout = Layout(gpus=512, gbs=1024, seq=8192, tp=2, pp=4, vp=5)
    network = Network.of(gb200)
    rows = plan_rows(work, gb200, layout, network, ("fp8", "nvfp4"), tokens=2e12, dollars_per_gpu_hour=3.0, pue=1.25)
    for row, projected in zip(rows, project(work, gb200, ("fp8", "nvfp4"), layout=layout).rows, strict=True):
        seconds = 2e12 / (projected.tokens_per_sec * 512)
        assert row.days == pytest.approx(seconds / 86400)
        assert row.gpu_hours == pytest.approx(512 * seconds / 3600)
        assert row.dollars == pytest.approx(3.0 * row.gpu_hours)
        assert row.mwh == pytest.approx(row.gpu_hours * 1200 * 1.25 / 1e6)  # GB200's ~1,200 W limit, PUE 1.25
    fp8, nvfp4 = rows
    assert nvfp4.days < fp8.days and nvfp4.mwh / fp8.mwh == pytest.approx(nvfp4.days / fp8.days)
    # a recipe drawing less power costs less energy and the same time
    lighter = plan_rows(
        work, gb200, layout, network, ("nvfp4",), tokens=2e12, dollars_per_gpu_hour=3.0, pue=1.25,
        power={"nvfp4": 0.8},
    )[0]  # fmt: skip
    assert lighter.days == nvfp4.days and lighter.mwh == pytest.approx(0.8 * nvfp4.mwh)


def test_more_gpus_train_faster_and_cost_more_with_the_batch_held(tmp_path):
    plot = tmp_path / "plan.png"
    data = json.loads(main_plan({**PLAN, "sweep": "256,1024", "json": True, "plot": str(plot), "recipes": "bf16"}))
    rows = data["plan"]
    assert [r["gpus"] for r in rows] == [256, 512, 1024] and data["tokens"] == 2e12
    days = [r["days"] for r in rows]
    hours = [r["gpu_hours"] for r in rows]
    assert days[0] > days[1] > days[2] and hours[0] < hours[1] < hours[2]  # fewer microbatches, larger bubble
    assert plot.stat().st_size > 10_000
    assert scaled_layout(Layout(gpus=512, gbs=1024, seq=8192, tp=2), 1024).microbatches == 2


def test_the_table_compares_each_recipe_with_bf16_at_its_gpu_count():
    text = main_plan({**PLAN, "recipes": "bf16,nvfp4"})
    lines = text.splitlines()
    assert lines[0].startswith("plan: llama3-70b on GB200, TP2 PP4 VP5 CP1 EP1 DP64 MBS1 GBS1024, 2.00T tokens")
    assert lines[-2].split()[:2] == ["512", "bf16"] and lines[-2].endswith("1.00x")
    assert lines[-1].split()[:2] == ["512", "nvfp4"]


@pytest.mark.parametrize(
    "text, tokens", [("15T", 15e12), ("300B", 3e11), ("2.5e12", 2.5e12), ("1_000_000", 1e6), ("7m", 7e6)]
)
def test_token_budgets_read_as_written(text, tokens):
    assert parse_tokens(text) == tokens


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(tokens="lots"), ["--tokens 'lots'", "15T"]),
        (dict(tokens="-1T"), ["--tokens must be a positive number"]),
        (dict(sweep="1024,many"), ["--sweep", "GPU counts"]),
        (dict(sweep="100"), ["at 100 GPUs", "--gpus 100"]),
        (dict(power="nvfp4=2"), ["--power", "RECIPE=FRACTION"]),
        (dict(price=-1.0), ["--price"]),
        (dict(gpus=None, tp=None, pp=None, vp=None, gbs=None), ["needs --gpus"]),
    ],
)
def test_bad_plans_are_refused_in_one_line(change, words):
    with pytest.raises(UserError) as info:
        main_plan({**PLAN, **change})
    assert "\n" not in str(info.value)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_the_cli_plans_and_refuses_with_exit_2():
    base = [sys.executable, "-m", "fp4lm", "plan", "--model", "llama3-70b", "--gpu", "gb300", "--tokens", "1T"]
    done = subprocess.run([*base, "--gpus", "64", "--pp", "4", "--gbs", "256"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].split()[:2] == ["64", "nvfp4"]
    refused = subprocess.run([*base, "--gpus", "64", "--power", "x"], capture_output=True, text=True)
    assert refused.returncode == 2 and "--power 'x'" in refused.stderr and "Traceback" not in refused.stderr


def test_power_fractions_parse():
    assert parse_power("nvfp4=0.85, fp8=0.9") == {"nvfp4": 0.85, "fp8": 0.9} and parse_power(None) == {}
