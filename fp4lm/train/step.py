"""The pure train, eval and telemetry steps.

Each is built from a forward pass `forward(model, tokens_BT, *, quant_key, step_number) -> logits_BTV`
(`run_model` is the model itself; fault injection, fp4lm.train.fault_injection, wraps it) applied to the
model rebuilt from its pure-dict parameters (`model_apply`). Everything static — the model graph with its
precision policy, the optimizer, the loss scaler — is closed over, so a new policy means a new step
function (the late bf16 switch re-jits).

One step:
    loss    = mean cross-entropy of apply_fn(params, inputs) against targets       (float32)
    grads   = d(loss * scale)/d(params) / scale                                     (dynamic loss scaling)
    if every gradient is finite: params, opt_state <- AdamW update (after clipping)
    else:                        params, opt_state unchanged; the step is counted as skipped
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from fp4lm.model import collect_layer_stats, pop_layer_stats
from fp4lm.train.loss_scale import LossScaler, all_finite
from fp4lm.train.optimizer import update_count
from fp4lm.train.state import TrainState

# forward(model, tokens_BT, *, quant_key, step_number) -> logits_BTV; step_number is 1-based.
Forward = Callable[..., jax.Array]
# apply(params, tokens_BT, *, quant_key=None, step_number=0) -> logits_BTV
ApplyFn = Callable[..., jax.Array]
# stats(params, tokens_BT, *, quant_key, step_number) -> {layer path: {operand: {metric: scalar}}}
StatsFn = Callable[..., dict]


def run_model(model: nnx.Module, tokens_BT: jax.Array, *, quant_key: jax.Array | None, step_number) -> jax.Array:
    """The forward pass of training: the model itself (the step number is there for wrappers)."""
    del step_number
    return model(tokens_BT, quant_key=quant_key)


def model_apply(graphdef: nnx.GraphDef, forward: Forward = run_model) -> ApplyFn:
    """The forward pass as a pure function of the model's (pure-dict) parameters."""

    def apply(params, tokens_BT, *, quant_key=None, step_number=0):
        return forward(nnx.merge(graphdef, params), tokens_BT, quant_key=quant_key, step_number=step_number)

    return apply


def model_stats(graphdef: nnx.GraphDef, forward: Forward = run_model) -> StatsFn:
    """The forward pass's per-layer quantization telemetry, as a pure function of the parameters."""

    def stats(params, tokens_BT, *, quant_key, step_number):
        model = nnx.merge(graphdef, params)
        collect_layer_stats(model)
        forward(model, tokens_BT, quant_key=quant_key, step_number=step_number)
        return pop_layer_stats(model)

    return stats


def cross_entropy(logits_BTV: jax.Array, targets_BT: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy over all positions, in float32."""
    losses_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV.astype(jnp.float32), targets_BT)
    return jnp.mean(losses_BT)


def make_train_step(apply_fn: ApplyFn, optimizer: optax.GradientTransformation, scaler: LossScaler, schedule):
    """`train_step(state, batch) -> (state, metrics)`; jit it with `jit_train_step`."""

    def train_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        step_number = state.step + 1

        def scaled_loss(params):
            logits = apply_fn(params, batch["inputs"], quant_key=state.quant_key(), step_number=step_number)
            loss = cross_entropy(logits, batch["targets"])
            return scaler.scale_loss(state.loss_scale, loss), loss

        scaled_grads, loss = jax.grad(scaled_loss, has_aux=True)(state.params)
        grads = scaler.unscale(state.loss_scale, scaled_grads)

        finite = all_finite(grads)
        updates, new_opt_state = optimizer.update(grads, state.opt_state, state.params)
        new_params = optax.apply_updates(state.params, updates)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
        new_state = dataclasses.replace(
            state,
            step=step_number,
            params=keep(new_params, state.params),
            opt_state=keep(new_opt_state, state.opt_state),
            loss_scale=scaler.update(state.loss_scale, finite),
        )
        metrics = {
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),
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


def make_stats_step(stats_fn: StatsFn):
    """`stats_step(params, batch, rng, step_number) -> {layer: {operand: {metric: scalar}}}` (telemetry).

    The forward pass of step `step_number` (1-based) as the train step ran it: the same quantization key,
    and the same forward pass (so, when fault injection poisons that step, the same poison).
    """

    def stats_step(params, batch, rng, step_number):
        quant_key = jax.random.fold_in(jax.random.wrap_key_data(rng), step_number - 1)
        return stats_fn(params, batch["inputs"], quant_key=quant_key, step_number=step_number)

    return stats_step
