"""Approximate divides that mimic a GPU's: the float32 quotient moved by whole ulps.

`division._approximate_divide` is the only floating-point divide on the quantization path; tests
replace it (with pytest's monkeypatch, so only for that test) by one of these and check that no
quantized bit changes. Jitted functions trace the helper again only after `jax.clear_caches()`.
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np

from fp4lm.numerics import division


def off_by_one_ulp(direction):
    """a / b moved one ulp towards +inf (direction +1) or -inf (-1)."""
    target = np.float32(np.inf * direction)

    def divide(a, b):
        return jnp.nextafter(a / b, target)

    return divide


def off_by_ulps(ulps):
    """a / b moved by `ulps` ulps, alternately up and down element by element (on the bit pattern)."""

    def divide(a, b):
        bits = jax.lax.bitcast_convert_type(a / b, jnp.int32)
        index = jnp.arange(bits.size, dtype=jnp.int32).reshape(bits.shape)
        moved = bits + jnp.where(index % 2 == 0, ulps, -ulps).astype(jnp.int32)
        return jax.lax.bitcast_convert_type(moved, jnp.float32)

    return divide


@contextlib.contextmanager
def perturbed(monkeypatch, approximate_divide):
    """Trace everything inside the block with `approximate_divide`; caches are cleared on both sides."""
    jax.clear_caches()
    with monkeypatch.context() as patch:
        patch.setattr(division, "_approximate_divide", approximate_divide)
        try:
            yield
        finally:
            jax.clear_caches()
