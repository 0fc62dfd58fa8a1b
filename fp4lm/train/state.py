"""The training state: one pytree holding everything a step reads and writes.

`params` is a plain nested dict of float32 arrays (`nnx.to_pure_dict` of the model's parameters), so the
state saves and restores with Orbax without any flax-specific handling; `nnx.merge(graphdef, params)`
rebuilds the model inside the step. `rng` holds raw uint32 key data (a legacy-style PRNG key), which
checkpoints like any other array; the per-step quantization key is derived from it.
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

    def quant_key(self) -> jax.Array:
        """The stochastic-rounding key of the step this state is about to take."""
        return jax.random.fold_in(jax.random.wrap_key_data(self.rng), self.step)


def init_train_state(
    params: dict, optimizer: optax.GradientTransformation, scaler: LossScaler, seed: int
) -> TrainState:
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        loss_scale=scaler.init(),
        rng=jax.random.key_data(jax.random.key(seed, impl="threefry2x32")),
    )


def state_shardings(
    optimizer: optax.GradientTransformation, abstract_state: TrainState, param_shardings: dict, mesh
) -> TrainState:
    """NamedShardings for every leaf: parameters and their optimizer moments as the model says,
    everything else (step, counters, loss scale, rng) replicated."""
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
    )


def all_state_finite(state: TrainState) -> jax.Array:
    """True when params, optimizer state and loss scale hold only finite values (checked before saving)."""
    leaves = [
        jnp.all(jnp.isfinite(leaf))
        for leaf in jax.tree.leaves((state.params, state.opt_state, state.loss_scale))
        if jnp.issubdtype(leaf.dtype, jnp.floating)
    ]
    return jnp.all(jnp.stack(leaves))
