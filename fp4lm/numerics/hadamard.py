"""The 16-point random Hadamard transform (RHT) of the NVFP4 recipe (nvfp4_spec.md §7).

    H = diag(s) · H16 / 4,   H16[i][j] = (-1)^popcount(i & j)   (natural-order Sylvester matrix)

with the fixed sign vector s (bit i of 0xD7E8 set iff s_i = -1), shared by every layer, as in
TransformerEngine. Entries are ±1/4 (exact in bf16) and H·Hᵀ = I. Each run of 16 consecutive
elements along the last axis is multiplied by H from the right: y = x·H.

Why it needs no inverse: it is applied to both operands of the weight-gradient GEMM along the
contraction (token) axis, and (dYᵀH)(HᵀX) = dYᵀX because the block-diagonal H is orthogonal.

Dtype rule: the 16 exact products are summed in float32 (precision HIGHEST) and the sum is
rounded ONCE to the input dtype, so bf16 in gives bf16-rounded outputs as TE's kernel does. The
rounded result passes an optimization barrier so that, under jit, XLA cannot fold the
f32 -> bf16 -> f32 round trip of the quantizer that consumes it.
"""

import jax.numpy as jnp
import numpy as np
from jax import lax

RHT_SIZE = 16
RHT_SIGN_MASK = 0xD7E8


def rht_signs():
    """The sign vector s as float32 [16]: s_i = -1 iff bit i of 0xD7E8 is set."""
    bits = (RHT_SIGN_MASK >> np.arange(RHT_SIZE)) & 1
    return np.where(bits == 1, -1.0, 1.0).astype(np.float32)


def rht_matrix():
    """H = diag(s) · H16 / 4 as a float32 numpy array [16, 16]."""
    i = np.arange(RHT_SIZE)
    and_bits = i[:, None] & i[None, :]
    parity = np.array([bin(int(v)).count("1") & 1 for v in and_bits.ravel()]).reshape(and_bits.shape)
    sylvester = np.where(parity == 1, -1.0, 1.0)
    return (rht_signs()[:, None] * sylvester / 4.0).astype(np.float32)


def rht(x):
    """Apply the 16-point RHT to every 16-element run of the last axis; result has x's dtype.

    Raises ValueError when the last axis is not a multiple of 16.
    """
    if x.ndim == 0 or x.shape[-1] % RHT_SIZE != 0:
        raise ValueError(
            f"rht: the last axis must be a multiple of {RHT_SIZE}, got shape {tuple(x.shape)}; "
            "pad or reshape the tensor"
        )
    chunks = x.astype(jnp.float32).reshape(x.shape[:-1] + (x.shape[-1] // RHT_SIZE, RHT_SIZE))
    y = lax.dot_general(
        chunks,
        jnp.asarray(rht_matrix()),
        dimension_numbers=(((chunks.ndim - 1,), (0,)), ((), ())),
        precision=lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )
    y = y.reshape(x.shape)
    if y.dtype != x.dtype:
        y = lax.optimization_barrier(y.astype(x.dtype))
    return y
