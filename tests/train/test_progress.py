"""The progress display: plain lines off a terminal, a rich bar on one; nothing from non-main processes."""

import io

from fp4lm.train.progress import Reporter, format_step_line

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
