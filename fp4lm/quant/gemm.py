"""GEMM backends: one block-scaled matmul, two ways to run it.

Every GEMM here is "TN": both operands are ``[B, R, K]`` with the contraction axis K last (the layout
FP4 tensor cores require), and the result is ``[B, Ra, Rb]`` in float32::

    out[b, i, j] = Σ_k a[b, i, k] · b[b, j, k]

An operand is a plain array (not quantized) or a `ScaledOperand`: narrow element values, one scale per
block along K, and a float32 per-tensor decode scale. The represented value is
``element · block_scale · global_scale``:

=========  ==================  ===================  ======================
format     element             block scale          global (decode) scale
=========  ==================  ===================  ======================
NVFP4      float4_e2m1fn       float8_e4m3fn / 16   amax / 2688
MXFP4      float4_e2m1fn       float8_e8m0fnu / 32  1
MXFP8      float8_e4m3fn       float8_e8m0fnu / 32  1
FP8        float8_e4m3fn/e5m2  none                 scale_inv (per tensor)
=========  ==================  ===================  ======================

- ``emulated``: form ``element · block_scale`` in bfloat16 — exact, because the significands multiply to
  at most 6 bits (bf16 has 8) and the exponents stay in range — multiply with float32 accumulation
  (every bf16 x bf16 product is exact in float32), then apply ``alpha = global_a · global_b`` to the
  output, as the hardware does (docs/numerics.md).
- ``native``: ``jax.nn.scaled_matmul`` for the two configurations cuDNN's block-scaled GEMM supports —
  NVFP4 (float4_e2m1fn data, float8_e4m3fn scales, block 16) and MXFP8 (float8_e4m3fn data,
  float8_e8m0fnu scales, block 32) — then ``alpha``. On CPU jax lowers it to a decomposition (a private
  ``_scaled_matmul`` function in the StableHLO), which the tests check, so the native path really runs.
  MXFP4, per-tensor FP8 and unquantized operands use the emulated product in either mode.
- ``auto``: ``native`` when the first device has FP4 tensor cores (CUDA compute capability >= 10.0),
  decided by inspecting the device, else ``emulated``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import jax
import jax.numpy as jnp
from jax import lax

from fp4lm import numerics
from fp4lm.config import GemmBackend
from fp4lm.numerics import nvfp4, nvfp4_fused
from fp4lm.numerics.microscaling import MX_BLOCK_SIZE
from fp4lm.numerics.nvfp4 import BLOCK_SIZE as NVFP4_BLOCK_SIZE
from fp4lm.numerics.nvfp4 import tensor_decode_scale

BACKENDS = get_args(GemmBackend)

# (element dtype, block-scale dtype, block size) that cuDNN's block-scaled GEMM accepts.
_NATIVE_CONFIGS = (
    (jnp.dtype(jnp.float4_e2m1fn), jnp.dtype(jnp.float8_e4m3fn), NVFP4_BLOCK_SIZE),
    (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e8m0fnu), MX_BLOCK_SIZE),
)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ScaledOperand:
    """A GEMM operand ``[B, R, K]`` worth ``values · repeat(block_scales) · global_scale``."""

    values: jax.Array  # narrow float [B, R, K] (bf16 e2m1·s_b from nvfp4_block_scaled_operand)
    block_scales: jax.Array | None  # narrow float [B, R, K / block], None for per-tensor FP8 (or scaled values)
    global_scale: jax.Array  # float32 scalar, or [B, R] for a row-scaled NVFP4 operand

    @property
    def shape(self) -> tuple[int, ...]:
        return self.values.shape

    @property
    def block_size(self) -> int | None:
        return None if self.block_scales is None else self.values.shape[-1] // self.block_scales.shape[-1]

    def transpose_rows_and_k(self) -> ScaledOperand:
        """``[B, K, R]``: exact for per-tensor FP8 and for NVFP4 16x16 tiles (rows repeat the tile scale).

        A tile's codes and its one scale do not depend on which axis is contracted, so transposing the
        codes and the tile grid gives exactly what quantizing the transposed tensor would give.
        """
        assert jnp.ndim(self.global_scale) == 0, "a row-scaled operand does not transpose"
        values_t = jnp.swapaxes(self.values, 1, 2)
        if self.block_scales is None:
            return ScaledOperand(values_t, None, self.global_scale)
        tile = NVFP4_BLOCK_SIZE  # a 16x16 tile: each of its rows repeats the tile's one scale
        assert self.block_size == tile, "only 16x16-tiled operands transpose exactly"
        tiles = self.block_scales[:, ::tile, :]  # [B, R/16, K/16]: one entry per tile
        scales_t = jnp.repeat(jnp.swapaxes(tiles, 1, 2), tile, axis=1)  # [B, K, R/16]
        return ScaledOperand(values_t, scales_t, self.global_scale)


def _fp4_values(packed: jax.Array, shape) -> jax.Array:
    """Packed E2M1 codes (element 2i in the low nibble) as float4_e2m1fn; bitcasting a byte to two
    float4 values yields [low, high], which is that order."""
    return lax.bitcast_convert_type(packed, jnp.float4_e2m1fn).reshape(shape)


def scaled_operand(q) -> ScaledOperand:
    """View a quantized array of logical shape ``[B, R, K]`` as a ScaledOperand (no value arithmetic)."""
    one = jnp.float32(1.0)
    if isinstance(q, numerics.NVFP4Array):
        global_scale = tensor_decode_scale(q.amax.astype(jnp.float32), q.e4m3_max)  # amax / 2688, correctly rounded
        return ScaledOperand(_fp4_values(q.packed, q.shape), q.scales, global_scale)
    if isinstance(q, numerics.MXArray):
        values = _fp4_values(q.data, q.shape) if q.element == "e2m1" else q.data
        return ScaledOperand(values, q.scales, one)
    if isinstance(q, numerics.FP8Array):
        return ScaledOperand(q.data, None, q.scale_inv.astype(jnp.float32))
    raise TypeError(f"not a quantized array: {type(q).__name__}")


def nvfp4_block_scaled_operand(
    x: jax.Array, *, block, rounding: str, key, hadamard: bool, tensor_amax=None, options=nvfp4.PLAIN
) -> ScaledOperand:
    """NVFP4-quantize x ``[B, R, K]`` straight into an emulated-GEMM operand, without packed codes.

    The values are ``e2m1 · s_b`` in bfloat16 (exact), formed in one elementwise pass after the amax pass
    (numerics.nvfp4_fused); they equal ``_bf16_values(scaled_operand(quantize(x, ...)))`` bit for bit, and
    the global scale is the same ``amax / 2688``, so the emulated product is unchanged. The block scales are
    already multiplied in (``block_scales`` is None), so the native backend never receives this operand.
    """
    values, amax = nvfp4_fused.quantize_block_scaled(
        x,
        block=block,
        rounding=rounding,
        key=key,
        hadamard=hadamard,
        dtype=jnp.bfloat16,
        tensor_amax=tensor_amax,
        options=options,
    )
    return ScaledOperand(values, None, tensor_decode_scale(amax, options.e4m3_max))


def resolve_backend(backend: str, device=None) -> str:
    """``auto`` -> ``native`` on devices with FP4 tensor cores (CUDA compute capability >= 10.0).

    ``device`` defaults to ``jax.devices()[0]``.
    """
    assert backend in BACKENDS, backend
    if backend != "auto":
        return backend
    device = jax.devices()[0] if device is None else device
    capability = getattr(device, "compute_capability", None)
    if device.platform == "gpu" and capability is not None and float(capability) >= 10.0:
        return "native"
    return "emulated"


def _native_config(op) -> tuple | None:
    if not isinstance(op, ScaledOperand) or op.block_scales is None:
        return None
    config = (op.values.dtype, op.block_scales.dtype, op.block_size)
    return config if config in _NATIVE_CONFIGS else None


def runs_natively(a, b) -> bool:
    """Whether ``matmul(a, b, backend="native")`` uses jax.nn.scaled_matmul for this operand pair."""
    config = _native_config(a)
    return config is not None and config == _native_config(b)


def _bf16_values(op: ScaledOperand) -> jax.Array:
    """``element · block_scale`` in bfloat16 (exact); the global scale is applied after the GEMM."""
    values = op.values.astype(jnp.bfloat16)
    if op.block_scales is None:
        return values
    block_size = op.values.shape[-1] // op.block_scales.shape[-1]
    return values * jnp.repeat(op.block_scales.astype(jnp.bfloat16), block_size, axis=-1)


def tn_dot(a: jax.Array, b: jax.Array) -> jax.Array:
    """``[B, Ra, K] x [B, Rb, K] -> [B, Ra, Rb]`` with float32 accumulation (bf16 products are exact)."""
    return _float32_dot(a, b, (((2,), (2,)), ((0,), (0,))))


def nn_dot(a: jax.Array, b: jax.Array) -> jax.Array:
    """``[Ra, K] x [K, Rb] -> [Ra, Rb]``: `tn_dot` with ``b`` given transposed, for an operand that is stored
    that way (the grouped GEMM's dgrad reads the fprop weight tiles as Wᵀ without moving them)."""
    return _float32_dot(a, b, (((1,), (0,)), ((), ())))


def ragged_dot(a: jax.Array, b: jax.Array, group_sizes: jax.Array, dimension_numbers) -> jax.Array:
    """``jax.lax.ragged_dot_general`` with float32 accumulation, its operands taken as `tn_dot` takes them: the
    grouped GEMM of a GPU or TPU (fp4lm.quant.grouped_gemm)."""
    a, b = _float32_operands(a, b)
    return lax.ragged_dot_general(
        a, b, group_sizes, dimension_numbers, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32
    )


def _float32_operands(a, b):
    """bf16 pairs stay (their products are exact in float32); anything else is multiplied in float32."""
    if not (a.dtype == b.dtype == jnp.bfloat16):
        return a.astype(jnp.float32), b.astype(jnp.float32)
    return a, b


def _float32_dot(a, b, dimension_numbers):
    a, b = _float32_operands(a, b)
    return lax.dot_general(a, b, dimension_numbers, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


def matmul(a, b, *, backend: str) -> jax.Array:
    """``Σ_k a[b,i,k] · b[b,j,k]`` in float32 for plain arrays or ScaledOperands (module docstring)."""
    if resolve_backend(backend) == "native" and runs_natively(a, b):
        out = jax.nn.scaled_matmul(
            a.values, b.values, a.block_scales, b.block_scales, preferred_element_type=jnp.float32
        )
        return out * output_scale(a.global_scale, b.global_scale)
    a, alpha_a = emulated_operand(a)
    b, alpha_b = emulated_operand(b)
    out = tn_dot(a, b)
    alpha = output_scale(alpha_a, alpha_b)
    return out if alpha is None else out * alpha


def output_scale(scale_a, scale_b):
    """What multiplies a ``[B, Ra, Rb]`` product: the operands' global scales (None: none), each a scalar or,
    row-scaled, one per row (``[B, Ra]`` along the output's rows, ``[B, Rb]`` along its columns)."""
    if scale_a is not None and jnp.ndim(scale_a):
        scale_a = scale_a[:, :, None]
    if scale_b is not None and jnp.ndim(scale_b):
        scale_b = scale_b[:, None, :]
    if scale_a is None or scale_b is None:
        return scale_b if scale_a is None else scale_a
    return scale_a * scale_b


def emulated_operand(op) -> tuple[jax.Array, jax.Array | None]:
    """What the emulated product multiplies: (``element · block_scale`` in bfloat16, the global scale) for a
    ScaledOperand, (the array, None) for a plain one. The grouped dot's weights (grouped.py) come from this, so
    its products are the dense path's."""
    if isinstance(op, ScaledOperand):
        return _bf16_values(op), op.global_scale
    return op, None
