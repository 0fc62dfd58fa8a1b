"""End to end: `fp4lm compare --preset quick --recipes bf16,nvfp4` with the real trainer, then a rerun."""

import importlib.util
import json
import math
import pathlib
import time

import matplotlib.image
import pytest

from fp4lm.errors import UserError
from fp4lm.report.results import TABLE_COLUMNS, format_cell
from tests.compare.helpers_report import main_compare

REPO = pathlib.Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("fp4lm.cli") is None, reason="the trainer CLI (fp4lm/cli.py) is not there yet"
    ),
]


def test_quick_compare_end_to_end_and_reuse(tmp_path):
    out = tmp_path / "quick"
    argv = [
        "--preset",
        "quick",
        "--recipes",
        "bf16,nvfp4",
        "--out",
        str(out),
        "data.path=bundled:shakespeare",
    ]
    assert main_compare(argv) == 0

    for name in (
        "results.json",
        "report.html",
        "report.md",
        "loss.png",
        "gap.png",
        "throughput.png",
        "quant_nvfp4.png",
        "records/bf16.json",
        "records/nvfp4.json",
    ):
        assert (out / name).is_file(), name
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == PNG_SIGNATURE
        assert matplotlib.image.imread(png).shape[0] > 100

    results = json.loads((out / "results.json").read_text())
    assert results["order"] == ["bf16", "nvfp4"] and results["baseline"] == "bf16"
    for label in ("bf16", "nvfp4"):
        entry = results["recipes"][label]
        config = entry["config"]
        steps, tokens_per_step = config["train"]["steps"], config["train"]["batch_size"] * config["data"]["seq_len"]
        train, val = entry["curves"]["train"], entry["curves"]["val"]
        assert train["step"] and train["step"][-1] == steps
        assert train["tokens"] == [s * tokens_per_step for s in train["step"]]
        assert all(math.isfinite(loss) for loss in train["loss"])
        assert val["step"] and all(math.isfinite(loss) for loss in val["val_loss"])
        final = entry["final"]
        assert final["val_loss"] < math.log(256)  # learned something beyond uniform over bytes
        assert final["perplexity"] == pytest.approx(math.exp(final["val_loss"]))
        assert final["tokens_per_sec"] > 0 and final["skipped_steps"] is not None
        assert entry["status"] == "finished" and config["precision"]["recipe"] == label
    nvfp4 = results["recipes"]["nvfp4"]
    assert nvfp4["curves"]["gap"]["step"] == results["recipes"]["bf16"]["curves"]["val"]["step"]
    assert nvfp4["final"]["gap_pct"] is not None
    assert nvfp4["quant_stats"]["step"] and nvfp4["quant_stats"]["layers"]
    layer_stats = next(iter(nvfp4["quant_stats"]["layers"].values()))
    assert any(v is not None and 0 < v < 1 for op in layer_stats.values() for v in op["rel_err"])

    page = (out / "report.html").read_text().replace("&#x27;", "'")
    for row in results["table"]:
        for key, _ in TABLE_COLUMNS:
            assert f">{format_cell(key, row[key])}</td>" in page
    assert "--recipes bf16,nvfp4" in (out / "report.md").read_text()

    # A second invocation reuses both finished runs: no training subprocess, metrics untouched.
    watched = [out / "runs" / label / "metrics.jsonl" for label in ("bf16", "nvfp4")]
    watched += [out / "logs" / f"{label}.log" for label in ("bf16", "nvfp4")]
    before = {path: path.stat().st_mtime_ns for path in watched}
    start = time.perf_counter()
    assert main_compare(argv) == 0
    assert time.perf_counter() - start < 60
    assert {path: path.stat().st_mtime_ns for path in watched} == before
    assert json.loads((out / "results.json").read_text())["table"] == results["table"]

    # A finished run whose record was lost: the settings the real trainer saved in its config.json are the
    # requested ones, so it is recorded again without training; under other settings it is refused.
    lost = json.loads((out / "records" / "nvfp4.json").read_text())
    (out / "records" / "nvfp4.json").unlink()
    with pytest.raises(UserError, match=r"recipe 'nvfp4': .* \(optimizer.b1: started with 0.9, requested 0.5\)"):
        main_compare([*argv[:2], "--recipes", "nvfp4", *argv[4:], "optimizer.b1=0.5"])
    assert main_compare(argv) == 0
    assert {path: path.stat().st_mtime_ns for path in watched} == before
    assert json.loads((out / "records" / "nvfp4.json").read_text())["final"] == lost["final"]

    # Two seeds with the real trainer: bf16 on seeds 0 and 1, nvfp4 as a single-seed ablation. Seed 0 of both
    # is the run above (identical settings: copied, saying so); only bf16 on seed 1 trains.
    seeded_argv = [*argv[:2], "--recipes", "bf16", "--ablations", "nvfp4", "--seeds", "0,1", *argv[4:]]
    assert main_compare(seeded_argv) == 0
    assert {path: path.stat().st_mtime_ns for path in watched} == before
    assert (out / "logs" / "bf16_seed-1.log").is_file() and not (out / "logs" / "nvfp4_seed-0.log").exists()
    seed0 = json.loads((out / "records" / "bf16_seed-0.json").read_text())
    assert seed0["reused_from"] == str(out / "records" / "bf16.json")
    seeded = json.loads((out / "results.json").read_text())
    bf16 = seeded["recipes"]["bf16"]
    assert bf16["seeds"] == [0, 1] and json.loads((out / "records" / "bf16_seed-1.json").read_text())["seed"] == 1
    first, second = (p["val_loss"] for p in bf16["per_seed"])
    assert first == results["recipes"]["bf16"]["final"]["val_loss"] and second != first  # the seed changes the run
    assert bf16["final"]["val_loss"] == pytest.approx((first + second) / 2)
    nvfp4_row = next(row for row in seeded["table"] if row["label"] == "nvfp4")
    assert nvfp4_row["seeds"] == "0 (single seed)" and nvfp4_row["verdict"] == "1 seed: no interval"
    assert nvfp4_row["gap_pct"] == pytest.approx(results["recipes"]["nvfp4"]["final"]["gap_pct"])
