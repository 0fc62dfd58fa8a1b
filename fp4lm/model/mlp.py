"""SwiGLU, the MLP of a dense block and of each expert (`swiglu`), and `quant_linear`, which builds a QuantLinear
from its LinearLayer."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lm.linear_layers import LinearLayer
from fp4lm.model.layers import COMPUTE_DTYPE, QuantLinear, shared_weight_amax
from fp4lm.quant.policy import Policy


def quant_linear(layer: LinearLayer, policy: Policy, rngs: nnx.Rngs) -> QuantLinear:
    return QuantLinear(
        layer.in_features,
        layer.out_features,
        path=layer.path,
        policy=policy,
        logical_axes=layer.logical_axes,
        init_std=layer.init_std,
        rngs=rngs,
    )


def swiglu(x: jax.Array, gate: Callable, up: Callable, down: Callable) -> jax.Array:
    """down(silu(gate(x)) * up(x)): the product formed in float32, rounded to bfloat16 for `down`.

    `gate`, `up` and `down` are the three projections as functions (a dense layer's, or the routed experts'
    grouped GEMMs over rows sorted by expert, fp4lm.model.experts)."""
    hidden = jax.nn.silu(gate(x).astype(jnp.float32)) * up(x).astype(jnp.float32)
    return down(hidden.astype(COMPUTE_DTYPE))


class SwiGLU(nnx.Module):
    """down( silu(x @ gate) * (x @ up) ) (`swiglu`) with three QuantLinears.

    `layers` maps "gate", "up", "down" to their LinearLayer (fp4lm.linear_layers).
    """

    def __init__(self, *, layers: dict[str, LinearLayer], policy: Policy, rngs: nnx.Rngs):
        self.gate = quant_linear(layers["gate"], policy, rngs)
        self.up = quant_linear(layers["up"], policy, rngs)
        self.down = quant_linear(layers["down"], policy, rngs)

    def __call__(self, x_BTD: jax.Array, *, quant_key: jax.Array | None = None) -> jax.Array:
        gate_up_amax = shared_weight_amax([self.gate, self.up])  # gate/up read one activation: one fused group
        return swiglu(
            x_BTD,
            lambda x_BTD: self.gate(x_BTD, quant_key=quant_key, weight_amax=gate_up_amax),
            lambda x_BTD: self.up(x_BTD, quant_key=quant_key, weight_amax=gate_up_amax),
            lambda hidden_BTM: self.down(hidden_BTM, quant_key=quant_key),
        )
