"""The jitted functions of a run for one precision policy (a new policy means new functions)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable

import jax
from jax.sharding import NamedSharding, PartitionSpec

from fp4lm.quant import Policy
from fp4lm.sharding import batch_sharding, on_mesh
from fp4lm.train import model_setup
from fp4lm.train.fault_injection import poisoned_forward
from fp4lm.train.setup import RunSetup
from fp4lm.train.step import (
    jit_train_step,
    make_eval_step,
    make_stats_step,
    make_train_step,
    model_apply,
    model_apply_routed,
    model_stats,
    run_model,
)


@dataclasses.dataclass(frozen=True)
class RunFunctions:
    policy: Policy
    apply: Callable  # apply(params, tokens, **kwargs) -> logits (not jitted)
    train_step: jax.stages.Wrapped  # jit: (state, batch) -> (state, metrics); donates state
    eval_step: Callable  # jit: (params, batch) -> mean loss
    stats_step: Callable  # jit: (params, batch, rng, step_number) -> telemetry

    @staticmethod
    def apply_only(model, policy: Policy) -> Callable:
        """The model under `policy` as apply(params, tokens, **kwargs) -> logits."""
        return model_apply(model_setup.graphdef_with_policy(model, policy))

    @classmethod
    def build(cls, setup: RunSetup, policy: Policy) -> RunFunctions:
        """The run's functions under `policy`: the one place the train step is built, for the trainer, the
        dry run and the device check, on `setup.mesh`. The train and telemetry steps inject faults as
        `debug` says; the train step splits its batch into `train.grad_accum_steps` micro-batches."""
        config, mesh = setup.config, setup.mesh
        # On a mesh of several devices, MoE blocks split their experts over it: the steps traced on the mesh.
        graphdef = model_setup.graphdef_with_policy(setup.model, policy, expert_parallel=mesh.size > 1)
        apply = model_apply(model_setup.graphdef_with_policy(setup.model, policy))  # global arrays, no mesh
        training_forward = poisoned_forward(config.debug) or run_model
        eval_forward = run_model
        # Traced on the mesh: the blocks keep the batch split on it, MoE blocks split their experts over it,
        # fp4_param_gather places each weight's NVFP4 tiles on it.
        training_forward, eval_forward = on_mesh(training_forward, mesh), on_mesh(eval_forward, mesh)
        train_step = jit_train_step(
            make_train_step(
                model_apply_routed(graphdef, training_forward),
                setup.optimizer,
                setup.scaler,
                setup.schedule,
                config.train.grad_accum_steps,
                config.model.router_bias_update,
            ),
            setup.state_shardings,
            batch_sharding(mesh),
            NamedSharding(mesh, PartitionSpec()),
        )
        return cls(
            policy=policy,
            apply=apply,
            train_step=train_step,
            eval_step=jax.jit(make_eval_step(model_apply(graphdef, eval_forward))),
            stats_step=jax.jit(make_stats_step(model_stats(graphdef, training_forward))),
        )


def _nonfinite_metric(operands: dict) -> str | None:
    for operand, metrics in operands.items():
        for metric, value in metrics.items():
            if not math.isfinite(float(value)):
                return f"{operand} {metric}={float(value)}"
    return None


def first_nonfinite_layer(
    functions: RunFunctions, state, batch: dict, step: int, paths: list[str], to_device: Callable
) -> str:
    """Re-runs the forward pass of step `step`'s batch with telemetry; names the first layer (in execution
    order) whose quantization statistics are non-finite, as a phrase for the divergence message."""
    if not any(functions.policy.recipe_for(p).is_quantized for p in paths):
        return "no quantized layers report telemetry (all bf16)"
    stats = jax.device_get(functions.stats_step(state.model_variables(), batch, state.rng, to_device(step)))
    for path in paths:
        per_expert = itertools.takewhile(stats.__contains__, (f"{path}.{e}" for e in itertools.count()))
        for name in [path] if path in stats else per_expert:  # a MoE projection reports each expert: path.e
            found = _nonfinite_metric(stats[name])
            if found:
                return f"first layer with non-finite telemetry on that batch: {name} ({found})"
    return (
        "no layer's forward telemetry is non-finite on that batch, so the gradients went non-finite in the "
        "backward pass"
    )
