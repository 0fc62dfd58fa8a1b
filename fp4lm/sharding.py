"""Device mesh and the one logical-axis table that places every array on it.

The mesh has four axes:
- ``data``: pure data parallelism (parameters replicated);
- ``fsdp``: data parallelism with parameters (and optimizer state) sharded along their ``embed`` axis;
- ``expert``: a mixture-of-experts model's experts split across devices (fp4lm.model.expert_parallel); the
  rest of the model treats it as one more fsdp axis (as MaxText does): the batch is split over data, fsdp and
  expert, and the other parameters along their ``embed`` axis over fsdp and expert (an expert kernel, whose
  expert axis takes it, along fsdp only);
- ``tensor``: heads, MLP width and vocabulary split across devices (Megatron-style).

Parameters carry *logical* axis names (``("embed", "mlp")``, ...) as their flax ``out_sharding`` metadata
(see fp4lm/model/layers.py); `LOGICAL_AXIS_RULES` maps each name to mesh axes. Nothing else in the code
names a mesh axis for a parameter.

Under jit, XLA's SPMD partitioner turns global operations on sharded arrays into local work plus
collectives, so ``jnp.max(jnp.abs(x))`` over a sharded tensor is the *global* amax. That is what makes a
sharded run quantize exactly as an unsharded one (tests/model/test_sharded_model.py checks it). Where
XLA's own choice is wrong, the step pins it down: it is traced on the mesh (`on_mesh`), and each block keeps
its input split by batch rows (`batch_sharded`), so FSDP gathers weights, not activations.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from fp4lm.config import MeshConfig
from fp4lm.errors import UserError

MESH_AXES = ("data", "fsdp", "expert", "tensor")
BATCH_AXES = ("data", "fsdp", "expert")
"""The mesh axes the batch is split over, in the order of its rows."""
FSDP_AXES = ("fsdp", "expert")
"""The mesh axes a parameter's ``embed`` axis is sharded over: what FSDP gathers for each step."""

LOGICAL_AXIS_RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": BATCH_AXES,
    "length": None,
    "embed": FSDP_AXES,
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "vocab": "tensor",
    "norm": None,
    "expert": "expert",
}


def mesh_shape(mesh_cfg: MeshConfig, num_devices: int) -> tuple[int, int, int, int]:
    """(data, fsdp, expert, tensor) sizes (MESH_AXES) with a -1 entry resolved to the rest of the devices.

    The sizes themselves (positive, at most one -1, mesh.expert never -1) are checked once, by
    `fp4lm.config.validate`."""
    sizes = [getattr(mesh_cfg, axis) for axis in MESH_AXES]
    described = ", ".join(f"mesh.{axis}={size}" for axis, size in zip(MESH_AXES, sizes, strict=True))
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if num_devices % known:
            raise UserError(
                f"{described}: the fixed sizes ({known}) do not divide the {num_devices} devices; "
                f"choose sizes whose product divides {num_devices}"
            )
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise UserError(
            f"{described} multiply to {math.prod(sizes)} but there are {num_devices} devices; "
            f"make mesh.data * mesh.fsdp * mesh.expert * mesh.tensor = {num_devices} (or set one of data, fsdp, "
            "tensor to -1)"
        )
    data, fsdp, expert, tensor = sizes
    return data, fsdp, expert, tensor


# jax.Device is an alias of jaxlib's compiled Device class, which has no type stub; pyright sees a variable.
def all_devices() -> list[jax.Device]:  # pyright: ignore[reportInvalidTypeForm]
    """Every device of every host; a platform that cannot start (JAX_PLATFORMS=cuda without a GPU) is a UserError.

    JAX reports such a platform with a bare AssertionError (or a RuntimeError naming a missing library).
    """
    try:
        return jax.devices()
    except (AssertionError, RuntimeError) as error:
        raise UserError(describe_platform_failure(os.environ.get("JAX_PLATFORMS", ""), error)) from None


def describe_platform_failure(requested: str, error: BaseException) -> str:
    """One line: the platform asked for, why it did not start, what is available and the fix."""
    reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else "JAX found no such device"
    asked = f"JAX_PLATFORMS={requested}" if requested else "the default JAX platform"
    return (
        f"{asked} could not be started ({reason}); available here: {', '.join(_available_platforms())}; "
        "unset JAX_PLATFORMS (or set JAX_PLATFORMS=cpu), or install the jax plugin for that device "
        "(e.g. pip install 'jax[cuda12]') on a machine that has one"
    )


def _available_platforms() -> list[str]:
    """Platforms this installation can start: cpu always, cuda/rocm/tpu when their jax plugin is installed."""
    import importlib.util

    plugins = {
        "cuda": ("jax_cuda12_plugin", "jax_cuda13_plugin"),
        "rocm": ("jax_rocm60_plugin", "jax_rocm7_plugin"),
        "tpu": ("libtpu",),
    }
    found = [name for name, modules in plugins.items() if any(importlib.util.find_spec(m) for m in modules)]
    return ["cpu", *(f"{name} (plugin installed, but no device started)" for name in found)]


def make_mesh(
    mesh_cfg: MeshConfig,
    devices: Sequence[jax.Device] | None = None,  # pyright: ignore[reportInvalidTypeForm] - see all_devices
) -> Mesh:
    """A Mesh with axes MESH_AXES over `devices` (default: all devices of all hosts)."""
    auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    if devices is None:  # let jax order the devices for the physical topology
        return jax.make_mesh(mesh_shape(mesh_cfg, len(all_devices())), MESH_AXES, axis_types=auto)
    devices = list(devices)
    shape = mesh_shape(mesh_cfg, len(devices))
    return Mesh(np.asarray(devices, dtype=object).reshape(shape), MESH_AXES, axis_types=auto)


def logical_to_spec(
    names: Sequence[str | None], mesh: Mesh | AbstractMesh, shape: Sequence[int] | None = None
) -> PartitionSpec:
    """The PartitionSpec for an array whose dimensions have these logical names.

    With `shape`, a dimension the mesh axes do not divide evenly falls back to replicated (that
    dimension only) instead of failing; e.g. a vocabulary of 2047 on tensor=2 stays whole. A mesh axis
    is used at most once per array (a later dimension that asks for it again is replicated).
    """
    used: set[str] = set()
    spec = []
    for dim, name in enumerate(names):
        if name is not None and name not in LOGICAL_AXIS_RULES:
            raise AssertionError(f"logical axis {name!r} has no rule; add it to LOGICAL_AXIS_RULES")
        target = None if name is None else LOGICAL_AXIS_RULES[name]
        axes = () if target is None else ((target,) if isinstance(target, str) else tuple(target))
        axes = tuple(a for a in axes if a not in used and mesh.shape[a] > 1)
        if shape is not None and axes and shape[dim] % math.prod(mesh.shape[a] for a in axes):
            axes = ()
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*spec)


def is_fp4lm_mesh(mesh: Mesh | AbstractMesh) -> bool:
    """Whether `mesh` (a context mesh, possibly empty) has fp4lm's axes: the one the step is traced on."""
    return not mesh.empty and tuple(mesh.axis_names) == MESH_AXES


def fsdp_placements(
    names: Sequence[str | None], shape: Sequence[int], mesh: Mesh | AbstractMesh, *, tile: int, where: str
) -> tuple[PartitionSpec, PartitionSpec] | None:
    """A parameter's spec on `mesh` and the same without the FSDP axes, as a GEMM reads it; None when `mesh` is
    not fp4lm's (an empty context mesh) or nothing of the parameter is sharded over FSDP. Every shard must hold
    whole `tile` x `tile` tiles (precision.fp4_param_gather quantizes them there): a UserError naming `where`
    otherwise."""
    if not is_fp4lm_mesh(mesh):
        return None
    spec = logical_to_spec(names, mesh, shape)
    entries = [() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in spec]
    gathered = [tuple(a for a in axes if a not in FSDP_AXES) for axes in entries]
    if gathered == entries:
        return None
    for size, axes in zip(shape, entries, strict=True):
        shards = math.prod(mesh.shape[a] for a in axes)
        if (size // shards) % tile:
            raise UserError(
                f"{where}: precision.fp4_param_gather quantizes each shard of the weight {tuple(shape)}, but "
                f"{size} / {shards} (mesh {' * '.join(axes)}) is not a whole number of {tile}x{tile} tiles; "
                "choose mesh sizes whose shards are multiples of 16, or set precision.fp4_param_gather=false"
            )
    return spec, PartitionSpec(*(None if not a else a[0] if len(a) == 1 else a for a in gathered))


def fsdp_gathered(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """The parameter `x` (logical axes `names`) gathered over the FSDP axes of the context mesh before use, as
    FSDP means it: left to itself, XLA may instead move the activations to the weight's FSDP split, in a
    reshard it can only do by replicating them ("[SPMD] Involuntary full rematerialization": the embedding's
    gradient, a scatter into a table split over fsdp, did so). No-op without fp4lm's mesh in context."""
    placements = fsdp_placements(names, x.shape, jax.sharding.get_abstract_mesh(), tile=1, where="")
    return x if placements is None else jax.lax.with_sharding_constraint(x, placements[1])


def logical_to_sharding(names: Sequence[str | None], mesh: Mesh, shape: Sequence[int] | None = None) -> NamedSharding:
    """NamedSharding for logical axis `names` on `mesh` (see `logical_to_spec` for the fallback)."""
    return NamedSharding(mesh, logical_to_spec(names, mesh, shape))


def _variable_sharding(variable: nnx.Variable, mesh: Mesh) -> NamedSharding:
    value = variable.get_value()
    names = variable.get_metadata().get("out_sharding") or (None,) * len(value.shape)
    return logical_to_sharding(names, mesh, value.shape)


def model_shardings(model_or_state, mesh: Mesh):
    """NamedShardings with the structure of `nnx.state(model)` (works on abstract models too).

    Each Variable is replaced by one holding its NamedSharding, so the result can be used as
    `jax.device_put` target or as jit in/out shardings for the model's state.
    """
    state = model_or_state if isinstance(model_or_state, nnx.State) else nnx.state(model_or_state)
    return jax.tree.map(
        lambda v: v.replace(_variable_sharding(v, mesh)),
        state,
        is_leaf=lambda x: isinstance(x, nnx.Variable),
    )


def on_mesh(forward: Callable, mesh: Mesh) -> Callable:
    """`forward` traced with `mesh` as the context mesh: the one `batch_sharded`, a MoE block's expert parallelism
    (fp4lm.model.expert_parallel) and precision.fp4_param_gather place their arrays on."""

    def forward_on_mesh(*args, **kwargs):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return forward(*args, **kwargs)

    return forward_on_mesh


def batch_sharded(x: jax.Array) -> jax.Array:
    """`x` [B, ...] kept split along its rows over BATCH_AXES of the context mesh, as data parallelism and FSDP
    mean it: each device computes on its own rows and the weights come to it. Left to itself, XLA may gather
    the activations instead and reduce partial products over the weights' shards (a scanned 125M model on
    mesh.fsdp=8: 10x the all-gathered bytes and 43x the all-reduced ones). No-op without fp4lm's mesh in
    context, or when its batch shards do not divide B (the end-of-run sample's one sequence)."""
    mesh = jax.sharding.get_abstract_mesh()
    if not is_fp4lm_mesh(mesh) or x.shape[0] % math.prod(mesh.shape[a] for a in BATCH_AXES):
        return x
    return jax.lax.with_sharding_constraint(x, PartitionSpec(BATCH_AXES, *(None,) * (x.ndim - 1)))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Token batches [B, T]: batch split over data, fsdp and expert (BATCH_AXES), positions whole."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, None))
