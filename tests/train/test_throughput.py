"""The step-time meter (with a fake clock, no jax), MFU only against a known peak, and the GPU peak table."""

import math

import pytest

from fp4lm.hardware import peak_bf16_tflops
from fp4lm.train.throughput import StepMeter, throughput


class FakeDevice:
    """A clock and a `block` function: blocking on a step's result advances time to when it is done."""

    def __init__(self):
        self.now = 0.0
        self.blocked_on = []

    def clock(self) -> float:
        return self.now

    def block(self, result) -> None:
        self.blocked_on.append(result)
        self.now = max(self.now, result)  # `result` stands for the time at which its step completes


def test_window_is_timed_to_the_completion_of_its_last_step():
    device = FakeDevice()
    meter = StepMeter(100, block=device.block, clock=device.clock)
    meter.step_taken()  # step 1 dispatched at t=0, done at t=5 (it compiles)
    assert meter.window_done(5.0) == 5.0
    device.now = 5.001  # dispatching is nearly free; the steps run later
    for _ in range(3):
        meter.step_taken()
    assert meter.window_done(11.0) == pytest.approx(2.0)  # steps 2-4: from t=5 to t=11
    assert device.blocked_on == [5.0, 11.0]
    assert meter.steady_tokens_per_sec == pytest.approx(300 / 6.0)  # the compiling first window is left out


def test_excluded_time_is_not_step_time():
    device = FakeDevice()
    meter = StepMeter(10, block=device.block, clock=device.clock)
    meter.step_taken()
    meter.window_done(1.0)
    meter.step_taken()
    with meter.excluded(2.0):  # step 2 done at t=2, then an evaluation until t=7
        device.now = 7.0
    meter.step_taken()
    assert meter.window_done(8.0) == pytest.approx(1.0)  # (8 - 1 - 5) / 2
    assert device.blocked_on == [1.0, 2.0, 8.0]


def test_a_recompiling_window_does_not_count_towards_steady_throughput():
    device = FakeDevice()
    meter = StepMeter(10, block=device.block, clock=device.clock)
    assert meter.steady_tokens_per_sec is None
    meter.step_taken()
    meter.window_done(1.0)  # compiles
    meter.step_taken()
    meter.window_done(2.0)  # steady: 10 tokens in 1 s
    meter.compiles_next()
    meter.step_taken()
    meter.window_done(9.0)  # re-jitted: left out
    meter.step_taken()
    meter.window_done(11.0)  # steady: 10 tokens in 2 s
    assert meter.steady_tokens_per_sec == pytest.approx(20 / 3.0)


def test_a_window_needs_a_step():
    device = FakeDevice()
    meter = StepMeter(10, block=device.block, clock=device.clock)
    with pytest.raises(ValueError, match="before any step_taken"):
        meter.window_done(1.0)


def test_mfu_only_against_a_known_peak():
    kwargs = dict(step_time_s=0.5, tokens_per_step=1000, flops_per_step=4e12, num_devices=2)
    assert throughput(**kwargs, peak_tflops=None)["mfu"] is None
    assert math.isclose(throughput(**kwargs, peak_tflops=989.0)["mfu"], 4.0 / 989.0)


@pytest.mark.parametrize(
    ("kind", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA B200", 2250.0),
        ("NVIDIA GB200", 2500.0),
        ("NVIDIA GB300", 2500.0),
        ("cpu", None),
        ("TFRT_CPU_0", None),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_device_peaks(kind, peak):
    assert peak_bf16_tflops(kind) == peak
