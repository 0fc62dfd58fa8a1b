"""The lines a run starts with: where it runs, the model, the mesh, the data, the precision and its table."""

from __future__ import annotations

import pathlib

import jax

import fp4lm.data
from fp4lm.quant import Policy
from fp4lm.train import model_setup
from fp4lm.train.bf16_switch import Bf16Switch
from fp4lm.train.optimizer import effective_warmup_steps
from fp4lm.train.setup import RunSetup


def banner_lines(
    setup: RunSetup,
    run_dir: pathlib.Path,
    start_step: int,
    params: dict,
    policy: Policy,
    data: fp4lm.data.Data,
    switch: Bf16Switch,
) -> list[str]:
    """The banner of a run of `setup` in `run_dir` from `start_step` (0: a new run) under `policy`, switching
    to bf16 at `switch`; ends with notes: where a resume keeps or moves that switch, and when
    optimizer.warmup_steps does not fit in train.steps."""
    c, m = setup.config, setup.config.model
    resumed = f"resuming from step {start_step}" if start_step else "new run"
    devices = jax.devices()
    mesh = ", ".join(f"{name}={size}" for name, size in setup.mesh.shape.items())
    scaling = f"on (initial scale {setup.scaler.initial_scale:g})" if setup.scaler.enabled else "off"
    later = ""
    if switch.step is not None:
        later = f"; all layers {'switched' if switch.step < start_step else 'switch'} to bf16 after step {switch.step}"
    lines = [
        f"fp4lm train: {run_dir} ({resumed}), {c.train.steps} steps",
        f"model: {m.num_layers} layers, d_model {m.d_model}, {m.num_heads} heads ({m.num_kv_heads} kv), "
        f"mlp {m.mlp_dim}, vocab {data.vocab_size}: {model_setup.count_params(params):,} parameters",
        f"mesh: {mesh} ({len(devices)} {devices[0].platform} devices, {jax.process_count()} processes); "
        f"global batch {c.train.batch_size} x {c.data.seq_len} tokens",
        data.describe(),
        f"precision: {policy.summary(setup.paths)}; loss scaling {scaling}{later}",
        policy.table(setup.paths),
    ]
    if switch.note is not None:
        lines.append(switch.note)
    warmup = effective_warmup_steps(c.optimizer, c.train.steps)
    if warmup < c.optimizer.warmup_steps:
        lines.append(
            f"note: optimizer.warmup_steps={c.optimizer.warmup_steps} does not fit in train.steps={c.train.steps}; "
            f"the warm-up is shortened to {warmup} steps (lower optimizer.warmup_steps to choose it yourself)"
        )
    return lines
