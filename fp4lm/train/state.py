"""The training state: one pytree holding everything a step reads and writes.

`params` is a plain nested dict of float32 arrays (`nnx.to_pure_dict` of the model's parameters), so the
state saves and restores with Orbax without any flax-specific handling. `router_biases` likewise holds the
MoE routers' selection biases (fp4lm.model.routing.RouterBias, model.router_bias_update; {} without them):
model state that is not trained, so it has no gradient and no optimizer state; the train step moves it.
`nnx.merge(graphdef, state.model_variables())` rebuilds the model inside the step. `rng` holds raw uint32
key data (a legacy-style PRNG key), which checkpoints like any other array; the per-step quantization key is
derived from it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import NamedSharding, PartitionSpec

from fp4lm.train.loss_scale import LossScaler, LossScaleState


@struct.dataclass
class TrainState:
    step: jax.Array  # int32: number of training steps taken (skipped ones included)
    params: dict
    opt_state: Any
    loss_scale: LossScaleState
    rng: jax.Array  # uint32[2]: raw key data; quant key of a step = fold_in(key(rng), step)
    router_biases: dict  # RouterBias values, as params: {"blocks": {1: {"mlp": {"router_bias": [X]}}}}, or {}

    def model_variables(self) -> dict:
        """Everything the model's forward pass reads, one pure dict: the parameters and the routers' biases."""
        return with_router_biases(self.params, self.router_biases)

    def quant_key(self) -> jax.Array:
        """The stochastic-rounding key of the step this state is about to take."""
        return jax.random.fold_in(jax.random.wrap_key_data(self.rng), self.step)


def with_router_biases(params: dict, router_biases: dict) -> dict:
    """`params` with the routers' biases added at their places in the tree (a new tree; the leaves are shared)."""
    merged = dict(params)
    for key, value in router_biases.items():
        merged[key] = with_router_biases(params[key], value) if isinstance(value, dict) else value
    return merged


def init_train_state(
    params: dict,
    optimizer: optax.GradientTransformation,
    scaler: LossScaler,
    seed: int,
    router_biases: dict | None = None,
) -> TrainState:
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        loss_scale=scaler.init(),
        rng=jax.random.key_data(jax.random.key(seed, impl="threefry2x32")),
        router_biases={} if router_biases is None else router_biases,
    )


def state_shardings(
    optimizer: optax.GradientTransformation, abstract_state: TrainState, param_shardings: dict, mesh
) -> TrainState:
    """NamedShardings for every leaf: parameters and their optimizer moments as the model says,
    everything else (step, counters, loss scale, rng, the routers' biases) replicated."""
    replicated = NamedSharding(mesh, PartitionSpec())
    opt_shardings = optax.tree_map_params(
        optimizer,
        lambda _param, sharding: sharding,
        abstract_state.opt_state,
        param_shardings,
        transform_non_params=lambda _leaf: replicated,
    )
    # A TrainState-shaped pytree with a sharding at every leaf (as `abstract_state` has ShapeDtypeStructs),
    # so it is made from `abstract_state` with every field replaced rather than through the array-typed fields.
    return dataclasses.replace(
        abstract_state,
        step=replicated,
        params=param_shardings,
        opt_state=opt_shardings,
        loss_scale=jax.tree.map(lambda _leaf: replicated, abstract_state.loss_scale),
        rng=replicated,
        router_biases=jax.tree.map(lambda _leaf: replicated, abstract_state.router_biases),  # [X] each: small
    )


def all_state_finite(state: TrainState) -> jax.Array:
    """True when every floating-point array of the state (params, optimizer state, loss scale, the routers'
    biases) is finite (checked before saving)."""
    leaves = [
        jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(state) if jnp.issubdtype(leaf.dtype, jnp.floating)
    ]
    return jnp.all(jnp.stack(leaves))
