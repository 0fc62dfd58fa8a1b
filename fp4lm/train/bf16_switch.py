"""Where a run's quantized layers switch to bf16 (`precision.bf16_after`, the paper's late switch), across resumes.

precision.bf16_after is a fraction of train.steps, so a raised train.steps names a later step. A switch once made
stays made: the run's checkpoints record its step (`Checkpointer.save`'s "precision" item), and a run resumed
after it trains on in bf16, saying so in one line when the setting now names another step. A run resumed before
its switch switches where the setting now puts it (saying where it moved from), or at once when that step has
passed. Either way metrics.jsonl holds one precision_switch event, at the step where bf16 began.
"""

from __future__ import annotations

import dataclasses

from fp4lm.config import Config
from fp4lm.train.model_setup import bf16_switch_step, planned_bf16_switch


@dataclasses.dataclass(frozen=True)
class Bf16Switch:
    """A run's switch: its quantized layers run in bf16 from the step after `step` steps (None: never)."""

    step: int | None
    note: str | None = None  # the banner's line where the switch is not where precision.bf16_after alone puts it

    def made_by(self, step: int) -> int | None:
        """The switch as a checkpoint of `step` steps records it: made once a bf16 step has run (None: not yet)."""
        return self.step if self.step is not None and step > self.step else None

    def record(self, step: int) -> dict:
        """The checkpoint's "precision" item at `step` (fp4lm.train.model_setup.bf16_switch_made reads it)."""
        return {"bf16_after_step": self.made_by(step)}


def run_switch(config: Config, start_step: int, made: int | None, saved_config: dict | None) -> Bf16Switch:
    """The switch of a run of `config` starting at `start_step`: `made` is the switch its checkpoint made (None:
    not yet), `saved_config` that checkpoint's config (None: a new run)."""
    planned = bf16_switch_step(config)
    setting = f"precision.bf16_after={config.precision.bf16_after} of train.steps={config.train.steps}"
    if made is not None:
        if planned == made:
            return Bf16Switch(made)
        now = f"{setting} names step {planned}" if planned is not None else "precision.bf16_after is now unset"
        return Bf16Switch(
            made,
            f"note: this run switched to bf16 after step {made} and stays in bf16 ({now}; a switch once made is kept)",
        )
    if planned is None:
        return Bf16Switch(None)
    if planned < start_step:
        return Bf16Switch(
            start_step,
            f"note: {setting} names step {planned}, which this run has passed: it switches to bf16 now, "
            f"after step {start_step}",
        )
    if saved_config is None:
        return Bf16Switch(planned)
    before = planned_bf16_switch(saved_config.get("precision", {}).get("bf16_after"), saved_config["train"]["steps"])
    if before == planned:
        return Bf16Switch(planned)
    moved = f"is after step {planned}" if before is None else f"moves from after step {before} to after step {planned}"
    return Bf16Switch(planned, f"note: the switch to bf16 {moved} ({setting})")
