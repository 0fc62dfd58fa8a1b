"""The 16-point random Hadamard transform (RHT) of the NVFP4 recipe (docs/numerics.md §4).

    H = diag(s) · H16 / 4,   H16[i][j] = (-1)^popcount(i & j)   (natural-order Sylvester matrix)

with the fixed sign vector s (bit i of 0xD7E8 set iff s_i = -1), shared by every layer, as in
TransformerEngine. Entries are ±1/4 (exact in bf16) and H·Hᵀ = I. Each run of 16 consecutive
elements along the last axis is multiplied by H from the right: y = x·H.

Why it needs no inverse: it is applied to both operands of the weight-gradient GEMM along the
contraction (token) axis, and (dYᵀH)(HᵀX) = dYᵀX because the block-diagonal H is orthogonal.

Dtype rule: the 16 exact products are summed in float32 (a fixed butterfly, see `rht`) and the sum is
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


def rht(x, axis: int = -1):
    """Apply the 16-point RHT to every 16-element run along ``axis`` (the last by default); result has x's dtype.

    Computed as a fast Walsh-Hadamard butterfly on the sign-flipped, quartered values (exact in float32
    barring subnormals): four stages of elementwise (a + b, a - b) over halves of each run. Every output is
    one fixed tree of float32 additions, so the result does not depend on how XLA splits the work: a run
    cut across devices gives the same bits as an unsharded one (a matmul there would sum its partial
    products across devices, in another order). For bf16 input the sums are exact (unless a run spans more
    than ~12 binades), so this equals the matmul's exact-then-round result.

    ``axis``: the same tree along any axis gives the same bits. Transforming a ``[tokens, features]`` array
    along its tokens (axis 0) and transposing the result is how a weight-gradient operand should be built:
    the butterfly then adds whole contiguous rows, where transforming the transposed array along its last
    axis reads every element a row apart (several times slower on a CPU; BENCHMARKS.md).

    Raises ValueError when that axis is not a multiple of 16.
    """
    axis = axis % x.ndim if x.ndim else 0
    if x.ndim == 0 or x.shape[axis] % RHT_SIZE != 0:
        raise ValueError(
            f"rht: axis {axis} must be a multiple of {RHT_SIZE}, got shape {tuple(x.shape)}; pad or reshape the tensor"
        )
    before, after = x.shape[:axis], x.shape[axis + 1 :]
    runs = before + (x.shape[axis] // RHT_SIZE,)
    signs = jnp.asarray(rht_signs() / 4.0).reshape((RHT_SIZE,) + (1,) * len(after))
    y = x.astype(jnp.float32).reshape(runs + (RHT_SIZE,) + after) * signs
    half = RHT_SIZE // 2
    while half >= 1:  # Sylvester order: stage `half` pairs element i with i + half inside runs of 2 * half
        pairs = y.reshape(runs + (RHT_SIZE // (2 * half), 2, half) + after)
        a, b = (lax.index_in_dim(pairs, i, axis=len(runs) + 1, keepdims=False) for i in (0, 1))
        y = jnp.stack([a + b, a - b], axis=len(runs) + 1).reshape(runs + (RHT_SIZE,) + after)
        half //= 2
    y = y.reshape(x.shape)
    if y.dtype != x.dtype:
        y = lax.optimization_barrier(y.astype(x.dtype))
    return y
