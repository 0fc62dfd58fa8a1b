"""Run metrics: one JSON object per line in RUN_DIR/metrics.jsonl, the same scalars as TensorBoard events.

Record kinds (all carry "step", the number of training steps taken):
- train: loss, lr, grad_norm, loss_scale, skipped_steps, data_wait_s, step_time_s, tokens_per_sec, tflops_per_sec,
  mfu; a mixture-of-experts model adds "routing": {MoE block path ("blocks.1.mlp"): {metric: value}} with
  the step's max_over_mean_tokens (the busiest expert's tokens over the mean; 1 = balanced),
  dropped_fraction (of the (token, expert) pairs, by model.capacity_factor), load_balance, z_loss, aux_loss
  (the two weighted, added to the training loss) and entropy (of the router's distribution, in nats; the
  mean over tokens), fp4lm.model.moe.routing_metrics
- eval:  val_loss; with several data sources (data.sources) also val_loss/<source> for each, val_loss being
  their mean weighted by the sources' weights
- quantization telemetry: {"step", "quant_stats": {layer path: {operand: {metric: value}}}}
- events: {"step", "event": "...", ...} (e.g. the late switch to bf16; "mixture" with the sources' "planned"
  shares of the training sequences)

Throughput (fp4lm/train/throughput.py): `step_time_s` is the mean time of the steps since the previous
train record, each waited for; `tflops_per_sec` is model FLOP/s per device (MaxText's analytic count of the
whole step, fp4lm.flops, divided by the device count and the step time) and `mfu` is that over the device's
peak (`metrics.peak_tflops`, else a table of known GPUs; null when neither knows it, e.g. on a CPU).
`data_wait_s` is the mean time per step the loop spent getting its batch from the input pipeline (and onto
the devices) since the previous train record; near zero when the pipeline keeps up with the step.
Non-finite numbers are written as null (JSON has no NaN).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

from fp4lm.extras import require
from fp4lm.jsonio import json_value, read_jsonl, write_text_atomically

METRICS_FILE = "metrics.jsonl"


class MetricsWriter:
    """Appends records to metrics.jsonl (flushed per record) and mirrors scalars to TensorBoard.

    Only the writing process (process 0) should create one with `enabled=True`; the others get a writer
    that drops everything, so callers need no branches.
    """

    def __init__(self, run_dir: str | pathlib.Path, *, tensorboard: bool, enabled: bool = True):
        self.enabled = enabled
        self.path = pathlib.Path(run_dir) / METRICS_FILE
        self._file = None
        self._tensorboard = None
        if not enabled:
            return
        tensorboardx = None  # imported before metrics.jsonl is opened, so a missing extra leaves nothing behind
        if tensorboard:
            purpose = "TensorBoard logging (metrics.tensorboard=true; false turns it off)"
            tensorboardx = require("tensorboardX", "tensorboard", purpose=purpose)
        self._file = self.path.open("a", encoding="utf-8")
        if tensorboardx is not None:
            self._tensorboard = tensorboardx.SummaryWriter(logdir=str(run_dir), flush_secs=30)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        assert self._file is not None, "write() after close()"
        record = json_value(record)
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        if self._tensorboard is not None:
            self._to_tensorboard(record)

    def _to_tensorboard(self, record: dict[str, Any]) -> None:
        board = self._tensorboard
        assert board is not None  # write() calls this only when TensorBoard logging is on
        step = record["step"]
        for name, value in record.items():
            if name == "step":
                continue
            if name == "quant_stats":
                for layer, operands in value.items():
                    for operand, stats in operands.items():
                        for metric, number in stats.items():
                            if number is not None:
                                board.add_scalar(f"quant/{layer}/{operand}/{metric}", number, step)
            elif name == "routing":
                for block, metrics in value.items():
                    for metric, number in metrics.items():
                        if number is not None:
                            board.add_scalar(f"moe/{block}/{metric}", number, step)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                group = "eval" if name.startswith("val_") else "train"
                board.add_scalar(f"{group}/{name}", value, step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None


def drop_records_after(
    run_dir: str | pathlib.Path, step: int, *, also_drop: Callable[[dict], bool] | None = None
) -> None:
    """Keeps only metrics of steps <= `step` (a resumed run re-logs what followed its checkpoint), less the
    records `also_drop(record)` is true for (e.g. an event at `step` that the resumed run logs again).

    Rewritten atomically (temporary file, then rename); a torn last line is dropped too. Kept records are
    written back as `MetricsWriter.write` wrote them (json.dumps of the parsed record gives the same line).
    """
    path = pathlib.Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return
    kept = [r for r in read_jsonl(path) if isinstance(r.get("step"), int) and r["step"] <= step]
    if also_drop is not None:
        kept = [r for r in kept if not also_drop(r)]
    write_text_atomically(path, "".join(json.dumps(r, allow_nan=False) + "\n" for r in kept))
