"""Synthetic trainer outputs (metrics.jsonl, summary.json) for testing the report without training."""

from __future__ import annotations

import json
import math
import pathlib

from fp4lm.config import load_config

LAYERS = ("blocks.0.attn.q", "blocks.0.mlp.down", "blocks.1.attn.q", "blocks.1.mlp.down")
EXPERT_LAYERS = ("blocks.1.mlp.experts.down.10", "blocks.1.mlp.experts.down.2", "blocks.1.mlp.experts.down.0")
OPERANDS = ("fprop_x", "fprop_w", "wgrad_g")
SMALL_MODEL = [
    "model.num_layers=2",
    "model.d_model=64",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.mlp_dim=128",
    "data.tokenizer=byte",
    "data.vocab_size=256",
    "data.seq_len=32",
    "train.batch_size=4",
    "train.steps=40",
]


def config_dict(recipe: str, run_dir: pathlib.Path, extra: tuple[str, ...] = ()) -> dict:
    overrides = [*SMALL_MODEL, *extra, f"precision.recipe={recipe}", f"train.run_dir={run_dir}"]
    return load_config(None, overrides).to_dict()


def loss_at(step: int, offset: float) -> float:
    return 2.0 + 3.5 * math.exp(-step / 12.0) + offset


def write_run(
    run_dir: pathlib.Path,
    *,
    offset: float,
    steps: int = 40,
    quantized: bool = True,
    finished: bool = True,
    tokens_per_sec: float = 1000.0,
    resumed_at: int | None = None,
    switch_at: int | None = None,
    moe: bool = False,
) -> None:
    """Train records every 5 steps, eval every 10, telemetry every 10 (layer 1 down missing at step 10).

    `resumed_at`: the steps from there to the end are logged twice, the second time with a +1 loss shift
    removed (the first copy carries +1, as if logged before an interruption), like a resumed run.
    `switch_at`: the step of a late precision switch to bf16 (an event line).
    `moe`: a mixture-of-experts run: train records carry "routing" for blocks 0 and 1 (block 1's load evens
    out over training, nothing is dropped), and telemetry has `blocks.1.mlp.experts.down.{0,1,2}`.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(5, steps + 1, 5):
        if resumed_at is not None and step >= resumed_at:
            lines.append({"step": step, "loss": loss_at(step, offset) + 1.0, "tokens_per_sec": 1.0})
    for step in range(5, steps + 1, 5):
        lines.append(
            {
                "step": step,
                "loss": loss_at(step, offset),
                "lr": 1e-3,
                "grad_norm": 0.5,
                "loss_scale": 1.0,
                "skipped_steps": 1 if step >= 20 and quantized else 0,
                "step_time_s": 0.1,
                "tokens_per_sec": 10.0 if step == 5 else tokens_per_sec,
                "tflops_per_sec": 0.01,
                "mfu": 0.001,
            }
        )
        if moe:
            lines[-1]["routing"] = {
                f"blocks.{block}.mlp": {
                    "max_over_mean_tokens": 1.0 + block * 10.0 / step,
                    "dropped_fraction": 0.0,
                    "load_balance": 1.0 + 0.01 * block,
                    "z_loss": 2.0,
                    "aux_loss": 0.01,
                    "entropy": 2.0 - step / 100 - 0.1 * block,
                }
                for block in (0, 1)
            }
        if step % 10 == 0:
            lines.append({"step": step, "val_loss": loss_at(step, offset) + 0.1})
            if quantized:
                stats = {
                    layer: {
                        op: {"rel_err": 0.1 + 0.01 * i, "saturated_frac": 0.0, "underflow_frac": 0.001 * i, "amax": 3.0}
                        for i, op in enumerate(OPERANDS)
                    }
                    for layer in LAYERS + (EXPERT_LAYERS if moe else ())
                    if not (step == 10 and layer == "blocks.1.mlp.down")
                }
                lines.append({"step": step, "quant_stats": stats})
    if switch_at is not None:
        lines.append({"step": switch_at, "event": "precision_switch", "to": "bf16"})
    text = "".join(json.dumps(line) + "\n" for line in lines)
    (run_dir / "metrics.jsonl").write_text(text + '{"step": 99, "loss"')  # torn last line
    if finished:
        summary = {
            "final_train_loss": loss_at(steps, offset),
            "final_val_loss": loss_at(steps, offset) + 0.1,
            "tokens_per_sec": tokens_per_sec,
            "skipped_steps": 1 if quantized else 0,
            "steps": steps,
        }
        (run_dir / "summary.json").write_text(json.dumps(summary))
