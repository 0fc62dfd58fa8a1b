"""The training loop: `train(config)` sets a run up (or resumes it), then `_Run.loop` steps it to the end.

As in nanodo's train.py, the loop dispatches step N and then reads step N-1's skip counter, so one step stays
queued and the device never idles; on a log step it waits for the step itself, so the step time covers the
computation. The precision switch, the compile notice, metrics, evaluation and checkpoints are hooks beside it
(fp4lm/train/hooks.py); the profile window is fp4lm/train/profile.py, SIGTERM fp4lm/train/stop_signal.py.
"""

from __future__ import annotations

import contextlib
import json

import jax

import fp4lm.data
from fp4lm.config import Config, check_micro_batches_per_host
from fp4lm.errors import Terminated
from fp4lm.jsonio import write_json_atomically
from fp4lm.quant import Policy
from fp4lm.sharding import all_devices, make_mesh
from fp4lm.train import hooks, model_setup
from fp4lm.train.banner import banner_lines
from fp4lm.train.bf16_switch import Bf16Switch, run_switch
from fp4lm.train.checkpoint import Checkpointer
from fp4lm.train.hosts import initialize_distributed, is_main_process, use_compilation_cache
from fp4lm.train.memory import check_training_fits
from fp4lm.train.metrics import MetricsWriter, drop_records_after
from fp4lm.train.profile import ProfileWindow
from fp4lm.train.progress import Reporter
from fp4lm.train.run_dir import RUN_CONFIG_FILE, SUMMARY_FILE, RunDirClaim, check_run_dir_accepts
from fp4lm.train.run_functions import RunFunctions
from fp4lm.train.setup import build_run
from fp4lm.train.state import TrainState
from fp4lm.train.stop_signal import sigterm_requests_stop
from fp4lm.train.summary import (
    RECIPE_SETTING,
    has_records_after,
    is_precision_switch,
    last_records,
    mixture_summary,
    recipe_summary,
    sample_text,
    summary_lines,
)
from fp4lm.train.throughput import StepMeter
from fp4lm.train.validate import (
    check_config_for_training,
    fp4_gathered_on_mesh,
    fp4_param_gather_note,
    prepare_run_dir,
)


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
    gathered_in_fp4 = fp4_gathered_on_mesh(config, quantized_policy, mesh)
    main = is_main_process()
    reporter = reporter or Reporter(config.metrics.progress, enabled=main)
    note = fp4_param_gather_note(config, quantized_policy, mesh, gathered_in_fp4)
    if note is not None:
        reporter.message(note)
    # Everything is checked before anything is written (fp4lm/train/run_dir.py): the run directory, the
    # settings a resumed run must keep, then the data, read without writing.
    target = check_run_dir_accepts(config)  # a refused directory is named before the data is built
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
        # Restoring the checkpoint refuses data that changed since it was saved, before the run directory's
        # tokenizer and data caches are touched.
        run = _Run(config, quantized_policy, mesh, target.path, checkpointer, reporter, main, data)
        if claim is not None:  # this is the main process
            data.save(target.path)
            claim.set_up_done()
        return run.loop()


class _Run:
    """One run: its pieces, the state after the last dispatched step and the step functions of the current
    precision policy (what the hooks see); `loop()` steps it to train.steps and returns the summary."""

    state: TrainState
    functions: RunFunctions  # built by loop() for the policy at the first step; the precision switch replaces them
    switch: Bf16Switch  # where this run switches to bf16 (fp4lm.train.bf16_switch)

    def __init__(
        self,
        config: Config,
        quantized_policy: Policy,
        mesh,
        run_dir,
        checkpointer: Checkpointer | None,
        reporter: Reporter,
        main: bool,
        data: fp4lm.data.Data,
    ):
        self.config, self.quantized_policy, self.data = config, quantized_policy, data
        self.run_dir, self.checkpointer, self.reporter, self.main = run_dir, checkpointer, reporter, main
        self.setup = build_run(config, mesh, quantized_policy, data.vocab_size)
        restored = checkpointer.restore_latest(self.setup.restore_target()) if checkpointer is not None else None
        self.recipe_change: tuple[str, str] | None = None  # (checkpoint's recipe, this run's) when they differ
        if restored is not None:
            self.state, self.start_step = restored.state, restored.step
            data.train_iterator.set_state(restored.data_iter)
            trained_with = restored.config.get("precision", {}).get("recipe", config.precision.recipe)
            if trained_with != config.precision.recipe:  # allowed by train.allow_recipe_change (checked before)
                self.recipe_change = (trained_with, config.precision.recipe)
            made = model_setup.bf16_switch_made(restored.step, restored.config, restored.precision)
            self.switch = run_switch(config, restored.step, made, restored.config)
        else:
            self.state, self.start_step = self.setup.fresh_state(), 0
            self.switch = run_switch(config, 0, None, None)
        self.profile = ProfileWindow(config.profile, run_dir)  # profile.start_step, profile.steps
        self.eval_sets = hooks.eval_sets(data, self.setup)  # on the devices once, before set-up is done

    def loop(self) -> dict:
        """Runs the remaining steps and returns the summary (closing the metrics writer either way)."""
        summary_path = self.run_dir / SUMMARY_FILE
        if self.start_step >= self.config.train.steps and summary_path.is_file():
            if self.main and has_records_after(self.run_dir, self.start_step):  # of a longer run, killed
                drop_records_after(self.run_dir, self.start_step)  # the summary is this step's again
            self.reporter.message(
                f"fp4lm train: {self.run_dir} already finished at step {self.start_step} "
                f"(train.steps={self.config.train.steps}); raise train.steps to train further"
            )
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
            self._report_summary(summary)
            return summary
        if self.main:
            # Steps after the checkpoint are logged again, and so is a switch at it (if still made there).
            at_start = lambda record: record["step"] == self.start_step and is_precision_switch(record)  # noqa: E731
            drop_records_after(self.run_dir, self.start_step, also_drop=at_start)
            write_json_atomically(self.run_dir / RUN_CONFIG_FILE, self.config.to_dict())
        writer = MetricsWriter(self.run_dir, tensorboard=self.config.metrics.tensorboard, enabled=self.main)
        try:
            if self.recipe_change is not None:
                before, now = self.recipe_change
                switch = {"step": self.start_step, "event": "precision_switch", "setting": RECIPE_SETTING}
                writer.write({**switch, "from": before, "to": now})
                self.reporter.message(
                    f"step {self.start_step}: precision.recipe switched from {before} to {now} "
                    "(train.allow_recipe_change=true)"
                )
            policy = model_setup.policy_at(self.start_step, self.config, self.quantized_policy, switch=self.switch.step)
            self.functions = RunFunctions.build(self.setup, policy)
            banner = banner_lines(
                self.setup, self.run_dir, self.start_step, self.state.params, policy, self.data, self.switch
            )
            for line in banner:
                self.reporter.message(line)
            if self.data.mixture is not None:  # the mixing plan; the realised counts go into the summary
                writer.write({"step": self.start_step, "event": "mixture", "planned": self.data.mixture.planned()})
            return self._finish(self._steps(writer))
        finally:
            writer.close()

    def _steps(self, writer: MetricsWriter) -> dict:
        """Steps to train.steps; returns the summary's figures: the last loss, val_loss and skipped_steps, and
        the steady tokens/s."""
        c, setup, reporter = self.config, self.setup, self.reporter
        step, total = self.start_step, c.train.steps
        meter = StepMeter(c.train.batch_size * c.data.seq_len, block=jax.block_until_ready)
        compiling = hooks.CompileNotice(reporter, meter)
        precision = hooks.PrecisionSwitch(setup, self.switch.step, writer, reporter, compiling)
        feed = hooks.BatchFeed(self.data.train_iterator, setup)
        skips = hooks.SkipWatch(setup)
        records = hooks.TrainRecords(c, self.data.vocab_size, step, meter, feed, writer, reporter)
        evaluation = hooks.Evaluation(self.eval_sets, self.data, c, meter, writer, reporter)
        checkpoints = hooks.Checkpoints(self.checkpointer, self.data, c, meter)
        after_step: list[hooks.Hook] = [records, hooks.QuantStats(setup, meter, writer), evaluation, checkpoints]
        previous = None  # step N-1's (step, metrics, batch)
        reporter.start(first_step=step, total=total)
        try:
            with sigterm_requests_stop(enabled=jax.process_count() == 1) as stop:
                while step < total:
                    precision.before_step(step, self)
                    batch = feed.next()
                    compiling.before_step(step)
                    self.profile.before_step(step + 1, meter, self.state)
                    self.state, metrics = self.functions.train_step(self.state, batch)
                    step += 1
                    self.profile.after_step(step, meter, metrics)
                    compiling.after_step(step, metrics)
                    meter.step_taken()
                    if previous is not None:
                        skips.check(self, *previous)
                    previous = (step, metrics, batch)
                    for hook in after_step:
                        hook.after_step(step, self, metrics, batch)
                    if stop.requested and step < total:
                        self._stop_after(step, saved=checkpoints.saved_at == step)
            if previous is not None:
                skips.check(self, *previous)
        finally:
            self.profile.close()
            reporter.finish()
        last = {"loss": records.loss, "val_loss": evaluation.val_loss, "skipped_steps": records.skipped_steps}
        if self.start_step >= total:  # resumed at the end: killed before the summary
            last.update(last_records(self.run_dir, self.start_step))
            if last["val_loss"] is None and evaluation.enabled:
                last["val_loss"] = evaluation.evaluate(self.start_step, self)
        return {**last, "tokens_per_sec": meter.steady_tokens_per_sec}

    def _stop_after(self, step: int, *, saved: bool) -> None:
        """SIGTERM arrived: save step `step` (unless just saved) and stop with one line (exit code 143)."""
        if self.checkpointer is None:
            raise Terminated(
                f"terminated by SIGTERM after step {step} of {self.config.train.steps}; no checkpoint was saved: "
                "checkpoints are off (checkpoint.enabled=false), so start it again with `fp4lm train --force`, "
                "which moves these results aside"
            )
        if not saved:
            hooks.save_checkpoint(self.checkpointer, step, self.state, self.data, self.config, self.switch)
        raise Terminated(
            f"terminated by SIGTERM after step {step} of {self.config.train.steps}; saved a checkpoint at step "
            f"{step}, the run resumes from it when started again"
        )

    def _finish(self, figures: dict) -> dict:
        c, paths = self.config, self.setup.paths
        graphdef = model_setup.graphdef_with_policy(self.setup.model, self.functions.policy)
        sample = sample_text(c, self.data, graphdef, self.state.model_variables(), self.setup.mesh)
        summary = {
            "steps": c.train.steps,
            "final_train_loss": figures["loss"],
            "final_val_loss": figures["val_loss"],
            "tokens_per_sec": figures["tokens_per_sec"],
            "skipped_steps": figures["skipped_steps"],
            "param_count": model_setup.count_params(self.state.params),
            **recipe_summary(self.run_dir, c.precision.recipe),
            "precision": self.quantized_policy.summary(paths),
            "final_precision": self.functions.policy.summary(paths),
            "bf16_after_step": self.switch.made_by(c.train.steps),  # the late switch: bf16 after this step
            "sample": sample,
            **self.profile.summary(),
        }
        if self.data.mixture is not None:  # sequences each source gave over the whole run
            summary["mixture"] = mixture = mixture_summary(self.data.mixture, c.train.steps * c.train.batch_size)
            shares = ", ".join(f"{name} {share:.1%}" for name, share in mixture["realised"].items())
            self.reporter.message(
                f"mixture: the {sum(mixture['sequences'].values()):,} sequences trained came {shares}"
            )
        if self.main:
            write_json_atomically(self.run_dir / SUMMARY_FILE, summary)
        self._report_summary(summary)
        return summary

    def _report_summary(self, summary: dict) -> None:
        for line in summary_lines(summary, self.quantized_policy.summary(self.setup.paths)):
            self.reporter.message(line)
