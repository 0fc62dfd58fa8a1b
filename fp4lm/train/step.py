"""The pure train, eval and telemetry steps.

Each is built from a forward pass `forward(model, tokens_BT, *, quant_key, step_number, **layout) -> logits_BTV`
(`run_model` is the model itself; fault injection, fp4lm.train.fault_injection, wraps it) applied to the
model rebuilt from its pure-dict parameters (`model_apply`). Everything static — the model graph with its
precision policy, the optimizer, the loss scaler — is closed over, so a new policy means a new step
function (the late bf16 switch re-jits).

One step:
    loss    = mean cross-entropy of apply_fn(params, inputs) against targets       (float32)
    grads   = d((loss + aux) * scale)/d(params) / scale                             (dynamic loss scaling)
    if every gradient is finite: params, opt_state <- AdamW update (after clipping)
    else:                        params, opt_state unchanged; the step is counted as skipped

`aux` is the sum of the MoE blocks' weighted router losses (load balance, z-loss; fp4lm.model.moe), 0 for a
dense model; the logged `loss` is the cross-entropy alone, comparable across models. With
model.router_bias_update the routers' selection biases (`state.router_biases`, not parameters: no gradient,
no optimizer state) then move towards balance (DeepSeek-V3), after the optimizer, from the tokens each
expert received in the step. The forward passes take the model's variables, `state.model_variables()`.

Gradient accumulation (`train.grad_accum_steps=N`, N > 1): the step splits the batch into N micro-batches
(`split_micro_batches`) and runs them one after another in a `lax.scan` inside the one jitted step, so only
one micro-batch's activations are alive at a time. Micro-batch i quantizes with the step's key folded with i,
so stochastic rounding differs between micro-batches. Loss and gradients are the means over the micro-batches,
summed in float32: with equal micro-batches the mean of their mean losses is the batch's mean loss, so N
micro-batches give the full batch's gradient up to the order of float32 sums. A non-finite gradient in any
micro-batch makes the sum non-finite, so the loss scaler skips the whole step. With N = 1 none of this is
traced: the program is exactly the single-batch one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from fp4lm.model import collect_layer_stats, pop_layer_stats
from fp4lm.model.moe import pop_routing_stats, routing_metrics
from fp4lm.model.routing import update_router_biases
from fp4lm.train.loss_scale import LossScaler, all_finite
from fp4lm.train.optimizer import update_count
from fp4lm.train.state import TrainState, with_router_biases

# forward(model, tokens_BT, *, quant_key, step_number, **layout) -> logits_BTV; step_number is 1-based;
# layout: the batch's document layout, `document_layout(batch)` (nothing when it has none).
Forward = Callable[..., jax.Array]
# apply(variables, tokens_BT, *, quant_key=None, step_number=0) -> logits_BTV; variables: the model's pure dict,
# its parameters and the routers' biases (TrainState.model_variables)
ApplyFn = Callable[..., jax.Array]
# The same, returning (logits_BTV, {MoE block path: its RoutingStats value}); {} for a dense model.
RoutedApplyFn = Callable[..., tuple[jax.Array, dict]]
# stats(variables, tokens_BT, *, quant_key, step_number) -> {layer path: {operand: {metric: scalar}}}
StatsFn = Callable[..., dict]


def run_model(
    model: nnx.Module, tokens_BT: jax.Array, *, quant_key: jax.Array | None, step_number, **layout
) -> jax.Array:
    """The forward pass of training: the model itself (the step number is there for wrappers)."""
    del step_number
    return model(tokens_BT, quant_key=quant_key, **layout)


def document_layout(batch: dict) -> dict:
    """The model's document-masking arguments from a batch: its "segment_ids" and "positions" when the
    pipeline made them (data.document_masking), else nothing, so the program is the plain causal one.
    Windows are never padded (fp4lm.data.pipeline), so every target counts in the loss."""
    if "segment_ids" not in batch:
        return {}
    return {"segment_ids_BT": batch["segment_ids"], "positions_BT": batch["positions"]}


def model_apply_routed(graphdef: nnx.GraphDef, forward: Forward = run_model) -> RoutedApplyFn:
    """The forward pass as a pure function of the model's (pure-dict) variables, with what its routers did."""

    def apply(variables, tokens_BT, *, quant_key=None, step_number=0, **layout):
        model = nnx.merge(graphdef, variables)
        logits = forward(model, tokens_BT, quant_key=quant_key, step_number=step_number, **layout)
        return logits, pop_routing_stats(model)

    return apply


def model_apply(graphdef: nnx.GraphDef, forward: Forward = run_model) -> ApplyFn:
    """The forward pass as a pure function of the model's (pure-dict) variables: the logits alone."""
    routed = model_apply_routed(graphdef, forward)

    def apply(variables, tokens_BT, **options):
        return routed(variables, tokens_BT, **options)[0]

    return apply


def model_stats(graphdef: nnx.GraphDef, forward: Forward = run_model) -> StatsFn:
    """The forward pass's per-layer quantization telemetry, as a pure function of the model's variables."""

    def stats(variables, tokens_BT, *, quant_key, step_number, **layout):
        model = nnx.merge(graphdef, variables)
        collect_layer_stats(model)
        forward(model, tokens_BT, quant_key=quant_key, step_number=step_number, **layout)
        return pop_layer_stats(model)

    return stats


def cross_entropy(logits_BTV: jax.Array, targets_BT: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy over all positions, in float32."""
    losses_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV.astype(jnp.float32), targets_BT)
    return jnp.mean(losses_BT)


def split_micro_batches(batch: dict, count: int) -> dict:
    """Every array of `batch` [B, ...] as [count, B / count, ...]: micro-batch i holds rows i, i + count, ...

    Taking every count-th row (not a contiguous block) keeps the split local to each device: a device holding
    a contiguous block of rows (the batch axis is sharded over data and fsdp) gives each micro-batch an equal
    share of its rows whenever `count` divides its row count.
    """

    def split(rows):
        return jnp.swapaxes(rows.reshape(rows.shape[0] // count, count, *rows.shape[1:]), 0, 1)

    return jax.tree.map(split, batch)


def accumulate_gradients(loss_and_grads, params, batch: dict, quant_key: jax.Array, count: int):
    """(mean measurements, mean gradients) over `count` micro-batches of `batch`, in a `lax.scan`, summed in
    float32.

    `loss_and_grads(micro_batch, quant_key) -> (measurements, grads)`, the measurements a tree of float32
    arrays (the loss, the routers' statistics); micro-batch i gets `fold_in(quant_key, i)`.
    """

    def one_micro_batch(sums, index_and_micro_batch):
        index, micro_batch = index_and_micro_batch
        measured, grads = loss_and_grads(micro_batch, jax.random.fold_in(quant_key, index))
        add = lambda total, value: total + value.astype(jnp.float32)  # noqa: E731
        return jax.tree.map(add, sums, (measured, grads)), None

    first_micro_batch = jax.tree.map(lambda rows: rows[0], split_micro_batches(batch, count))
    measured_shapes = jax.eval_shape(lambda: loss_and_grads(first_micro_batch, quant_key)[0])
    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), (measured_shapes, params))
    micro_batches = (jnp.arange(count), split_micro_batches(batch, count))
    (measured_sums, grad_sums), _ = jax.lax.scan(one_micro_batch, zeros, micro_batches)
    mean_grads = jax.tree.map(lambda total, p: (total / count).astype(p.dtype), grad_sums, params)
    return jax.tree.map(lambda total: total / count, measured_sums), mean_grads


def make_train_step(
    apply_fn: RoutedApplyFn,
    optimizer: optax.GradientTransformation,
    scaler: LossScaler,
    schedule,
    grad_accum_steps: int = 1,
    router_bias_update: float = 0.0,
):
    """`train_step(state, batch) -> (state, metrics)`; jit it with `jit_train_step`.

    With `grad_accum_steps` > 1 the batch is split into that many micro-batches (see the module doc).
    `router_bias_update`: model.router_bias_update, the step of the MoE routers' loss-free balancing."""

    def train_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        step_number = state.step + 1

        def loss_and_grads(batch: dict, quant_key: jax.Array):
            def scaled_loss(params):
                layout = document_layout(batch)
                variables = with_router_biases(params, state.router_biases)
                logits, routing = apply_fn(
                    variables, batch["inputs"], quant_key=quant_key, step_number=step_number, **layout
                )
                loss = cross_entropy(logits, batch["targets"])
                aux = sum((stats["aux_loss"] for stats in routing.values()), jnp.zeros((), jnp.float32))
                return scaler.scale_loss(state.loss_scale, loss + aux), {"loss": loss, "routing": routing}

            scaled_grads, measured = jax.grad(scaled_loss, has_aux=True)(state.params)
            return measured, scaler.unscale(state.loss_scale, scaled_grads)

        if grad_accum_steps == 1:
            measured, grads = loss_and_grads(batch, state.quant_key())
        else:
            measured, grads = accumulate_gradients(
                loss_and_grads, state.params, batch, state.quant_key(), grad_accum_steps
            )
        loss, routing = measured["loss"], measured["routing"]

        finite = all_finite(grads)  # a non-finite micro-batch leaves the accumulated sum non-finite
        updates, new_opt_state = optimizer.update(grads, state.opt_state, state.params)
        new_params = optax.apply_updates(state.params, updates)
        new_router_biases = update_router_biases(state.router_biases, routing, router_bias_update)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
        new_state = dataclasses.replace(
            state,
            step=step_number,
            params=keep(new_params, state.params),
            opt_state=keep(new_opt_state, state.opt_state),
            loss_scale=scaler.update(state.loss_scale, finite),
            router_biases=keep(new_router_biases, state.router_biases),
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
        if routing:
            metrics["routing"] = routing_metrics(routing)
        return new_state, metrics

    return train_step


def jit_train_step(train_step, state_shardings, batch_sharding, replicated):
    """Jitted with explicit shardings; the input state is donated (its buffers become the output's)."""
    return jax.jit(
        train_step,
        in_shardings=(state_shardings, batch_sharding),  # every array of the batch dict
        out_shardings=(state_shardings, replicated),
        donate_argnums=0,
    )


def make_eval_step(apply_fn: ApplyFn):
    """`eval_step(variables, batch) -> mean loss` (float32); forward only, no stochastic rounding involved."""

    def eval_step(variables, batch):
        return cross_entropy(apply_fn(variables, batch["inputs"], **document_layout(batch)), batch["targets"])

    return eval_step


def make_stats_step(stats_fn: StatsFn):
    """`stats_step(variables, batch, rng, step_number) -> {layer: {operand: {metric: scalar}}}` (telemetry).

    The forward pass of step `step_number` (1-based) as the train step ran it: the same quantization key,
    and the same forward pass (so, when fault injection poisons that step, the same poison).
    """

    def stats_step(variables, batch, rng, step_number):
        quant_key = jax.random.fold_in(jax.random.wrap_key_data(rng), step_number - 1)
        layout = document_layout(batch)
        return stats_fn(variables, batch["inputs"], quant_key=quant_key, step_number=step_number, **layout)

    return stats_step
