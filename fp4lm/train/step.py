"""The pure train and eval steps.

`apply_fn(params, tokens_BT, *, quant_key, collect_stats=False, activation_poison=None)` is the model as a
function of its parameters (see `model_apply`); everything static — the model graph with its precision
policy, the optimizer, the loss scaler, the fault-injection settings — is closed over, so a new policy
means a new step function (the late bf16 switch re-jits).

One step:
    loss    = mean cross-entropy of apply_fn(params, inputs) against targets       (float32)
    grads   = d(loss * scale)/d(params) / scale                                     (dynamic loss scaling)
    if every gradient is finite: params, opt_state <- AdamW update (after clipping)
    else:                        params, opt_state unchanged; the step is counted as skipped
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from fp4lm.config import DebugConfig
from fp4lm.train.loss_scale import LossScaler, all_finite
from fp4lm.train.optimizer import update_count
from fp4lm.train.state import TrainState

ApplyFn = Callable[..., jax.Array]


def model_apply(graphdef: nnx.GraphDef) -> ApplyFn:
    """The model as a pure function of its (pure-dict) parameters."""

    def apply(params, tokens_BT, **kwargs):
        return nnx.merge(graphdef, params)(tokens_BT, **kwargs)

    return apply


def cross_entropy(logits_BTV: jax.Array, targets_BT: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy over all positions, in float32."""
    losses_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV.astype(jnp.float32), targets_BT)
    return jnp.mean(losses_BT)


def injection_active(step_number: jax.Array, debug: DebugConfig) -> jax.Array | None:
    """Whether `debug.inject_nonfinite_*` poisons the step numbered `step_number` (1-based); None if unused."""
    if debug.inject_nonfinite_at is None:
        return None
    first = debug.inject_nonfinite_at
    return (step_number >= first) & (step_number < first + debug.inject_nonfinite_steps)


def _activation_poison(poisoned: jax.Array | None, debug: DebugConfig) -> jax.Array | None:
    """NaN (added to the residual stream by the model) on poisoned steps when injecting into activations."""
    if poisoned is None or debug.inject_nonfinite_into != "activations":
        return None
    return jnp.where(poisoned, jnp.nan, 0.0).astype(jnp.float32)


def make_train_step(
    apply_fn: ApplyFn, optimizer: optax.GradientTransformation, scaler: LossScaler, schedule, debug: DebugConfig
):
    """`train_step(state, batch) -> (state, metrics)`; jit it with `jit_train_step`."""

    def train_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        step_number = state.step + 1
        poisoned = injection_active(step_number, debug)
        activation_poison = _activation_poison(poisoned, debug)

        def scaled_loss(params):
            logits = apply_fn(
                params, batch["inputs"], quant_key=state.quant_key(), activation_poison=activation_poison
            )
            loss = cross_entropy(logits, batch["targets"])
            return scaler.scale_loss(state.loss_scale, loss), loss

        scaled_grads, loss = jax.grad(scaled_loss, has_aux=True)(state.params)
        grads = scaler.unscale(state.loss_scale, scaled_grads)
        if poisoned is not None and debug.inject_nonfinite_into == "grads":
            factor = jnp.where(poisoned, jnp.nan, 1.0).astype(jnp.float32)
            grads = jax.tree.map(lambda g: g * factor.astype(g.dtype), grads)

        finite = all_finite(grads)
        updates, new_opt_state = optimizer.update(grads, state.opt_state, state.params)
        new_params = optax.apply_updates(state.params, updates)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
        new_state = state.replace(
            step=step_number,
            params=keep(new_params, state.params),
            opt_state=keep(new_opt_state, state.opt_state),
            loss_scale=scaler.update(state.loss_scale, finite),
        )
        metrics = {
            "loss": loss,
            "grad_norm": optax.global_norm(grads),
            "lr": jnp.asarray(schedule(update_count(state.opt_state)), jnp.float32),
            "loss_scale": state.loss_scale.scale,
            "skipped": ~finite,
            "skipped_steps": new_state.loss_scale.skipped_steps,
            "consecutive_skips": new_state.loss_scale.consecutive_skips,
        }
        return new_state, metrics

    return train_step


def jit_train_step(train_step, state_shardings, batch_sharding, replicated):
    """Jitted with explicit shardings; the input state is donated (its buffers become the output's)."""
    return jax.jit(
        train_step,
        in_shardings=(state_shardings, {"inputs": batch_sharding, "targets": batch_sharding}),
        out_shardings=(state_shardings, replicated),
        donate_argnums=0,
    )


def make_eval_step(apply_fn: ApplyFn):
    """`eval_step(params, batch) -> mean loss` (float32); forward only, no stochastic rounding involved."""

    def eval_step(params, batch):
        return cross_entropy(apply_fn(params, batch["inputs"]), batch["targets"])

    return eval_step


def make_stats_step(apply_fn: ApplyFn, debug: DebugConfig):
    """`stats_step(params, batch, rng, step_number) -> {layer: {operand: {metric: scalar}}}` (telemetry).

    The forward pass of step `step_number` (1-based) as the train step ran it: the same quantization key
    and, when `debug` injects into activations on that step, the same poison.
    """

    def stats_step(params, batch, rng, step_number):
        quant_key = jax.random.fold_in(jax.random.wrap_key_data(rng), step_number - 1)
        activation_poison = _activation_poison(injection_active(step_number, debug), debug)
        _, stats = apply_fn(
            params, batch["inputs"], quant_key=quant_key, collect_stats=True, activation_poison=activation_poison
        )
        return stats

    return stats_step
