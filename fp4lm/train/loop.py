"""The training loop: set up (or resume) a run, step, log, evaluate, checkpoint, summarise.

Read top to bottom: `train(config)` builds the pieces (fp4lm/train/setup.py), then runs `_Run.loop`. Steps
are dispatched asynchronously; between log steps the host waits only for the previous step's skip counter
(one step stays queued, so the device never idles). On a log step it waits for the step itself, so the
step time (fp4lm/train/throughput.py) covers the computation, not just the dispatch.
"""

from __future__ import annotations

import contextlib
import json
import math
import time

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

import fp4lm.data
from fp4lm.config import Config, check_micro_batches_per_host
from fp4lm.errors import Terminated, TrainingDiverged
from fp4lm.flops import training_flops_per_step
from fp4lm.hardware import peak_bf16_tflops
from fp4lm.jsonio import json_value, read_jsonl, write_json_atomically
from fp4lm.model.generate import generate
from fp4lm.quant import Policy
from fp4lm.sharding import all_devices, batch_sharding, make_mesh
from fp4lm.train import model_setup
from fp4lm.train.checkpoint import Checkpointer
from fp4lm.train.hosts import global_batch, initialize_distributed, is_main_process, use_compilation_cache
from fp4lm.train.memory import check_training_fits
from fp4lm.train.metrics import METRICS_FILE, MetricsWriter, drop_records_after
from fp4lm.train.optimizer import effective_warmup_steps
from fp4lm.train.profile import ProfileWindow
from fp4lm.train.progress import Reporter
from fp4lm.train.run_dir import RUN_CONFIG_FILE, SUMMARY_FILE, RunDirClaim, inspect_run_dir
from fp4lm.train.run_functions import RunFunctions, first_nonfinite_layer
from fp4lm.train.setup import build_run
from fp4lm.train.stop_signal import sigterm_requests_stop
from fp4lm.train.throughput import StepMeter, throughput
from fp4lm.train.validate import check_config_for_training, check_resume_compatible, prepare_run_dir

RECIPE_SETTING = "precision.recipe"  # the "setting" of a precision_switch event that changed the run's recipe


def _last_records(run_dir, step: int) -> dict:
    """From metrics.jsonl: loss and skipped_steps of the newest training record, and val_loss of an
    evaluation at `step` (for a run resumed after its last step, whose records are all on disk)."""
    found: dict = {}
    for record in read_jsonl(run_dir / METRICS_FILE):
        if "loss" in record:
            found.update(loss=record["loss"], skipped_steps=record.get("skipped_steps", 0))
        if "val_loss" in record and record.get("step") == step:
            found["val_loss"] = record["val_loss"]
    return found


def _has_records_after(run_dir, step: int) -> bool:
    return any(isinstance(r.get("step"), int) and r["step"] > step for r in read_jsonl(run_dir / METRICS_FILE))


def _is_recipe_switch(record: dict) -> bool:
    return record.get("event") == "precision_switch" and record.get("setting") == RECIPE_SETTING


def _recipe_summary(run_dir, recipe: str) -> dict:
    """summary.json's "recipe" (the one recipe; for a run whose recipe was switched on resume, each recipe
    with its steps) and "recipe_history" ([{"recipe", "from_step"}]), from metrics.jsonl's switch events."""
    history = []
    for record in read_jsonl(run_dir / METRICS_FILE):
        if record.get("event") == "precision_switch" and record.get("setting") == RECIPE_SETTING:
            if not history:
                history.append({"recipe": record["from"], "from_step": 0})
            if history[-1] != {"recipe": record["to"], "from_step": record["step"]}:  # a restart logs it again
                history.append({"recipe": record["to"], "from_step": record["step"]})
    if len(history) < 2:
        return {"recipe": recipe, "recipe_history": [{"recipe": recipe, "from_step": 0}]}
    ends = [entry["from_step"] for entry in history[1:]] + [None]
    parts = [
        f"{e['recipe']} (steps {e['from_step'] + 1}-{end if end is not None else 'end'})"
        for e, end in zip(history, ends, strict=True)
    ]
    return {"recipe": ", then ".join(parts), "recipe_history": history}


def train(config: Config, *, reporter: Reporter | None = None) -> dict:
    """Trains (or resumes) the run `config` describes; returns the summary also written to summary.json."""
    initialize_distributed(config.distributed)
    all_devices()  # a platform that cannot start is one line, before anything asks JAX for its processes
    check_micro_batches_per_host(config.train.batch_size, config.train.grad_accum_steps, jax.process_count())
    use_compilation_cache(config.train.compilation_cache_dir)
    check_training_fits(config)  # impossible sizes are refused before anything big is built
    check_config_for_training(config)
    quantized_policy = Policy.from_config(config)
    mesh = make_mesh(config.mesh)  # a mesh that does not fit the devices fails before anything is written
    main = is_main_process()
    reporter = reporter or Reporter(config.metrics.progress, enabled=main)
    # Everything is checked before anything is written (fp4lm/train/run_dir.py): the run directory, the
    # settings a resumed run must keep, then the data, read without writing.
    target = inspect_run_dir(config.train.run_dir, overwrite=config.train.overwrite)
    target.check_accepted()  # a refused directory is named before the data is built
    saved_config = target.saved_config()  # what was trained: a resumed run must keep its settings
    if saved_config is not None:
        check_resume_compatible(saved_config, config)
    data = fp4lm.data.build(
        config.data,
        run_dir=target.reusable,
        seed=config.train.seed,
        batch_size=config.train.batch_size,
        shard_index=jax.process_index(),
        shard_count=jax.process_count(),
    )
    with contextlib.ExitStack() as cleanup:
        claim = None
        if main:  # the other processes of a multi-host run share process 0's run directory
            claim = cleanup.enter_context(RunDirClaim(target, config.to_dict()))
            if claim.moved_to is not None:
                reporter.message(f"train.overwrite: the old contents of {target.path} were moved to {claim.moved_to}")
            data.save(target.path)
        else:
            prepare_run_dir(config.train.run_dir)
        checkpointer = None
        if config.checkpoint.enabled:
            checkpointer = Checkpointer(
                target.path,
                keep=config.checkpoint.keep,
                async_save=config.checkpoint.async_save,
                log=reporter.message,
            )
            cleanup.callback(checkpointer.close)  # waits for saves still in flight
        run = _Run(config, quantized_policy, mesh, target.path, checkpointer, reporter, main, data)
        if claim is not None:  # this is the main process
            claim.set_up_done()
        return run.loop()


class _Run:
    """The pieces of one training run; `loop()` drives them."""

    def __init__(
        self,
        config: Config,
        quantized_policy: Policy,
        mesh,
        run_dir,
        checkpointer,
        reporter: Reporter,
        main: bool,
        data: fp4lm.data.Data,
    ):
        self.config, self.mesh, self.run_dir, self.checkpointer, self.reporter, self.main = (
            config,
            mesh,
            run_dir,
            checkpointer,
            reporter,
            main,
        )
        self.batch_sharding = batch_sharding(self.mesh)
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.data = data
        self.vocab_size = data.vocab_size  # the tokenizer's, padded (fp4lm.tokenizer.model_vocab_size)
        self.quantized_policy = quantized_policy
        self.setup = setup = build_run(config, mesh, quantized_policy, self.vocab_size)
        self.paths = setup.paths
        self.tokens_per_step = config.train.batch_size * config.data.seq_len
        self.flops_per_step = training_flops_per_step(
            config.model, self.vocab_size, config.data.seq_len, config.train.batch_size
        ).total
        self.peak_tflops = config.metrics.peak_tflops  # None: the device's own, if it is a known GPU
        if self.peak_tflops is None:
            self.peak_tflops = peak_bf16_tflops(jax.devices()[0].device_kind)
        restored = None
        if checkpointer is not None:
            restored = checkpointer.restore_latest(setup.restore_target())
        self.recipe_change: tuple[str, str] | None = None  # (checkpoint's recipe, this run's) when they differ
        if restored is not None:
            self.state, self.start_step = restored.state, restored.step
            self.data.train_iterator.set_state(restored.data_iter)
            trained_with = restored.config.get("precision", {}).get("recipe", config.precision.recipe)
            if trained_with != config.precision.recipe:  # allowed by train.allow_recipe_change (checked before)
                self.recipe_change = (trained_with, config.precision.recipe)
        else:
            self.state, self.start_step = setup.fresh_state(), 0
        self._writer: MetricsWriter | None = None  # opened by loop()
        self.profile = ProfileWindow(config.profile, run_dir)  # profile.start_step, profile.steps
        self._functions: RunFunctions | None = None  # built by _use_policy(), which loop() calls first
        self.eval_sets: dict[str, list] = {}  # validation set name ("" when there is one) -> its global batches
        if config.eval.batches:
            self.eval_sets = {
                name: [self._to_global(b) for b in batches]
                for name, batches in self.data.eval_sets(config.eval.batches).items()
            }
        self.eval_batches = [b for batches in self.eval_sets.values() for b in batches]

    # ---------------------------------------------------------------- helpers
    @property
    def writer(self) -> MetricsWriter:
        assert self._writer is not None, "the metrics writer is opened by loop()"
        return self._writer

    @property
    def functions(self) -> RunFunctions:
        assert self._functions is not None, "the step functions are built by _use_policy()"
        return self._functions

    def _to_global(self, local_batch: dict) -> dict:
        return global_batch(local_batch, self.batch_sharding, self.config.train.batch_size)

    def _replicated(self, value) -> jax.Array:
        value = np.asarray(value)
        return jax.make_array_from_process_local_data(self.replicated, value, value.shape)

    def _use_policy(self, policy: Policy) -> None:
        self.policy = policy
        self._functions = RunFunctions.build(self.setup, policy, self.config, self.mesh)

    def _banner(self) -> None:
        c, m = self.config, self.config.model
        resumed = f"resuming from step {self.start_step}" if self.start_step else "new run"
        devices = jax.devices()
        self.reporter.message(f"fp4lm train: {self.run_dir} ({resumed}), {c.train.steps} steps")
        self.reporter.message(
            f"model: {m.num_layers} layers, d_model {m.d_model}, {m.num_heads} heads ({m.num_kv_heads} kv), "
            f"mlp {m.mlp_dim}, vocab {self.vocab_size}: {model_setup.count_params(self.state.params):,} parameters"
        )
        mesh = ", ".join(f"{name}={size}" for name, size in self.mesh.shape.items())
        self.reporter.message(
            f"mesh: {mesh} ({len(devices)} {devices[0].platform} devices, {jax.process_count()} processes); "
            f"global batch {c.train.batch_size} x {c.data.seq_len} tokens"
        )
        self.reporter.message(self.data.describe())
        scaling = f"on (initial scale {self.setup.scaler.initial_scale:g})" if self.setup.scaler.enabled else "off"
        switch = model_setup.bf16_switch_step(c)
        later = f"; all layers switch to bf16 after step {switch}" if switch is not None else ""
        self.reporter.message(f"precision: {self.policy.summary(self.paths)}; loss scaling {scaling}{later}")
        self.reporter.message(self.policy.table(self.paths))
        warmup = effective_warmup_steps(c.optimizer, c.train.steps)
        if warmup < c.optimizer.warmup_steps:
            self.reporter.message(
                f"note: optimizer.warmup_steps={c.optimizer.warmup_steps} does not fit in train.steps={c.train.steps}; "
                f"the warm-up is shortened to {warmup} steps (lower optimizer.warmup_steps to choose it yourself)"
            )

    # ---------------------------------------------------------------- the loop
    def loop(self) -> dict:
        """Runs the remaining steps and returns the summary (closing the metrics writer either way)."""
        summary_path = self.run_dir / SUMMARY_FILE
        if self.start_step >= self.config.train.steps and summary_path.is_file():
            if self.main and _has_records_after(self.run_dir, self.start_step):  # of a longer run, killed
                drop_records_after(self.run_dir, self.start_step)  # the summary is this step's again
            self.reporter.message(
                f"fp4lm train: {self.run_dir} already finished at step {self.start_step} "
                f"(train.steps={self.config.train.steps}); raise train.steps to train further"
            )
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
            self._report_summary(summary)
            return summary
        if self.main:
            # Steps after the checkpoint are logged again, and so is a recipe switch at it (if still made).
            drop_records_after(self.run_dir, self.start_step, also_drop=_is_recipe_switch)
            write_json_atomically(self.run_dir / RUN_CONFIG_FILE, self.config.to_dict())
        self._writer = MetricsWriter(self.run_dir, tensorboard=self.config.metrics.tensorboard, enabled=self.main)
        try:
            if self.recipe_change is not None:
                before, now = self.recipe_change
                self.writer.write(
                    {
                        "step": self.start_step,
                        "event": "precision_switch",
                        "setting": RECIPE_SETTING,
                        "from": before,
                        "to": now,
                    }
                )
                self.reporter.message(
                    f"step {self.start_step}: precision.recipe switched from {before} to {now} "
                    "(train.allow_recipe_change=true)"
                )
            self._use_policy(model_setup.policy_at(self.start_step, self.config, self.quantized_policy))
            self._banner()
            if self.data.mixture is not None:  # the mixing plan; the realised counts go into the summary
                self.writer.write({"step": self.start_step, "event": "mixture", "planned": self.data.mixture.planned()})
            last, tokens_per_sec = self._steps()
            if self.start_step >= self.config.train.steps:  # resumed at the end: killed before the summary
                last.update(_last_records(self.run_dir, self.start_step))
                if last["val_loss"] is None and self.eval_batches:
                    last["val_loss"] = self._evaluate(self.start_step)
            return self._finish(last, tokens_per_sec)
        finally:
            self.writer.close()

    def _steps(self) -> tuple[dict, float | None]:
        c = self.config
        total = c.train.steps
        switch = model_setup.bf16_switch_step(c)
        step = self.start_step
        last = {"loss": None, "val_loss": None, "skipped_steps": 0}
        watch = None  # (step, metrics, batch) of the previous step, checked for runs of skipped steps
        meter = StepMeter(self.tokens_per_step, block=jax.block_until_ready)
        compiles = "the training step"  # what the next step compiles (jit compiles at the first call), if anything
        saved_at = None
        data_wait_s, window_start = 0.0, step  # seconds spent fetching batches since the last train record
        self.reporter.start(first_step=step, total=total)
        try:
            with sigterm_requests_stop(enabled=jax.process_count() == 1) as stop:
                while step < total:
                    if step == switch:
                        policy = model_setup.policy_at(step, c, self.quantized_policy)
                        if policy != self.policy:
                            self._use_policy(policy)
                            self.writer.write({"step": step, "event": "precision_switch", "to": "bf16"})
                            self.reporter.message(f"step {step}: precision switch, all linear layers now bf16")
                            meter.compiles_next()
                            compiles = "the bf16 training step"
                    fetch_start = time.perf_counter()  # time spent waiting on the input pipeline
                    batch = self._to_global(next(self.data.train_iterator))
                    data_wait_s += time.perf_counter() - fetch_start
                    if compiles:
                        self.reporter.compiling(step, compiles)
                    self.profile.before_step(step + 1, meter, self.state)
                    self.state, metrics = self.functions.train_step(self.state, batch)
                    step += 1
                    self.profile.after_step(step, meter, metrics)
                    if compiles:
                        jax.block_until_ready(metrics)
                        self.reporter.compiled(step)
                        compiles = None
                    meter.step_taken()
                    if watch is not None:
                        self._check_skips(*watch)
                    watch = (step, metrics, batch)
                    self.reporter.advance(step)

                    if step == 1 or step % c.metrics.log_every == 0 or step == total:
                        window_steps = step - window_start
                        record = self._log_step(step, metrics, meter.window_done(metrics), data_wait_s / window_steps)
                        data_wait_s, window_start = 0.0, step
                        last.update(loss=record["loss"], skipped_steps=record["skipped_steps"])
                    # Evaluation, telemetry and saving are not training time: excluded from step_time_s.
                    if step % c.metrics.quant_stats_every == 0:
                        with meter.excluded(metrics):
                            self._log_quant_stats(step, batch)
                    if self.eval_batches and (step % c.eval.every == 0 or step == total):
                        with meter.excluded(metrics):
                            last["val_loss"] = self._evaluate(step)
                    if self.checkpointer is not None and (step % c.checkpoint.every == 0 or step == total):
                        with meter.excluded(metrics):
                            self._save(step)
                        saved_at = step
                    if stop.requested and step < total:
                        self._stop_after(step, saved=saved_at == step)
            if watch is not None:
                self._check_skips(*watch)
        finally:
            self.profile.close()
            self.reporter.finish()
        return last, meter.steady_tokens_per_sec

    def _stop_after(self, step: int, *, saved: bool) -> None:
        """SIGTERM arrived: save step `step` (unless just saved) and stop with one line (exit code 143)."""
        if self.checkpointer is None:
            raise Terminated(
                f"terminated by SIGTERM after step {step} of {self.config.train.steps}; no checkpoint was saved: "
                "checkpoints are off (checkpoint.enabled=false), so start it again with `fp4lm train --force`, "
                "which moves these results aside"
            )
        if not saved:
            self._save(step)
        raise Terminated(
            f"terminated by SIGTERM after step {step} of {self.config.train.steps}; saved a checkpoint at step "
            f"{step}, the run resumes from it when started again"
        )

    def _log_step(self, step: int, metrics: dict, step_time_s: float, data_wait_s: float) -> dict:
        fetched = jax.device_get(metrics)
        record = {
            "step": step,
            **{k: fetched[k] for k in ("loss", "lr", "grad_norm", "loss_scale")},
            "skipped_steps": int(fetched["skipped_steps"]),
            "data_wait_s": data_wait_s,
        }
        record.update(
            throughput(
                step_time_s=step_time_s,
                tokens_per_step=self.tokens_per_step,
                flops_per_step=self.flops_per_step,
                num_devices=jax.device_count(),
                peak_tflops=self.peak_tflops,
            )
        )
        record = json_value(record)
        self.writer.write(record)
        self.reporter.logged(step, record)
        return record

    def _check_skips(self, step: int, metrics: dict, batch: dict) -> None:
        limit = self.config.loss_scale.max_consecutive_skips
        in_a_row = int(metrics["consecutive_skips"])
        if in_a_row < limit:
            return
        to_device = lambda n: self._replicated(np.int32(n))  # noqa: E731
        layer = first_nonfinite_layer(self.functions, self.state, batch, step, self.paths, to_device)
        first = step - in_a_row + 1
        raise TrainingDiverged(
            f"training diverged: {in_a_row} consecutive steps with non-finite gradients (steps {first}-{step}, "
            f"loss_scale.max_consecutive_skips={limit}); {layer}; lower optimizer.lr, raise "
            "optimizer.warmup_steps or keep more layers in bf16 (precision.bf16_last_layers)"
        )

    def _log_quant_stats(self, step: int, batch: dict) -> None:
        if not any(self.policy.recipe_for(p).is_quantized for p in self.paths):
            return
        step_number = self._replicated(np.int32(step))
        stats = jax.device_get(self.functions.stats_step(self.state.params, batch, self.state.rng, step_number))
        self.writer.write({"step": step, "quant_stats": stats})

    def _evaluate(self, step: int) -> float | None:
        """val_loss; with several sources also val_loss/<name> per source (val_loss: their weighted mean)."""
        per_set = {
            name: float(np.mean(jax.device_get([self.functions.eval_step(self.state.params, b) for b in batches])))
            for name, batches in self.eval_sets.items()
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

    def _save(self, step: int) -> None:
        self.checkpointer.save(
            step,
            self.state,
            data_iter=self.data.train_iterator.get_state(),
            config=self.config.to_dict(),
            tokenizer_json=self.data.tokenizer.to_json(),
        )

    def _sample(self) -> str | None:
        e = self.config.eval
        if e.sample_tokens == 0:
            return None
        prompt = self.data.tokenizer.encode(e.sample_prompt)
        if len(prompt) == 0:
            return None
        new = generate(
            self.functions.apply,
            self.state.params,
            prompt,
            max_tokens=e.sample_tokens,
            seq_len=self.config.data.seq_len,
            temperature=e.sample_temperature,
            top_k=e.sample_top_k,
            top_p=e.sample_top_p,
            vocab_limit=self.data.tokenizer.vocab_size,
            seed=self.config.train.seed,
            to_device=self._replicated,
        )
        return e.sample_prompt + self.data.tokenizer.decode(new)

    def _finish(self, last: dict, tokens_per_sec: float | None) -> dict:
        c = self.config
        sample = self._sample()
        summary = {
            "steps": c.train.steps,
            "final_train_loss": last["loss"],
            "final_val_loss": last["val_loss"],
            "tokens_per_sec": tokens_per_sec,
            "skipped_steps": last["skipped_steps"],
            "param_count": model_setup.count_params(self.state.params),
            **_recipe_summary(self.run_dir, c.precision.recipe),
            "precision": self.quantized_policy.summary(self.paths),
            "final_precision": self.policy.summary(self.paths),
            "sample": sample,
            **self.profile.summary(),
        }
        if self.data.mixture is not None:  # sequences each source gave over the whole run
            trained = self.data.mixture.realised(c.train.steps * c.train.batch_size)
            summary["mixture"] = {
                "planned": self.data.mixture.planned(),
                "realised": {name: n / max(1, sum(trained.values())) for name, n in trained.items()},
                "sequences": trained,
            }
            shares = ", ".join(f"{name} {share:.1%}" for name, share in summary["mixture"]["realised"].items())
            self.reporter.message(f"mixture: the {sum(trained.values()):,} sequences trained came {shares}")
        if self.main:
            write_json_atomically(self.run_dir / SUMMARY_FILE, summary)
        self._report_summary(summary)
        return summary

    def _report_summary(self, summary: dict) -> None:
        fmt = lambda v, spec: "n/a" if v is None else format(v, spec)  # noqa: E731
        self.reporter.message(
            f"done: final train loss {fmt(summary['final_train_loss'], '.4f')}, val loss "
            f"{fmt(summary['final_val_loss'], '.4f')}, {fmt(summary['tokens_per_sec'], ',.0f')} tokens/s, "
            f"{summary['skipped_steps']} skipped steps"
        )
        self.reporter.message(f"precision: {self.quantized_policy.summary(self.paths)}")  # the table: in the banner
        if summary.get("final_precision") and summary["final_precision"] != summary.get("precision"):
            self.reporter.message(f"after the late switch: {summary['final_precision']}")
        if summary.get("sample"):
            self.reporter.message(f"sample:\n{summary['sample']}")
