"""bench/quantize.py publishes figures only from an idle host: its load guard, without timing anything."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture()
def quantize_bench(monkeypatch, request):
    monkeypatch.syspath_prepend(str(BENCH))
    request.addfinalizer(lambda: sys.modules.pop("host_load", None))
    spec = importlib.util.spec_from_file_location("bench_quantize", BENCH / "quantize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    row = dict(
        dtype="float32",
        shape=[4, 4],
        floor_ms=1.0,
        fp4lm_ms=3.0,
        fused_ms=2.0,
        jax_ms=4.0,
        unfused_ratio_to_floor=3.0,
        ratio_to_floor=2.0,
        ratio_to_jax=0.5,
        goal_ratio_to_floor=2.5,
    )
    monkeypatch.setattr(module, "run", lambda size, repeats: [row])
    return module


def _loads(monkeypatch, module, before, after):
    values = iter([before, after])
    monkeypatch.setattr(module.host_load, "load_average", lambda: next(values))


def test_a_busy_host_is_refused(quantize_bench, monkeypatch, capsys):
    _loads(monkeypatch, quantize_bench, 0.4, 3.2)
    with pytest.raises(SystemExit) as refused:
        quantize_bench.main(["--quick"])
    assert refused.value.code == 3
    captured = capsys.readouterr()
    assert "busy" in captured.err and "3.20 after" in captured.err and "--allow-load" in captured.err
    assert captured.out == ""


def test_allow_load_reports_the_figures_marked_loaded(quantize_bench, monkeypatch, capsys):
    _loads(monkeypatch, quantize_bench, 2.0, 2.5)
    assert quantize_bench.main(["--quick", "--allow-load"]) == 0
    out = capsys.readouterr().out
    assert "**loaded**" in out and "LOADED" in out and "| float32 | 4x4 |" in out


def test_an_idle_host_reports_the_load_with_the_figures(quantize_bench, monkeypatch, capsys):
    _loads(monkeypatch, quantize_bench, 0.3, 0.6)
    assert quantize_bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "load average 0.30 before, 0.60 after (idle" in out and "loaded**" not in out
    assert "| 2.00 (<= 2.5) | 0.50 |" in out
