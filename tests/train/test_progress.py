"""The progress display: plain lines off a terminal, a rich bar on one; nothing from non-main processes."""

import io

from fp4lm.train.progress import EtaClock, Reporter, format_step_line

RECORD = {"loss": 3.25, "lr": 1e-3, "tokens_per_sec": 12345.6, "tflops_per_sec": 0.0123, "skipped_steps": 2}


def test_plain_lines():
    out = io.StringIO()
    reporter = Reporter("auto", stream=out)  # a StringIO is not a terminal
    assert not reporter.rich
    reporter.start(first_step=0, total=100)
    reporter.message("hello")
    reporter.logged(10, RECORD)
    reporter.finish()
    lines = out.getvalue().splitlines()
    assert lines[0] == "hello"
    assert lines[1].startswith("step 10/100 | loss 3.2500 | lr 1.00e-03 | 12,346 tok/s | 0.012 TFLOP/s | skipped 2")
    assert "ETA" in lines[1]


def test_nan_loss_is_shown():
    assert "loss nan" in format_step_line(3, 10, {**RECORD, "loss": None}, None)


def test_rich_bar():
    out = io.StringIO()
    reporter = Reporter("rich", stream=out)
    assert reporter.rich
    reporter.start(first_step=0, total=50)
    reporter.advance(5)
    reporter.logged(10, RECORD)
    reporter.message("step 10: val_loss 3.0000")
    reporter.finish()
    text = out.getvalue()
    assert "val_loss 3.0000" in text and "3.2500" in text and "12,346" in text


def test_disabled_reporter_prints_nothing():
    out = io.StringIO()
    reporter = Reporter("rich", enabled=False, stream=out)
    reporter.start(first_step=0, total=5)
    reporter.message("x")
    reporter.logged(1, RECORD)
    reporter.finish()
    assert out.getvalue() == ""


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_eta_leaves_out_the_compile_step():
    """A 40 s compile does not make the ETA of a 1-second-per-step run read minutes."""
    clock = FakeClock()
    eta = EtaClock(100, clock)
    eta.compiling(0)
    clock.now = 40.0  # the first step compiles
    eta.compiled(1)
    assert eta.eta(1) is None  # no steady step yet
    clock.now = 50.0  # ten steady steps of 1 s
    assert eta.eta(11) == 89.0
    eta.compiling(11)  # the late bf16 switch recompiles: its 30 s are left out too
    clock.now = 80.0
    eta.compiled(12)
    clock.now = 82.0
    assert eta.eta(14) == (10.0 + 2.0) / (10 + 2) * 86


def test_plain_lines_say_eta_after_warm_up_until_a_steady_step():
    clock = FakeClock()
    out = io.StringIO()
    reporter = Reporter("plain", stream=out, clock=clock)
    reporter.start(first_step=0, total=100)
    reporter.compiling(0)
    clock.now = 41.25
    assert reporter.compiled(1) == 41.25
    reporter.logged(1, RECORD)
    clock.now = 42.25
    reporter.logged(2, RECORD)
    lines = out.getvalue().splitlines()
    assert lines[0] == "compiling the training step…"
    assert lines[1] == "compiled in 41.2 s"
    assert lines[2].endswith("| ETA after warm-up")
    assert lines[3].endswith("| ETA 1m38s")  # 1 s per step, 98 steps left: not 14 min


def test_rich_bar_shows_eta_after_warm_up():
    out = io.StringIO()
    reporter = Reporter("rich", stream=out)
    reporter.start(first_step=0, total=50)
    reporter.compiling(0)
    reporter.compiled(1)
    reporter.advance(1)
    reporter.finish()
    text = out.getvalue()
    assert "compiling the training step" in text and "compiled in" in text and "ETA after warm-up" in text
