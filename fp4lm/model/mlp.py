"""The dense MLP of a block (SwiGLU), and `quant_linear`, which builds a QuantLinear from its LinearLayer."""

from __future__ import annotations

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


class SwiGLU(nnx.Module):
    """down( silu(x @ gate) * (x @ up) ); the product is formed in float32 and rounded to bfloat16.

    `layers` maps "gate", "up", "down" to their LinearLayer (fp4lm.linear_layers).
    """

    def __init__(self, *, layers: dict[str, LinearLayer], policy: Policy, rngs: nnx.Rngs):
        self.gate = quant_linear(layers["gate"], policy, rngs)
        self.up = quant_linear(layers["up"], policy, rngs)
        self.down = quant_linear(layers["down"], policy, rngs)

    def __call__(self, x_BTD: jax.Array, *, quant_key: jax.Array | None = None) -> jax.Array:
        gate_up_amax = shared_weight_amax([self.gate, self.up])  # gate/up read one activation: one fused group
        gate_BTF = self.gate(x_BTD, quant_key=quant_key, weight_amax=gate_up_amax)
        up_BTF = self.up(x_BTD, quant_key=quant_key, weight_amax=gate_up_amax)
        hidden_BTF = jax.nn.silu(gate_BTF.astype(jnp.float32)) * up_BTF.astype(jnp.float32)
        return self.down(hidden_BTF.astype(COMPUTE_DTYPE), quant_key=quant_key)
