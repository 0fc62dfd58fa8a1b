"""`precision.fp4_param_gather`: under FSDP, devices gather a weight's NVFP4 codes and tile scales, not its
bf16 values.

Under FSDP a kernel lives in shards, split along its ``embed`` axis over the mesh's fsdp and expert axes, and
every step gathers it whole for the GEMM. A recipe whose forward and dgrad GEMMs read one 16x16-tiled NVFP4
copy of the weight (`Recipe.shares_weight_tiles`) needs nothing else of it: the 4-bit codes and one E4M3
scale per tile. Once the per-tensor amax is known, quantization is elementwise within each tile, so each
device quantizes the tiles of its own shard, after one all-reduce of the scalar amax (exactly the amax of the
whole weight, so the codes are those of the gathered weight), and the devices gather

    4 bits per weight (packed codes) + 8 bits per 256 weights (one scale byte per tile) = 4.03 bits

instead of 16 (bf16) or 32 (the float32 master, which XLA:CPU gathers): 3.97x and 7.9x fewer bytes. The tile
scale is gathered once per tile and repeated onto its 16 rows afterwards (the stored layout repeats it per row,
`nvfp4.NVFP4Array`). XLA:CPU widens the E4M3 scales to f16 in the collective, as it widens bf16 to f32; a
GPU sends them as bytes.

Sharding constraints change where values are computed, never what they are, so training is bit-identical
with the flag on and off. The forward saves the quantized shards for the backward, where the dgrad GEMM
gathers the same tiles again in 4 bits and reads their transpose (as FSDP gathers a weight again for the
backward). The weight gradient is not touched: its reduce-scatter (an all-reduce on XLA:CPU) stays in the
gradient's precision.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from fp4lm.numerics.nvfp4 import NVFP4Array

TILE = 16


@dataclass(frozen=True)
class WeightGather:
    """A weight's two placements: as its shards live (`sharded`) and as the GEMM reads it (`gathered`, the
    same spec without the FSDP axes), each a PartitionSpec of the weight in the caller's layout."""

    sharded: PartitionSpec
    gathered: PartitionSpec

    def permuted(self, order: tuple[int, ...], ndim: int) -> WeightGather:
        """The two specs of the weight transposed by `order` (a permutation of its `ndim` axes)."""

        def permute(spec: PartitionSpec) -> PartitionSpec:
            entries = tuple(spec) + (None,) * (ndim - len(spec))
            return PartitionSpec(*(entries[axis] for axis in order))

        return WeightGather(permute(self.sharded), permute(self.gathered))

    def on_shards(self, q: NVFP4Array) -> NVFP4Array:
        """`q`, a quantized weight [..., N, K] of 16x16 tiles in this layout, computed where its shards live."""
        assert q.block == (TILE, TILE) and not q.row_scaled, (q.block, q.row_scaled)
        constrain = jax.lax.with_sharding_constraint
        return dataclasses.replace(
            q, packed=constrain(q.packed, self.sharded), scales=constrain(q.scales, self.sharded)
        )

    def gather(self, q: NVFP4Array) -> NVFP4Array:
        """`q` on its shards (`on_shards`), gathered as the GEMM reads it: the codes as packed bytes, the E4M3
        scales once per tile, repeated onto the tile's rows afterwards."""
        q = self.on_shards(q)
        packed = jax.lax.with_sharding_constraint(q.packed, self.gathered)
        tile_scales = jax.lax.with_sharding_constraint(q.scales[..., ::TILE, :], self.gathered)
        scales = jnp.repeat(tile_scales, TILE, axis=-2)
        return dataclasses.replace(q, packed=packed, scales=scales)
