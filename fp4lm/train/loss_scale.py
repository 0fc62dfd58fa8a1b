"""Dynamic loss scaling: scale the loss up so small gradients survive low precision, skip bad steps.

Each step the loss is multiplied by `scale` before differentiation and the gradients are divided by it
afterwards. When any gradient is non-finite the update is skipped (parameters and optimizer state stay as
they were), the scale backs off by `backoff_factor` and the skip is counted. After `growth_interval`
finite steps in a row the scale grows by `growth_factor`. With scaling disabled the scale stays 1.0, but a
non-finite step is still skipped and counted: a NaN never reaches the parameters.

`consecutive_skips` lets the loop stop a run that only produces non-finite steps instead of spinning.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from fp4lm.config import LossScaleConfig


@struct.dataclass
class LossScaleState:
    scale: jax.Array  # float32 scalar
    finite_in_a_row: jax.Array  # int32: finite steps since the last growth or back-off
    consecutive_skips: jax.Array  # int32: non-finite steps in a row (0 after any finite step)
    skipped_steps: jax.Array  # int32: all skipped steps of the run


@dataclasses.dataclass(frozen=True)
class LossScaler:
    """Static settings (hashable); the changing numbers live in LossScaleState inside the train state.
    The defaults are `LossScaleConfig`'s."""

    enabled: bool
    initial_scale: float = LossScaleConfig.initial_scale
    growth_interval: int = LossScaleConfig.growth_interval
    growth_factor: float = LossScaleConfig.growth_factor
    backoff_factor: float = LossScaleConfig.backoff_factor
    min_scale: float = LossScaleConfig.min_scale
    max_scale: float = LossScaleConfig.max_scale

    @classmethod
    def from_config(cls, cfg: LossScaleConfig, *, recipe_is_quantized: bool) -> LossScaler:
        enabled = recipe_is_quantized if cfg.enabled is None else cfg.enabled
        return cls(
            enabled=enabled,
            initial_scale=cfg.initial_scale,
            growth_interval=cfg.growth_interval,
            growth_factor=cfg.growth_factor,
            backoff_factor=cfg.backoff_factor,
            min_scale=cfg.min_scale,
            max_scale=cfg.max_scale,
        )

    def init(self) -> LossScaleState:
        scale = min(max(self.initial_scale, self.min_scale), self.max_scale) if self.enabled else 1.0
        zero = jnp.zeros((), jnp.int32)
        return LossScaleState(
            scale=jnp.asarray(scale, jnp.float32), finite_in_a_row=zero, consecutive_skips=zero, skipped_steps=zero
        )

    def scale_loss(self, state: LossScaleState, loss: jax.Array) -> jax.Array:
        return loss * state.scale if self.enabled else loss

    def unscale(self, state: LossScaleState, grads):
        if not self.enabled:
            return grads
        inverse = 1.0 / state.scale
        return jax.tree.map(lambda g: g * inverse.astype(g.dtype), grads)

    def update(self, state: LossScaleState, grads_finite: jax.Array) -> LossScaleState:
        """The state after a step whose gradients were (or were not) all finite."""
        finite_in_a_row = jnp.where(grads_finite, state.finite_in_a_row + 1, 0)
        scale = state.scale
        if self.enabled:
            grow = grads_finite & (finite_in_a_row >= self.growth_interval)
            grown = jnp.minimum(scale * self.growth_factor, self.max_scale)
            backed_off = jnp.maximum(scale * self.backoff_factor, self.min_scale)
            scale = jnp.where(grads_finite, jnp.where(grow, grown, scale), backed_off)
            finite_in_a_row = jnp.where(grow, 0, finite_in_a_row)
        skipped = (~grads_finite).astype(jnp.int32)
        return LossScaleState(
            scale=scale.astype(jnp.float32),
            finite_in_a_row=finite_in_a_row.astype(jnp.int32),
            consecutive_skips=jnp.where(grads_finite, 0, state.consecutive_skips + 1).astype(jnp.int32),
            skipped_steps=(state.skipped_steps + skipped).astype(jnp.int32),
        )


def all_finite(tree) -> jax.Array:
    """True when every element of every leaf is finite (a scalar bool array).

    The flag is computed once behind an optimization barrier: without it XLA fuses the and-chain over all
    leaves into every consumer (the train step selects each parameter and optimizer leaf on it), a program
    quadratic in the number of leaves that took a 48-block MoE step's compile past the machine's memory.
    """
    leaves = [jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree)]
    if not leaves:
        return jnp.asarray(True)
    return jax.lax.optimization_barrier(jnp.all(jnp.stack(leaves)))
