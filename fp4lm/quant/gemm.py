"""GEMM backends: one block-scaled matmul, two ways to run it.

Every GEMM here is "TN": both operands are ``[B, R, K]`` with the contraction axis K last (the layout NVFP4
tensor cores require), and the result is ``[B, Ra, Rb]`` in float32::

    out[b, i, j] = Σ_k a[b, i, k] · b[b, j, k]

An operand is either a plain array (not quantized) or a `ScaledOperand`: element values (E2M1 as
``float4_e2m1fn``) with one E4M3 scale per 16 elements along K and an fp32 per-tensor decode scale. For
NVFP4 the represented value is ``e2m1 · s_b · (amax / 2688)`` (nvfp4_spec.md §6).

- ``emulated``: form ``e2m1 · s_b`` in bfloat16 — exact, since a 2-bit E2M1 significand times a 4-bit E4M3
  significand fits in bf16's 8 bits — multiply with float32 accumulation, then apply
  ``alpha = global_a · global_b`` to the output, as the hardware does.
- ``native``: ``jax.nn.scaled_matmul`` on ``float4_e2m1fn`` data and ``float8_e4m3fn`` scales, then ``alpha``.
  On Blackwell that is cuDNN's block-scaled GEMM; on CPU jax lowers it to a decomposition (a private
  ``_scaled_matmul`` function in the StableHLO), which is how the tests check it runs for real.
  Operands that are not NVFP4 (MX, FP8, unquantized) fall back to the emulated product — scaled_matmul
  cannot express per-tensor FP8, and we keep MX formats on one well-tested path.
- ``auto``: ``native`` when the first device has FP4 tensor cores (compute capability >= 10.0), decided by
  inspecting the device, else ``emulated``.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax

BACKENDS = ("auto", "emulated", "native")

NVFP4_BLOCK = 16
NVFP4_GLOBAL = 6.0 * 448.0  # amax / 2688 is the per-tensor decode scale


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ScaledOperand:
    """A block-scaled GEMM operand ``[B, R, K]``: value = values · block_scales (repeated) · global_scale."""

    values: jax.Array  # float4_e2m1fn [B, R, K]
    block_scales: jax.Array  # float8_e4m3fn [B, R, K / 16]
    global_scale: jax.Array  # float32 scalar, decode direction

    @property
    def shape(self) -> tuple[int, ...]:
        return self.values.shape

    def transpose_tiles(self) -> ScaledOperand:
        """The transpose ``[B, K, R]`` of an operand quantized in 16x16 tiles (rows repeat the tile scale).

        A tile's codes and its one scale do not depend on which axis is contracted, so this is exact:
        transposing the codes and the tile grid gives what quantizing the transposed tensor would give.
        """
        b, r, k = self.values.shape
        tiles = self.block_scales[:, ::NVFP4_BLOCK, :]  # [B, R/16, K/16]: one entry per tile
        scales_t = jnp.repeat(jnp.swapaxes(tiles, 1, 2), NVFP4_BLOCK, axis=1)  # [B, K, R/16]
        return ScaledOperand(jnp.swapaxes(self.values, 1, 2), scales_t, self.global_scale)


def nvfp4_operand(q, rows_cols: tuple[int, int, int]) -> ScaledOperand:
    """View an NVFP4Array of logical shape ``[B, R, K]`` as a ScaledOperand (no arithmetic on values).

    The packed bytes hold element 2i in the low nibble; bitcasting uint8 to float4_e2m1fn splits each byte
    into [low, high], which is that order.
    """
    b, r, k = rows_cols
    values = lax.bitcast_convert_type(q.packed, jnp.float4_e2m1fn).reshape(b, r, k)
    global_scale = q.amax.astype(jnp.float32) / jnp.float32(NVFP4_GLOBAL)
    return ScaledOperand(values, q.scales.reshape(b, r, k // NVFP4_BLOCK), global_scale)


def resolve_backend(backend: str) -> str:
    """``auto`` -> ``native`` on devices with FP4 tensor cores (CUDA compute capability >= 10.0)."""
    assert backend in BACKENDS, backend
    if backend != "auto":
        return backend
    device = jax.devices()[0]
    capability = getattr(device, "compute_capability", None)
    if device.platform == "gpu" and capability is not None and float(capability) >= 10.0:
        return "native"
    return "emulated"


def _block_scaled_bf16(op: ScaledOperand) -> jax.Array:
    """``e2m1 · s_b`` in bfloat16 (exact); the global scale is applied after the GEMM."""
    scales = jnp.repeat(op.block_scales.astype(jnp.bfloat16), NVFP4_BLOCK, axis=-1)
    return op.values.astype(jnp.bfloat16) * scales


def _tn_dot(a: jax.Array, b: jax.Array) -> jax.Array:
    """``[B, Ra, K] x [B, Rb, K] -> [B, Ra, Rb]`` with float32 accumulation."""
    if a.dtype != b.dtype or a.dtype != jnp.bfloat16:
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return lax.dot_general(
        a,
        b,
        (((2,), (2,)), ((0,), (0,))),
        precision=lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )


def matmul(a, b, *, backend: str) -> jax.Array:
    """``Σ_k a[b,i,k] · b[b,j,k]`` in float32 for plain arrays or ScaledOperands; see module docstring."""
    backend = resolve_backend(backend)
    both_scaled = isinstance(a, ScaledOperand) and isinstance(b, ScaledOperand)
    if backend == "native" and both_scaled:
        out = jax.nn.scaled_matmul(
            a.values, b.values, a.block_scales, b.block_scales, preferred_element_type=jnp.float32
        )
        return out * (a.global_scale * b.global_scale)
    alpha = None
    if isinstance(a, ScaledOperand):
        a, alpha = _block_scaled_bf16(a), a.global_scale
    if isinstance(b, ScaledOperand):
        b, alpha = _block_scaled_bf16(b), b.global_scale if alpha is None else alpha * b.global_scale
    out = _tn_dot(a, b)
    return out if alpha is None else out * alpha
