"""profile.start_step / profile.steps: a jax.profiler trace of a window of steps in RUN_DIR/profile/."""

import json

import pytest

from fp4lm.config import load_config
from fp4lm.errors import UserError
from fp4lm.train import train
from fp4lm.train.profile import PROFILE_DIR


def _config(tiny, run_dir, *extra):
    quiet = ["eval.batches=0", "eval.sample_tokens=0", "checkpoint.enabled=false", "precision.recipe=bf16"]
    return load_config(None, [*tiny, *quiet, "train.steps=4", f"train.run_dir={run_dir}", *extra])


def test_a_two_step_window_writes_a_trace_named_in_the_summary(tmp_path, tiny):
    run_dir = tmp_path / "run"
    summary = train(_config(tiny, run_dir, "profile.start_step=2", "profile.steps=2"))
    traces = summary["profile_traces"]
    assert traces and all(name.startswith(f"{PROFILE_DIR}/") and name.endswith(".xplane.pb") for name in traces)
    for name in traces:
        assert (run_dir / name).stat().st_size > 0
    assert json.loads((run_dir / "summary.json").read_text())["profile_traces"] == traces


def test_profiling_is_off_by_default(tmp_path, monkeypatch):
    """With the default profile.steps=0 the window never calls the profiler nor waits for a step."""
    import jax

    from fp4lm.config import ProfileConfig
    from fp4lm.train.profile import ProfileWindow

    calls = []
    monkeypatch.setattr(jax.profiler, "start_trace", lambda *a, **k: calls.append("start"))
    monkeypatch.setattr(jax.profiler, "stop_trace", lambda *a, **k: calls.append("stop"))

    class Meter:  # any use of the meter would wait for the device
        def excluded(self, result):
            calls.append("excluded")

    window = ProfileWindow(ProfileConfig(), tmp_path)
    for step in range(1, 10):
        window.before_step(step, Meter(), None)  # pyright: ignore[reportArgumentType]
        window.after_step(step, Meter(), None)  # pyright: ignore[reportArgumentType]
    window.close()
    assert calls == [] and window.summary() == {} and not (tmp_path / PROFILE_DIR).exists()


def test_a_window_beyond_train_steps_is_refused():
    with pytest.raises(UserError, match=r"profile window steps 4-5 .* beyond train.steps=4"):
        load_config(None, ["train.steps=4", "profile.start_step=4", "profile.steps=2"])
    load_config(None, ["train.steps=4", "profile.start_step=3", "profile.steps=2"])  # ends at the last step
