"""An independent fake-quant model of a quantized linear layer, built from fp4lm.numerics only.

Plain 2-D math on the nnx.Linear layout (x [M, K], kernel [K, N], dy [M, N]); every operand is
quantized, then dequantized to float32, and the three products run in float32 at HIGHEST precision.
It shares nothing with fp4lm.quant.dot except the documented key rule (slot i uses fold_in(key, i)).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4lm import numerics

# Tests compile many small quantized programs; LLVM's optimizations would triple the compile time and
# buy nothing at these sizes. (Only code generation changes: XLA's float semantics stay the same.)
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def jit(fn=None, **kwargs):
    """jax.jit with FAST_COMPILE."""
    if fn is None:
        return functools.partial(jit, **kwargs)
    return jax.jit(fn, compiler_options=FAST_COMPILE, **kwargs)


SLOT_ORDER = ("fprop_x", "fprop_w", "dgrad_g", "dgrad_w", "wgrad_g", "wgrad_x")
LINEAR_DIMS = (((1,), (0,)), ((), ()))


def fake_quant(a, spec, key):
    """Dequantized float32 values of operand a [..., C] quantized along C as `spec` says."""
    if spec is None:
        return a.astype(jnp.float32)
    if spec.format == "identity":
        return (numerics.rht(a) if spec.hadamard else a).astype(jnp.float32)
    q = numerics.quantize(
        a,
        spec.format,
        block=spec.block,
        rounding=spec.rounding,
        key=key if spec.rounding == "stochastic" else None,
        hadamard=spec.hadamard,
        nvfp4_options=spec.nvfp4_options,
    )
    return q.dequantize(jnp.float32)


def _matmul(a, b):
    return jnp.matmul(a, b, precision=lax.Precision.HIGHEST)


@functools.partial(jit, static_argnums=0)
def reference_linear(recipe, x, kernel, dy, key):
    """(y, dx, dkernel) in float32 for y = x @ kernel under `recipe`; leading axes are batch axes
    (each tensor still has one amax over all of them)."""
    keys = {slot: jax.random.fold_in(key, i) for i, slot in enumerate(SLOT_ORDER)}

    def q(a, slot):
        return fake_quant(a, getattr(recipe, slot), keys[slot])

    def t(a):
        return jnp.swapaxes(a, -1, -2)

    y = _matmul(q(x, "fprop_x"), t(q(t(kernel), "fprop_w")))  # W = kernelᵀ [N, K], blocks along K
    if recipe.backward_override == "dequantized":  # the backward reads the forward's quantized X and W
        dx = _matmul(dy, q(t(kernel), "fprop_w"))
        dkernel = _matmul(t(q(x, "fprop_x")), dy)
        return y, dx, dkernel
    dx = _matmul(q(dy, "dgrad_g"), t(q(kernel, "dgrad_w")))  # kernel [K, N] = Wᵀ, blocks along N
    dkernel = _matmul(q(t(x), "wgrad_x"), t(q(t(dy), "wgrad_g")))  # Xᵀ [K, M] · dY [M, N]
    return y, dx, dkernel


@functools.partial(jit, static_argnums=0, static_argnames="preferred_element_type")
def quantized_linear(dot, x, kernel, dy, key, **kwargs):
    """(y, dx, dkernel) from a dot_general function (a hashable value), through jax.vjp, jitted."""
    y, vjp = jax.vjp(lambda a, b: dot(a, b, LINEAR_DIMS, key=key, **kwargs), x, kernel)
    return (y, *vjp(dy.astype(y.dtype)))


def relative_error(a, b):
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def gaussian(seed, shape, dtype=jnp.float32, scale=1.0):
    """N(0, scale²) test data from numpy (jax.random would compile a sampler for every new shape)."""
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * np.float32(scale)
    return jnp.asarray(values).astype(dtype)


def gaussian_layer(seed, m, k, n, dtype=jnp.float32):
    """x ~ N(0, 1) [m, k], kernel ~ N(0, 1/k) [k, n], dy ~ N(0, 1) [m, n]."""
    return (
        gaussian((seed, 0), (m, k), dtype),
        gaussian((seed, 1), (k, n), dtype, k**-0.5),
        gaussian((seed, 2), (m, n), dtype),
    )
