"""bench/device_check.sh cannot rot: its whole CPU dry run, and the bookkeeping that keeps results on a timeout."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

SCRIPT = REPO / "bench" / "device_check.sh"
H200_BUDGET_S = 8 * 60


def load_device_check():
    spec = importlib.util.spec_from_file_location("device_check", REPO / "bench" / "device_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stage_limits_add_up_to_at_most_eight_minutes():
    text = SCRIPT.read_text()
    stages = [int(limit) for limit in re.findall(r"^\s*stage \w+ (\d+)\b", text, flags=re.M)]
    tests = int(re.search(r"timeout --kill-after=(\d+) \$\(\((\d+) \* scale\)\) \"\$py\" -m pytest", text)[2])
    summary = int(re.search(r"timeout (\d+) \"\$py\" bench/device_check.py --stage summary", text)[1])
    assert len(stages) == 5 and "stage compare " in text
    assert sum(stages) + tests + summary <= H200_BUDGET_S


def test_gpu_tests_run_in_parallel_and_do_not_stop_at_the_first_failure():
    text = SCRIPT.read_text()
    assert "--maxfail=50" in text and 'options=(-n "$workers")' in text
    assert " -x " not in text and "tests/numerics tests/quant" in text


def test_results_survive_a_stage_that_is_stopped(tmp_path):
    """Each stage is saved as it ends; a stopped stage is noted without losing what it had saved."""
    device_check = load_device_check()
    out = tmp_path / "device_check.json"
    results = device_check.Results(out)
    results.save("bits", {"status": "running", "rows": [{"mismatched_bytes": 0}]})
    args = type("Args", (), {"name": "bits", "status": "timeout", "seconds": 61.0})()
    device_check.stage_note(args, device_check.Results(out))
    saved = json.loads(out.read_text())["stages"]["bits"]
    assert saved == {"status": "timeout", "rows": [{"mismatched_bytes": 0}], "seconds": 61.0}


def test_the_tests_stage_reads_the_pytest_summary(tmp_path):
    device_check = load_device_check()
    log = tmp_path / "log"
    log.write_text("FAILED tests/numerics/test_a.py::test_b - assert 1 == 2\n3 failed, 120 passed, 2 skipped in 9s\n")
    out = tmp_path / "device_check.json"
    args = type("Args", (), {"log": str(log), "exit_code": 1, "seconds": 9.0})()
    device_check.stage_tests(args, device_check.Results(out))
    saved = json.loads(out.read_text())["stages"]["tests"]
    assert saved["counts"] == {"failed": 3, "passed": 120, "skipped": 2}
    assert saved["failures"] == ["tests/numerics/test_a.py::test_b"] and saved["status"] == "failed"


def test_a_tests_log_cut_short_still_counts_every_outcome(tmp_path):
    device_check = load_device_check()
    log = tmp_path / "log"
    log.write_text(
        "[gw0] [ 10%] PASSED tests/numerics/test_a.py::test_x \n"
        "[gw1] [ 20%] FAILED tests/quant/test_b.py::test_y[nvfp4] \n"
        "[gw0] [ 30%] PASSED tests/numerics/test_a.py::test_z \n"
    )
    out = tmp_path / "device_check.json"
    args = type("Args", (), {"log": str(log), "exit_code": 124, "seconds": 210.0})()
    device_check.stage_tests(args, device_check.Results(out))
    saved = json.loads(out.read_text())["stages"]["tests"]
    assert saved["counts"] == {"passed": 2, "failed": 1} and saved["status"] == "timeout"
    assert saved["failures"] == ["tests/quant/test_b.py::test_y[nvfp4]"]


def test_cpu_dry_run_of_the_whole_script(tmp_path):
    # The stage limits are an H200's; a shared 2-core CPU running the tiny shapes gets three times as long.
    env = os.environ | {
        "DEVICE_CHECK_DRY_RUN": "1",
        "DEVICE_CHECK_TIME_SCALE": "3",
        "JAX_PLATFORMS": "cpu",
        "PYTHON": sys.executable,
    }
    run = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    stages = json.loads((tmp_path / "device_check.json").read_text())["stages"]
    assert {name: stage["status"] for name, stage in stages.items()} == dict.fromkeys(
        ["versions", "tests", "bits", "bandwidth", "train", "compare"], "ok"
    ), stages
    assert stages["tests"]["counts"] == {"passed": 1}
    assert stages["bits"]["mismatched_bytes"] == 0 and len(stages["bits"]["rows"]) == 56
    assert stages["bandwidth"]["quantize_xla_bytes"] >= stages["bandwidth"]["quantize_ideal_bytes"]
    assert [row["recipe"] for row in stages["train"]["rows"]] == ["bf16", "nvfp4"]
    assert "| nvfp4 / bf16 step time | ok |" in run.stdout
    # The compare stage: `fp4lm compare --preset gpu` (tiny shapes) wrote its records and report.
    assert [row["recipe"] for row in stages["compare"]["rows"]] == ["bf16", "nvfp4"]
    assert "--preset" in stages["compare"]["command"] and "gpu" in stages["compare"]["command"]
    compare = tmp_path / "compare"
    for name in ("records/bf16.json", "records/nvfp4.json", "report.html", "results.json"):
        assert (compare / name).is_file(), name
    nvfp4 = json.loads((compare / "records" / "nvfp4.json").read_text())
    assert nvfp4["config"]["train"]["steps"] == 4 and nvfp4["config"]["optimizer"]["lr"] == 1e-3  # from the preset
    assert stages["compare"]["rows"][1]["gap_pct"] is not None
    assert "| compare --preset gpu (shortened): nvfp4 | finished |" in run.stdout


def test_the_compare_stage_can_be_skipped_and_names_what_it_lacks(tmp_path, monkeypatch):
    text = SCRIPT.read_text()
    assert '"${1:-}" == "--no-compare"' in text and 'if [[ -n "$compare" ]]; then' in text
    device_check = load_device_check()
    monkeypatch.setattr(device_check, "COMPARE_NEEDS", ("no_such_module_for_the_test",))
    out = tmp_path / "device_check.json"
    args = type("Args", (), {"out": str(out), "dry_run": True, "compare_steps": 4})()
    assert device_check.stage_compare(args, device_check.Results(out)) == 0
    saved = json.loads(out.read_text())["stages"]["compare"]
    assert saved == {"status": "skipped", "reason": "not installed: no_such_module_for_the_test"}


def test_without_a_gpu_the_real_check_stops_after_saying_what_is_missing(tmp_path):
    env = os.environ | {"JAX_PLATFORMS": "cpu", "PYTHON": sys.executable}
    env.pop("DEVICE_CHECK_DRY_RUN", None)
    run = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    assert "MISSING: a CUDA plugin for jaxlib" in run.stdout and "== tests" not in run.stdout
    stages = json.loads((tmp_path / "device_check.json").read_text())["stages"]
    assert list(stages) == ["versions"] and stages["versions"]["status"] == "error"
