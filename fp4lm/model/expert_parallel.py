"""Expert parallelism: the routed experts of a MoE block split over the mesh's ``expert`` axis.

Placement. Each expert kernel [X, in, out] carries the logical axis "expert" on X, which
`fp4lm.sharding.LOGICAL_AXIS_RULES` maps to the mesh axis ``expert``: a device stores X / W experts (W =
mesh.expert). Everything else in the model treats ``expert`` as one more data axis: the batch is split over
data, fsdp and expert (`fp4lm.sharding.BATCH_AXES`), so attention, the dense MLPs and the router run on a
device's own tokens. The router and its top-k run outside, as global arrays. A MoE block runs this way when
the run's mesh (its config's, fp4lm.train.run_functions) has more than one device, mesh.expert or not (the
devices of an expert shard split its experts among themselves, below): chosen when the step is built
(`fp4lm.model.moe.set_expert_parallel`), never by what the traced batch happens to be. A batch whose tokens do
not split over the batch axes is refused before the run starts (fp4lm.train.validate.check_batch_splits).

Dispatch (`routed_experts`, a `jax.shard_map` over the whole mesh):

1. all-gather: every device gathers the tokens x [N, D] (bfloat16) and their routing (experts and weights
   [N, A]) of the whole batch, over the batch axes;
2. each device runs the experts it owns (below) over every pair of the batch routed to them: the pairs
   sorted by expert exactly as on one device (`routing.dispatch_order`, stable, in the batch's token order),
   then the experts (`experts.Experts`) on its slice of the kernels, with the slice's first global expert
   index (`grouped_dot(first_expert=...)`) so that stochastic rounding draws the bits one device would;
3. each device adds its pairs' weighted outputs into a float32 [N, D], and a reduce-scatter over the batch
   axes (plus a sum over ``tensor``) hands every device the sum for its own tokens.

Who runs what. The X / E experts of an expert shard are split further among the shard's devices along
data, fsdp and tensor (O of them, the owners): each runs ceil(X / (W·O)) consecutive experts, so every expert runs
exactly once, on one device, over all its tokens of the global batch. Its kernel gradient is summed over
those devices by the shard_map's transpose (the others contribute zeros), as for any replicated parameter.

Why this mechanism:
- Quantization as on one device. An expert's group of tokens is one quantized tensor: its amax over all its
  tokens from every device, its NVFP4 blocks and RHT runs along the tokens (wgrad) inside that one group,
  its stochastic-rounding bits indexed by the row in that group. That needs the whole group, in order, on
  one device. An all-to-all to the expert's shard gives it only the group's pieces from that shard's batch
  (an amax per data replica, blocks straddling pieces differently): sharded and unsharded runs would differ.
  Here 1 and 8 devices agree to float32 summation order (tests/model/test_expert_parallel.py).
- Static shapes and the CPU. Dropless routing sends a traced number of tokens to each device; the ragged
  all-to-all that moves exactly those (`jax.lax.ragged_all_to_all`) is not implemented by XLA:CPU
  ("HLO opcode ragged-all-to-all is not supported"), and a dense all-to-all needs a worst-case buffer per
  destination. The all-gather's shapes are static, and its receive buffer is the same on every backend.
- Sharding constraints on the one-device code (XLA placing it) partition the argsort and the grouped GEMM's
  loops badly: XLA replicates them and all-gathers the expert kernels, no expert parallelism at all.

The communication, per MoE block and step, honestly: forward, an all-gather of x (N·D bfloat16) and of the
routing (N·A int32 and float32) over the batch axes, then a reduce-scatter of y (N·D float32); backward,
the transposes (a reduce-scatter of dx, an all-gather of dy), plus the kernel gradients' all-reduce over
data, fsdp and tensor that a replicated parameter always has, and the all-gather of the kernels over fsdp
and tensor (kernels stay sharded at rest; each expert runs unsplit). A device receives the whole batch's
activations, (devices-1)/devices · N · D per block, where an all-to-all (Megatron's "alltoall" dispatcher, MaxText)
would move about (W-1)/W · N_local · A · D: the same volume when the devices, W and A are equal (Qwen3-30B-A3B
on 8 devices with mesh.expert=8), more than it as data parallelism grows.

Memory. Shapes are static, so a device's grouped GEMMs get the worst case of rows: dropless, N · min(A, experts
it runs) (every one of a token's A experts on the same device; on average a device gets N · A / (W·O)); with
model.capacity_factor c, at most its experts' capacities, about c · N · A / (W·O). Never [N, X, D]. Plus N · D
for the gathered tokens and for the float32 sum.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from fp4lm.errors import UserError
from fp4lm.model.experts import Experts
from fp4lm.model.routing import dispatch_order
from fp4lm.sharding import BATCH_AXES, MESH_AXES, is_fp4lm_mesh

OWNER_AXES = ("data", "fsdp", "tensor")
"""The axes along which an expert shard's devices split its experts among themselves."""


def expert_mesh(tokens: int) -> AbstractMesh:
    """The mesh the step is traced on, for a block built to run its experts split over it; an error when there
    is none with fp4lm's axes, or its batch axes do not share `tokens` evenly (train.validate's
    `check_batch_splits` refuses such a run before it starts)."""
    mesh = jax.sharding.get_abstract_mesh()
    if not is_fp4lm_mesh(mesh):
        raise UserError(
            "the experts were built to run split over the step's mesh, and the step has none; trace the model "
            "under fp4lm.sharding.on_mesh (or build it without expert parallelism)"
        )
    splits = math.prod(mesh.shape[axis] for axis in BATCH_AXES)
    if tokens % splits:
        raise UserError(
            f"expert parallelism: {tokens} tokens do not split over the {splits} devices of the batch axes; "
            f"make the batch's tokens a multiple of {splits}"
        )
    return mesh


def owned_experts(num_experts: int, mesh: AbstractMesh) -> tuple[int, int]:
    """(experts per shard, experts each device of a shard runs): X / W and ceil(X / (W · O))."""
    owners = math.prod(mesh.shape[axis] for axis in OWNER_AXES)
    runs = experts_per_device(num_experts, expert=mesh.shape["expert"], owners=owners)
    return num_experts // mesh.shape["expert"], runs


def experts_per_device(num_experts: int, *, expert: int, owners: int) -> int:
    """ceil(X / (W · O)): the experts each device runs, W = mesh.expert and O the devices of an expert shard
    (data · fsdp · tensor) that split its X / W experts among themselves."""
    return -(-(num_experts // expert) // owners)


def rows_bound(tokens: int, experts_per_token: int, runs: int, capacity: int | None) -> int:
    """Rows a device's grouped GEMMs need: a token picks A distinct experts, so at most min(A, runs) of its
    pairs go to the `runs` experts of one device; with a capacity, at most `runs` · capacity."""
    rows = tokens * min(experts_per_token, runs)
    return rows if capacity is None else min(rows, runs * capacity)


def routed_experts(
    mesh: AbstractMesh,
    experts: Experts,
    x_ND: jax.Array,
    weights_NA: jax.Array,
    experts_NA: jax.Array,
    kernels: tuple[jax.Array, ...],
    keys: tuple,
    *,
    capacity: int | None,
) -> tuple[jax.Array, dict]:
    """(float32 [N, D]: sum over the A choices of weights_NA · expert_{experts_NA}(x_ND), computed expert-parallel;
    per-expert telemetry, [X, ...] leaves, each expert's from the one device that ran it).

    `experts`: the block's `Experts`, run here on a device's slice of `kernels` (bfloat16 [X, in, out] of gate,
    up, down); `keys`: their layer keys (or None)."""
    tokens, experts_per_token = experts_NA.shape
    num_experts = kernels[0].shape[0]
    per_shard, runs = owned_experts(num_experts, mesh)
    rows = rows_bound(tokens, experts_per_token, runs, capacity)

    def on_device(local_x_ND, local_weights_NA, local_experts_NA, local_kernels, keys):
        x_ND = jax.lax.all_gather(local_x_ND, BATCH_AXES, axis=0, tiled=True)
        weights_NA = jax.lax.all_gather(local_weights_NA, BATCH_AXES, axis=0, tiled=True)
        experts_P = jax.lax.all_gather(local_experts_NA, BATCH_AXES, axis=0, tiled=True).reshape(-1)
        owner = jax.lax.axis_index(OWNER_AXES)
        own_start = owner * runs  # within the shard; past per_shard for an owner with nothing to run
        start = jnp.minimum(own_start, per_shard - runs)  # the kernel slice, kept inside the shard
        first = jax.lax.axis_index("expert") * per_shard + start
        slot_P = experts_P - first  # the pair's expert within the slice
        own_end = jnp.minimum(own_start + runs, per_shard) - start
        mine_P = (slot_P >= own_start - start) & (slot_P < own_end)
        order_P, group_sizes, _ = dispatch_order(jnp.where(mine_P, slot_P, runs), runs, capacity)
        order_R = order_P[:rows]
        sliced = tuple(jax.lax.dynamic_slice_in_dim(w, start, runs, axis=0) for w in local_kernels)
        y_RD, per_expert = experts(x_ND[order_R // experts_per_token], group_sizes, sliced, keys, first)
        kept_R = jnp.arange(rows) < jnp.sum(group_sizes)
        weight_R = jnp.where(kept_R, weights_NA.reshape(-1)[order_R], 0.0)
        token_R = order_R // experts_per_token
        y_ND = jnp.zeros(x_ND.shape, jnp.float32).at[token_R].add(weight_R[:, None] * y_RD.astype(jnp.float32))
        local_y_ND = jax.lax.psum_scatter(y_ND, BATCH_AXES, scatter_dimension=0, tiled=True)
        runs_here = (jnp.arange(runs) >= own_start - start) & (jnp.arange(runs) < own_end)
        per_expert = jax.tree.map(lambda v: _to_all_experts(v, runs_here, first, num_experts), per_expert)
        return jax.lax.psum(local_y_ND, "tensor"), per_expert  # the tensor axis's devices ran different experts

    batch = P(BATCH_AXES, None)
    sharded = jax.shard_map(
        on_device,
        mesh=mesh,
        in_specs=(batch, batch, batch, P("expert", None, None), P()),
        out_specs=(batch, P()),
        check_vma=False,  # the grouped GEMM's lax.cond/switch branches make zeros that no device varies
    )
    return sharded(x_ND, weights_NA, experts_NA, kernels, keys)


def _to_all_experts(values: jax.Array, runs_here: jax.Array, first: jax.Array, num_experts: int) -> jax.Array:
    """[X, ...] on every device: ``values`` [runs, ...] of the experts first, first + 1, ... that this device
    ran (`runs_here`; a clamped slice repeats some another device runs), zeros for all others, summed over
    the mesh, where each expert runs on exactly one device."""
    mask = runs_here.reshape(-1, *(1,) * (values.ndim - 1))
    mine = jnp.where(mask, values, jnp.zeros((), values.dtype))  # not a product: NaN · 0 would be NaN
    placed = jax.lax.dynamic_update_slice_in_dim(
        jnp.zeros((num_experts, *values.shape[1:]), values.dtype), mine, first, 0
    )
    return jax.lax.psum(placed, MESH_AXES)
