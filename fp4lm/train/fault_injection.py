"""Non-finite values on purpose (`debug.inject_nonfinite_*`), injected from outside the model.

The trainer builds these forward passes only when the config asks for injection; the production train step
calls whatever forward pass it is given (fp4lm.train.step), so it has no debug branches.

- activations: NaN is added to the token embeddings (the input of block 0) on the poisoned steps, through
  the model's `embed` / `from_embeddings` entry points, so every layer's activations go non-finite and the
  telemetry names the first quantized layer that saw them;
- grads: the forward values are untouched, but the gradient of every parameter is multiplied by NaN on the
  poisoned steps (an identity with a custom backward).
On the other steps the values are unchanged (+0.0 and x1.0).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lm.config import DebugConfig
from fp4lm.train.step import Forward


def injection_active(step_number: jax.Array, debug: DebugConfig) -> jax.Array:
    """Whether the step numbered `step_number` (1-based) is poisoned."""
    assert debug.inject_nonfinite_at is not None
    first = debug.inject_nonfinite_at
    return (step_number >= first) & (step_number < first + debug.inject_nonfinite_steps)


@jax.custom_vjp
def _scale_gradient(x: jax.Array, factor: jax.Array) -> jax.Array:
    """Identity in the forward pass; the backward pass multiplies the incoming gradient by `factor`."""
    return x


def _scale_gradient_fwd(x, factor):
    return x, factor


def _scale_gradient_bwd(factor, g):
    return g * factor.astype(g.dtype), jnp.zeros_like(factor)


_scale_gradient.defvjp(_scale_gradient_fwd, _scale_gradient_bwd)


def poisoned_forward(debug: DebugConfig) -> Forward | None:
    """The forward pass that injects as `debug` says, or None when it injects nothing."""
    if debug.inject_nonfinite_at is None:
        return None

    if debug.inject_nonfinite_into == "activations":

        def forward(model, tokens_BT, *, quant_key, step_number, **layout):
            x_BTD = model.embed(tokens_BT)
            poison = jnp.where(injection_active(step_number, debug), jnp.nan, 0.0).astype(x_BTD.dtype)
            return model.from_embeddings(x_BTD + poison, quant_key=quant_key, **layout)

        return forward

    def forward(model, tokens_BT, *, quant_key, step_number, **layout):
        factor = jnp.where(injection_active(step_number, debug), jnp.nan, 1.0).astype(jnp.float32)
        params = nnx.state(model, nnx.Param)
        nnx.update(model, jax.tree.map(lambda p: _scale_gradient(p, factor), params))
        return model(tokens_BT, quant_key=quant_key, **layout)

    return forward
