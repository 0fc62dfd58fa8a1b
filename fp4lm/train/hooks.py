"""The hooks beside the training loop (fp4lm/train/loop.py): each owns one concern the loop would otherwise mix in.

Before a step is dispatched: `PrecisionSwitch`, `BatchFeed` and `CompileNotice`. Once step N is dispatched:
`SkipWatch` reads step N-1's skip counter, then each `Hook` in the loop's list runs (`TrainRecords`,
`QuantStats`, `Evaluation`, `Checkpoints`). Work that is not training runs inside the step meter's `excluded`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Protocol

import jax
import numpy as np

import fp4lm.data
from fp4lm.config import Config
from fp4lm.errors import TrainingDiverged
from fp4lm.flops import training_flops_per_step
from fp4lm.hardware import peak_bf16_tflops
from fp4lm.jsonio import json_value
from fp4lm.sharding import batch_sharding
from fp4lm.train import model_setup
from fp4lm.train.bf16_switch import Bf16Switch
from fp4lm.train.checkpoint import Checkpointer
from fp4lm.train.hosts import global_batch, replicated
from fp4lm.train.metrics import MetricsWriter
from fp4lm.train.progress import Reporter
from fp4lm.train.run_functions import RunFunctions, first_nonfinite_layer
from fp4lm.train.setup import RunSetup
from fp4lm.train.state import TrainState
from fp4lm.train.throughput import StepMeter, throughput


class Stepped(Protocol):
    """The run as its hooks see it: the state after the last dispatched step, the step functions of the
    current precision policy (the precision switch replaces them), and its switch to bf16."""

    state: TrainState
    functions: RunFunctions
    switch: Bf16Switch


class Hook(Protocol):
    """`after_step` runs once step `step` (1-based) is dispatched; `metrics` is its result, not waited for."""

    def after_step(self, step: int, run: Stepped, metrics: dict, batch: dict) -> None: ...


class CompileNotice:
    """Says that the next step compiles (the first, and the first after the precision switch) and, once it is
    done, how long that took; the reporter leaves that time out of the ETA and the meter out of tokens/s."""

    def __init__(self, reporter: Reporter, meter: StepMeter):
        self.reporter, self.meter = reporter, meter
        self.what: str | None = "the training step"  # the meter counts the first window as compiling already

    def expect(self, what: str) -> None:
        self.what = what
        self.meter.compiles_next()

    def before_step(self, step: int) -> None:
        if self.what:
            self.reporter.compiling(step, self.what)

    def after_step(self, step: int, metrics: dict) -> None:
        if self.what:
            jax.block_until_ready(metrics)
            self.reporter.compiled(step)
            self.what = None


class PrecisionSwitch:
    """The late switch of every linear layer to bf16 after step `at` (fp4lm.train.bf16_switch): before the step
    after it, new step functions (unless the run resumed there in bf16), a precision_switch event and a line."""

    def __init__(
        self, setup: RunSetup, at: int | None, writer: MetricsWriter, reporter: Reporter, compiling: CompileNotice
    ):
        self.setup, self.at, self.writer, self.reporter, self.compiling = setup, at, writer, reporter, compiling

    def before_step(self, step: int, run: Stepped) -> None:
        if step != self.at:
            return
        policy = model_setup.policy_at(step, self.setup.config, self.setup.quantized_policy, switch=self.at)
        if policy == self.setup.quantized_policy:  # nothing was quantized: nothing switches
            return
        if policy != run.functions.policy:  # else resumed at the switch: bf16 from the start
            run.functions = RunFunctions.build(self.setup, policy)
            self.compiling.expect("the bf16 training step")
        self.writer.write({"step": step, "event": "precision_switch", "to": "bf16"})
        self.reporter.message(f"step {step}: precision switch, all linear layers now bf16")


class BatchFeed:
    """The training batches as global arrays, and the seconds spent waiting for them (data_wait_s)."""

    def __init__(self, iterator: Iterator[dict], setup: RunSetup):
        self.iterator, self.sharding = iterator, batch_sharding(setup.mesh)
        self.batch_size = setup.config.train.batch_size
        self.waited_s = 0.0  # since the last `take_waited_s`

    def next(self) -> dict:
        start = time.perf_counter()
        batch = global_batch(next(self.iterator), self.sharding, self.batch_size)
        self.waited_s += time.perf_counter() - start
        return batch

    def take_waited_s(self) -> float:
        waited, self.waited_s = self.waited_s, 0.0
        return waited


class SkipWatch:
    """Stops a run whose loss scaler skipped loss_scale.max_consecutive_skips steps in a row, naming the first
    layer whose telemetry on the last skipped batch is non-finite."""

    def __init__(self, setup: RunSetup):
        self.setup, self.limit = setup, setup.config.loss_scale.max_consecutive_skips

    def check(self, run: Stepped, step: int, metrics: dict, batch: dict) -> None:
        in_a_row = int(metrics["consecutive_skips"])
        if in_a_row < self.limit:
            return
        to_device = lambda n: replicated(self.setup.mesh, np.int32(n))  # noqa: E731
        layer = first_nonfinite_layer(run.functions, run.state, batch, step, self.setup.paths, to_device)
        first = step - in_a_row + 1
        raise TrainingDiverged(
            f"training diverged: {in_a_row} consecutive steps with non-finite gradients (steps {first}-{step}, "
            f"loss_scale.max_consecutive_skips={self.limit}); {layer}; lower optimizer.lr, raise "
            "optimizer.warmup_steps or keep more layers in bf16 (precision.bf16_last_layers)"
        )


class TrainRecords:
    """metrics.jsonl's train records and the console's step lines, at step 1, every metrics.log_every steps and
    the last: waits for the step itself, so step_time_s (of the window since the last record) covers its
    computation. Also moves the progress bar; keeps the last loss and skipped_steps for the summary. A MoE
    model's records also carry "routing": {block path: {metric: value}} (fp4lm.model.moe.routing_metrics)."""

    def __init__(
        self,
        config: Config,
        vocab_size: int,
        first_step: int,
        meter: StepMeter,
        feed: BatchFeed,
        writer: MetricsWriter,
        reporter: Reporter,
    ):
        self.config, self.meter, self.feed, self.writer, self.reporter = config, meter, feed, writer, reporter
        self.flops_per_step = training_flops_per_step(
            config.model, vocab_size, config.data.seq_len, config.train.batch_size
        ).total
        self.peak_tflops = config.metrics.peak_tflops  # None: the device's own, if it is a known GPU
        if self.peak_tflops is None:
            self.peak_tflops = peak_bf16_tflops(jax.devices()[0].device_kind)
        self.loss, self.skipped_steps = None, 0
        self.window_start = first_step  # the step the current window began after

    def after_step(self, step: int, run: Stepped, metrics: dict, batch: dict) -> None:
        self.reporter.advance(step)
        if not (step == 1 or step % self.config.metrics.log_every == 0 or step == self.config.train.steps):
            return
        step_time_s = self.meter.window_done(metrics)
        data_wait_s = self.feed.take_waited_s() / (step - self.window_start)
        self.window_start = step
        fetched = jax.device_get(metrics)
        record = {
            "step": step,
            **{k: fetched[k] for k in ("loss", "lr", "grad_norm", "loss_scale")},
            "skipped_steps": int(fetched["skipped_steps"]),
            "data_wait_s": data_wait_s,
        }
        if "routing" in fetched:  # a MoE model: per block, what its router did in this step
            record["routing"] = fetched["routing"]
        record.update(
            throughput(
                step_time_s=step_time_s,
                tokens_per_step=self.meter.tokens_per_step,
                flops_per_step=self.flops_per_step,
                num_devices=jax.device_count(),
                peak_tflops=self.peak_tflops,
            )
        )
        record = json_value(record)
        self.writer.write(record)
        self.reporter.logged(step, record)
        self.loss, self.skipped_steps = record["loss"], record["skipped_steps"]


class QuantStats:
    """Every metrics.quant_stats_every steps, the quantization telemetry of the step's batch as a
    {"step", "quant_stats"} record; nothing while every layer is bf16."""

    def __init__(self, setup: RunSetup, meter: StepMeter, writer: MetricsWriter):
        self.setup, self.meter, self.writer = setup, meter, writer

    def after_step(self, step: int, run: Stepped, metrics: dict, batch: dict) -> None:
        if step % self.setup.config.metrics.quant_stats_every != 0:
            return
        with self.meter.excluded(metrics):
            if not any(run.functions.policy.recipe_for(p).is_quantized for p in self.setup.paths):
                return
            step_number = replicated(self.setup.mesh, np.int32(step))
            stats = run.functions.stats_step(run.state.model_variables(), batch, run.state.rng, step_number)
            self.writer.write({"step": step, "quant_stats": jax.device_get(stats)})


def eval_sets(data: fp4lm.data.Data, setup: RunSetup) -> dict[str, list[dict]]:
    """Validation set name ("" when there is one) -> its eval.batches global batches."""
    config = setup.config
    if not config.eval.batches:
        return {}
    sharding = batch_sharding(setup.mesh)
    return {
        name: [global_batch(b, sharding, config.train.batch_size) for b in batches]
        for name, batches in data.eval_sets(config.eval.batches).items()
    }


class Evaluation:
    """val_loss every eval.every steps and at the last; with several sources also val_loss/<name> per source
    (val_loss: their weighted mean). Keeps the last val_loss for the summary."""

    def __init__(
        self,
        sets: dict[str, list[dict]],
        data: fp4lm.data.Data,
        config: Config,
        meter: StepMeter,
        writer: MetricsWriter,
        reporter: Reporter,
    ):
        self.sets, self.data, self.config = sets, data, config
        self.meter, self.writer, self.reporter = meter, writer, reporter
        self.val_loss: float | None = None

    @property
    def enabled(self) -> bool:
        return any(self.sets.values())

    def after_step(self, step: int, run: Stepped, metrics: dict, batch: dict) -> None:
        if self.enabled and (step % self.config.eval.every == 0 or step == self.config.train.steps):
            with self.meter.excluded(metrics):
                self.val_loss = self.evaluate(step, run)

    def evaluate(self, step: int, run: Stepped) -> float | None:
        per_set = {
            name: float(
                np.mean(jax.device_get([run.functions.eval_step(run.state.model_variables(), b) for b in batches]))
            )
            for name, batches in self.sets.items()
        }
        val_loss = self.data.val_loss(per_set)
        record = {"step": step, "val_loss": val_loss}
        if len(per_set) > 1:
            record.update({f"val_loss/{name}": loss for name, loss in per_set.items()})
        record = json_value(record)
        self.writer.write(record)
        show = lambda v: f"{v:.4f}" if math.isfinite(v) else "nan"  # noqa: E731
        sources = ", ".join(f"{name} {show(loss)}" for name, loss in per_set.items()) if len(per_set) > 1 else ""
        self.reporter.message(f"step {step}: val_loss {show(val_loss)}" + (f" ({sources})" if sources else ""))
        return record["val_loss"]


def save_checkpoint(
    checkpointer: Checkpointer,
    step: int,
    state: TrainState,
    data: fp4lm.data.Data,
    config: Config,
    switch: Bf16Switch,
) -> None:
    """Step `step`'s state with the data iterator's position, the config, the tokenizer and the switch to bf16
    made by then (checkpoint.py verifies each leaf it writes)."""
    checkpointer.save(
        step,
        state,
        data_iter=data.train_iterator.get_state(),
        config=config.to_dict(),
        tokenizer_json=data.tokenizer.to_json(),
        precision=switch.record(step),
    )


class Checkpoints:
    """A checkpoint every checkpoint.every steps and at the last, unless checkpoints are off (no
    checkpointer); `saved_at` is the step last saved."""

    def __init__(self, checkpointer: Checkpointer | None, data: fp4lm.data.Data, config: Config, meter: StepMeter):
        self.checkpointer, self.data, self.config, self.meter = checkpointer, data, config, meter
        self.saved_at: int | None = None

    def after_step(self, step: int, run: Stepped, metrics: dict, batch: dict) -> None:
        if self.checkpointer is None:
            return
        if step % self.config.checkpoint.every == 0 or step == self.config.train.steps:
            with self.meter.excluded(metrics):
                save_checkpoint(self.checkpointer, step, run.state, self.data, self.config, run.switch)
            self.saved_at = step
