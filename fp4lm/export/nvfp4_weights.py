"""The NVFP4 codes and scales of every quantized projection, as the forward pass computes them.

The forward pass quantizes a layer's weight from its bfloat16 copy, transposed to `[out, in]` (the fprop
GEMM's W, blocks along the input features), with the recipe's `fprop_w` spec: the nvfp4 recipes use
16x16 tiles (1x16 blocks for nvfp4_1d_weights and nvfp4_naive) with round-to-nearest-even, whose tile scale
is stored on each of its 16 rows (fp4lm.numerics.nvfp4). That is already a valid 1x16 layout: packed codes
`[out, in/2]`, one E4M3 scale per 16 consecutive inputs `[out, in/16]`, and the tensor amax. Written
unchanged, it is bit-exact.

4over6 (nvfp4_4over6) picks each tile's scale byte differently and decodes with amax / (6 · 256) instead of
amax / (6 · 448); its codes are still E2M1 x E4M3 block scale x one float32 global scale, so they are written
as they are, with that global scale. What the forward pass's weight is not NVFP4 in (`forward_spec` None: MX
or FP8 formats, stochastic rounding, the RHT, or one amax per row, which no single-global-scale format can
hold) is quantized here post-training with EXPORT_SPEC; the export says so (fp4lm.export.provenance).

Serving engines fuse q/k/v and gate/up into one GEMM each and want one global scale (amax / 2688) per
fused group. A run trained with `precision.shared_weight_scale` already quantized each group with its
shared amax, so its codes are written as they are. Otherwise fp4lm quantized each projection with its own
amax, and a group whose members' amaxes differ is quantized again here with the group's amax (the largest):
the members are stacked along their output axis (multiples of 16, so no tile straddles two of them) and
quantized as one tensor, exactly as the forward pass quantizes a group with a shared amax (the stacked
tensor's tiles are the members' tiles). `quantize_group` reports how far that moved the weights.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from fp4lm.errors import UserError
from fp4lm.numerics import nvfp4
from fp4lm.quant import Policy
from fp4lm.quant.recipes import QuantSpec

FUSED_GROUPS = (("attn.q", "attn.k", "attn.v"), ("mlp.gate", "mlp.up"), ("attn.o",), ("mlp.down",))
EXPORT_SPEC = QuantSpec(format="nvfp4", block=(16, 16))  # for layers the forward did not quantize as NVFP4


@dataclasses.dataclass
class QuantizedWeight:
    path: str  # fp4lm layer path, blocks.3.attn.q
    packed: np.ndarray  # uint8 [out, in/2], element 2i in the low nibble
    scales: np.ndarray  # float8_e4m3fn [out, in/16]
    amax: np.float32  # the tensor amax the codes were made with (shared within a fused group)
    e4m3_max: int  # 448, or 256 for 4over6: the global scale is amax / (6 · e4m3_max)

    @property
    def global_range(self) -> np.float32:
        """6 · e4m3_max: 2688, or 1536 for 4over6."""
        return nvfp4.global_range(self.e4m3_max)

    @property
    def global_decode_scale(self) -> np.float32:
        """amax / global_range, correctly rounded (ModelOpt's weight_scale_2)."""
        return np.float32(nvfp4.tensor_decode_scale(jnp.float32(self.amax), self.e4m3_max))


def forward_spec(policy: Policy, path: str) -> QuantSpec | None:
    """The spec the forward pass quantizes this layer's weight with, when an NVFP4 export can hold its codes
    as they are (one global scale, round-to-nearest, no RHT); None otherwise."""
    spec = policy.recipe_for(path).fprop_w
    if spec is None or spec.format != "nvfp4" or spec.stochastic or spec.hadamard or spec.row_scaled:
        return None
    return spec


def forward_weight(kernel: np.ndarray) -> jnp.ndarray:
    """The forward pass's W `[out, in]`: the float32 kernel `[in, out]` cast to bfloat16 and transposed."""
    return jnp.asarray(kernel.astype(ml_dtypes.bfloat16).T)


_quantize_nearest = jax.jit(
    functools.partial(nvfp4.quantize, rounding="nearest"), static_argnames=("block", "four_over_six", "e4m3_max")
)


def _quantize(weight: jnp.ndarray, spec: QuantSpec) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """(packed codes, block scales, amax) of `weight` under `spec`, as the forward pass quantizes it."""
    q = _quantize_nearest(weight, block=spec.block, four_over_six=spec.four_over_six, e4m3_max=spec.e4m3_max)
    return np.asarray(q.packed), np.asarray(q.scales), np.float32(q.amax)


@dataclasses.dataclass
class GroupChange:
    """How far re-quantizing a fused group with its shared amax moved its dequantized weights (relative
    Frobenius norms over the group), and, for scale, their NVFP4 error against the bf16 weights before."""

    change: float  # |after - before| / |before|; before = what the forward pass used
    error_before: float  # |before - bf16| / |bf16|: the forward pass's own quantization error


def _relative(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    difference = np.sqrt(sum(np.sum((a[p] - b[p]) ** 2) for p in b))
    norm = np.sqrt(sum(np.sum(b[p] ** 2) for p in b))
    return float(difference / norm) if norm > 0 else 0.0


def quantize_group(
    kernels: dict[str, np.ndarray], spec: QuantSpec | None, *, trained_shared: bool = False
) -> tuple[list[QuantizedWeight], GroupChange | None]:
    """The members of one fused group with one shared amax, and how far that moved the weights the forward
    pass used (None when nothing had to be re-quantized).

    `spec` None: the forward pass did not quantize these layers as NVFP4; they are quantized with 16x16
    tiles (post-training quantization) and the change is measured against their bfloat16 weights.
    `trained_shared`: the run trained with `precision.shared_weight_scale`, so the group's stacked
    quantization is the forward pass's own.
    """
    weights = {path: forward_weight(kernel) for path, kernel in kernels.items()}
    used = spec or EXPORT_SPEC
    stacked = _quantize(jnp.concatenate(list(weights.values()), axis=0), used)
    trained_with_stacked = spec is not None and trained_shared
    own = {} if trained_with_stacked else {path: _quantize(w, used) for path, w in weights.items()}
    forward_used_shared = trained_with_stacked or (spec is not None and len({q[2] for q in own.values()}) == 1)
    result, row = [], 0
    for path, weight in weights.items():
        rows = slice(row, row + weight.shape[0])
        row += weight.shape[0]
        result.append(QuantizedWeight(path, stacked[0][rows], stacked[1][rows], stacked[2], used.e4m3_max))
    if forward_used_shared:  # the forward pass's codes, unchanged
        return result, None
    bf16 = {path: np.asarray(w, np.float32) for path, w in weights.items()}
    before = bf16 if spec is None else {path: _dequantized(*own[path], used.e4m3_max) for path in weights}
    after = {q.path: _dequantized(q.packed, q.scales, q.amax, q.e4m3_max) for q in result}
    return result, GroupChange(change=_relative(after, before), error_before=_relative(before, bf16))


def _dequantized(packed, scales, amax, e4m3_max) -> np.ndarray:
    q = nvfp4.NVFP4Array(jnp.asarray(packed), jnp.asarray(scales), jnp.float32(amax), e4m3_max=e4m3_max)
    return np.asarray(q.dequantize())


def check_group_precision(policy: Policy, paths: list[str]) -> None:
    """A fused group must be all quantized or all bf16: a serving engine runs it as one GEMM."""
    quantized = {path: policy.recipe_for(path).is_quantized for path in paths}
    if len(set(quantized.values())) > 1:
        raise UserError(
            f"the fused group {', '.join(paths)} mixes quantized and bf16 layers, which a serving engine runs as one "
            "GEMM; export a run whose precision.rules keep q/k/v (and gate/up) in the same precision"
        )
