"""`fp4lm train CONFIG --dry-run`: compile one training step for the configured mesh, allocating nothing.

What a user checks before renting a cluster: does the step compile for this mesh, how much memory does each
device need, how many FLOPs is a step, how many bytes does each device send per step and through which
collectives (fp4lm.train.collectives), how is each parameter sharded, and which precision does each layer run.
`--json` prints all of it as one JSON object.

How: the model, the optimizer state and the train state exist only as shapes (`build_run` evaluates their
initialisers with `jax.eval_shape`), each leaf carrying the NamedSharding the trainer would give it. The real
train step (`RunFunctions`, the one the trainer runs, jitted with its shardings) is lowered on these
abstract inputs and compiled by XLA for the mesh. No parameter, batch or activation is ever allocated, so a
405B configuration checks on a laptop; on a CPU, `XLA_FLAGS=--xla_force_host_platform_device_count=N`
stands in for N devices.

The figures come from the compiled program of one device (SPMD: every device runs the same program on its
shards): `memory_analysis()` (arguments, outputs, temporaries: the activations kept for the backward pass,
gradients and work buffers) and `cost_analysis()` (XLA's FLOP count), beside fp4lm's own analytic FLOPs
(fp4lm.flops, MaxText's accounting) and memory estimate (fp4lm.train.memory). XLA's CPU backend plans memory
and counts FLOPs for a CPU: a GPU compilation fuses differently, so take the figures as the CPU program's.

The config is the one `fp4lm train` would train (fp4lm.train.run_dir.resolve_train_config: an existing run's
saved config as the base, train.init_from's model), and train.run_dir is checked as train checks it (a refused
directory, an override a resumed run cannot take); nothing is written there.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding

from fp4lm.config import Config
from fp4lm.errors import UserError
from fp4lm.flops import training_flops_per_step
from fp4lm.linear_layers import model_parameters
from fp4lm.model.expert_parallel import owned_experts
from fp4lm.model.memory_estimate import estimate_training_memory
from fp4lm.project.plan import Plan
from fp4lm.quant import Policy
from fp4lm.sharding import MESH_AXES, all_devices, batch_sharding, make_mesh
from fp4lm.train import model_setup
from fp4lm.train.collectives import Volume, collective_volume
from fp4lm.train.run_functions import RunFunctions
from fp4lm.train.setup import RunSetup, build_run
from fp4lm.train.validate import check_config_for_training, fp4_gathered_on_mesh, fp4_param_gather_note

Print = Callable[[str], None]


def check_mesh_fits(config: Config, num_devices: int) -> None:
    """A mesh whose fixed sizes need more devices than there are is refused, saying how to stand in for them."""
    sizes = {axis: getattr(config.mesh, axis) for axis in MESH_AXES}
    needed = math.prod(size for size in sizes.values() if size != -1)
    if needed > num_devices:
        described = ", ".join(f"mesh.{axis}={size}" for axis, size in sizes.items())
        raise UserError(
            f"--dry-run: the mesh ({described}) needs {needed} devices but {num_devices} "
            f"{'is' if num_devices == 1 else 'are'} visible; shrink the "
            f"mesh, or on a CPU stand in for {needed} devices with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={needed} set before fp4lm starts"
        )


def abstract_batch(config: Config, sharding: NamedSharding) -> dict:
    """The shapes of one global batch as the data pipeline gives it, laid out as the trainer lays it out."""
    shape = (config.train.batch_size, config.data.seq_len)
    names = ["inputs", "targets"] + (["segment_ids", "positions"] if config.data.document_masking else [])
    return {name: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding) for name in names}


def _shard_bytes(tree) -> int:
    """Bytes one device holds of the abstract arrays of `tree` (each with its sharding)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shard = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
        total += math.prod(shard) * jnp.dtype(leaf.dtype).itemsize
    return total


def _gib(n: float) -> str:
    if n >= 2**27:
        return f"{n / 2**30:,.2f} GiB"
    if n < 2**10:
        return f"{n:,.0f} B"
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n / 2**10:,.1f} KiB"


def _flops(n: float) -> str:
    return f"{n:.3e} FLOPs"


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    parts, start = [], indices[0]
    for previous, current in zip(indices, [*indices[1:], None], strict=True):
        if current != previous + 1:
            parts.append(f"{start}" if start == previous else f"{start}-{previous}")
            start = current
    return ",".join(parts)


def group_by_block(rows: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(name, description) rows, with the rows of blocks.<i>.X that describe alike merged into blocks.[0-31].X
    (in order of first appearance; a block alone keeps its name)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for name, description in rows:
        match = re.match(r"blocks\.(\d+)\.(.*)", name)
        key = (f"blocks.[{{}}].{match.group(2)}", description) if match else (name, description)
        groups.setdefault(key, []).append(int(match.group(1)) if match else -1)
    merged = []
    for (name, description), indices in groups.items():
        if "{}" in name:  # a single block keeps its plain name
            name = name.replace("[{}]", str(indices[0])) if len(indices) == 1 else name.format(_ranges(indices))
        merged.append((name, description))
    return merged


def _table(rows: list[tuple[str, str]], indent: str = "  ") -> list[str]:
    width = max(len(name) for name, _ in rows)
    return [f"{indent}{name:<{width}}  {description}" for name, description in rows]


def parameter_shardings(setup: RunSetup) -> list[tuple[str, str]]:
    """(parameter path, "[shape] (logical axes) -> (mesh axes)") for every parameter of the model."""
    rows = []
    for path, variable in nnx.to_flat_state(nnx.state(setup.model, nnx.Param)):
        value = variable.get_value()
        names = variable.get_metadata().get("out_sharding") or (None,) * len(value.shape)
        sharding: Any = setup.state_shardings.params
        for part in path:
            sharding = sharding[part]
        shape = "x".join(str(s) for s in value.shape)
        logical = ", ".join(str(n) for n in names)
        mesh_axes = ", ".join(str(a) for a in sharding.spec) if any(a is not None for a in sharding.spec) else ""
        rows.append((".".join(str(p) for p in path), f"[{shape}] ({logical}) -> ({mesh_axes or 'replicated'})"))
    return rows


def moe_fields(m, vocab_size: int, mesh) -> dict[str, Any]:
    """The mixture of experts as --json gives it: which blocks, experts and top-k, the router, how the experts
    are spread over the mesh, and the parameters a token uses against those held
    (fp4lm.linear_layers.model_parameters, the count `fp4lm project` uses too)."""
    counts = model_parameters(m, vocab_size)
    per_shard, per_device = owned_experts(m.num_experts, mesh)
    return {
        "moe_blocks": [index for index in range(m.num_layers) if m.is_moe_block(index)],
        "experts": m.num_experts,
        "experts_per_token": m.experts_per_token,
        "shared_experts": m.num_shared_experts,
        "expert_width": m.resolved_moe_mlp_dim,
        "router_score": m.router_score,
        "router_renormalize": m.router_renormalize,
        "capacity_factor": m.capacity_factor,  # None: dropless
        "expert_parallel": mesh.shape["expert"],
        "experts_per_expert_shard": per_shard,  # mesh.expert splits the experts into shards of this many
        "experts_per_device": per_device,  # the devices of a shard split its experts further
        "parameters": counts.held,
        "active_parameters": counts.active,  # per token
        "active_fraction": counts.active / counts.held,
    }


def moe_line(fields: dict[str, Any]) -> str:
    """`moe_fields` in one line, for the text output."""
    f = fields
    shared = f", {f['shared_experts']} shared" if f["shared_experts"] else ""
    weights = "renormalised" if f["router_renormalize"] else "not renormalised"
    capacity = "dropless" if f["capacity_factor"] is None else f"capacity factor {f['capacity_factor']:g}"
    return (
        f"experts: blocks {_ranges(f['moe_blocks'])} each route every token to {f['experts_per_token']} of "
        f"{f['experts']} experts of width {f['expert_width']}{shared} ({f['router_score']} router, top-k "
        f"weights {weights}, {capacity}), {f['experts_per_device']} per device (mesh.expert="
        f"{f['expert_parallel']}); {f['active_parameters']:,} active parameters per token of "
        f"{f['parameters']:,} ({100 * f['active_fraction']:.1f}%)"
    )


def _scan_caveat(m) -> str:
    """XLA's cost analysis counts the body of a loop once, not once per iteration: with scanned layers its
    figure leaves out all but one block of each scan group (measured: 7.6e13 against 8.4e14 analytic for
    Llama 3 8B), so the analytic figure is the step's."""
    if not m.resolved_scan_layers:
        return ""
    return (
        " (model.scan_layers: XLA counts each scanned group's block once, not once per layer; use the analytic figure)"
    )


def _cost_flops(compiled) -> float | None:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per program
        cost = cost[0] if cost else None
    return None if not cost or "flops" not in cost else float(cost["flops"])


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """Bytes one device needs for the compiled step."""

    params: int  # this device's shards of the float32 master weights
    optimizer: int  # ... of the optimizer state
    arguments: int  # the compiled program's inputs: train state and batch
    outputs: int
    aliased: int  # outputs written into donated input buffers
    temp: int  # activations kept for backward, gradients, work buffers

    @property
    def peak(self) -> int:
        return self.arguments + self.outputs - self.aliased + self.temp

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("parameters", f"{_gib(self.params)}  (float32 master weights: this device's shards)"),
            ("optimizer state", f"{_gib(self.optimizer)}  (AdamW moments: this device's shards)"),
            ("arguments", f"{_gib(self.arguments)}  (train state and batch)"),
            ("outputs", f"{_gib(self.outputs)}  ({_gib(self.aliased)} of them in the donated state's buffers)"),
            ("activations, temp", f"{_gib(self.temp)}  (kept for backward, gradients, work buffers)"),
            ("peak", f"{_gib(self.peak)}  (arguments + outputs not aliased + temp)"),
        ]


def _device_memory(compiled, state) -> DeviceMemory | None:
    analysis = compiled.memory_analysis()
    if analysis is None:  # a backend without memory analysis
        return None
    return DeviceMemory(
        params=_shard_bytes(state.params),
        optimizer=_shard_bytes(state.opt_state),
        arguments=int(analysis.argument_size_in_bytes),
        outputs=int(analysis.output_size_in_bytes),
        aliased=int(analysis.alias_size_in_bytes),
        temp=int(analysis.temp_size_in_bytes),
    )


@dataclasses.dataclass(frozen=True)
class DryRun:
    """What the dry run found: the figures it prints, and all of it as `report` (what --json prints)."""

    compile_s: float
    memory: DeviceMemory | None
    analytic_flops: float  # the whole step, fp4lm.flops
    xla_flops_per_device: float | None
    collectives: Volume | str  # a reason where the program's collectives could not be read
    report: dict[str, Any]


def collective_rows(volume: Volume) -> list[tuple[str, str]]:
    """Per kind, the bytes a device sends per step and their split by dtype (fp4lm.train.collectives)."""
    rows = []
    for kind, entry in volume.as_dict().items():
        dtypes = ", ".join(f"{dtype} {_gib(n)}" for dtype, n in entry["by_dtype"].items())
        rows.append((kind, f"{_gib(entry['bytes'])} in {entry['count']:,} calls ({dtypes})"))
    return rows + [("total", _gib(volume.total))] if rows else [("none", "every array the step uses is local")]


def dry_run(config: Config, *, out: Print = print, as_json: bool = False, plan: Plan | None = None) -> DryRun:
    """Compiles one training step of `config` on abstract inputs and prints what it needs (as one JSON object
    with `as_json`), and `plan` (`fp4lm train --dry-run --plan`) after it."""
    devices = all_devices()
    check_mesh_fits(config, len(devices))
    check_config_for_training(config)
    policy = Policy.from_config(config)
    mesh = make_mesh(config.mesh)
    gathered_in_fp4 = fp4_gathered_on_mesh(config, policy, mesh)
    gather_note = fp4_param_gather_note(config, policy, mesh, gathered_in_fp4)
    started = time.perf_counter()
    setup = build_run(config, mesh, policy)  # shapes only (jax.eval_shape)
    batches = batch_sharding(mesh)
    functions = RunFunctions.build(setup, policy)  # the trainer's own step
    state = setup.restore_target()
    lowered = functions.train_step.lower(state, abstract_batch(config, batches))
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    compiled_at = time.perf_counter()

    m, vocab, accum = config.model, setup.model.vocab_size, config.train.grad_accum_steps
    num_devices = mesh.devices.size
    params = model_setup.count_params(state.params)
    memory = _device_memory(compiled, state)
    data, fsdp, expert, tensor = (mesh.shape[axis] for axis in ("data", "fsdp", "expert", "tensor"))
    estimate = estimate_training_memory(config, (data, fsdp * expert, tensor))  # expert shards as fsdp does
    analytic = training_flops_per_step(m, vocab, config.data.seq_len, config.train.batch_size)
    xla_flops = _cost_flops(compiled)
    try:
        volume: Volume | str = collective_volume(compiled.as_text() or "", num_devices)
    except ValueError as error:  # a spelling of XLA's this reader does not know: say so, count nothing
        volume = f"not counted: {error}"
    shardings = parameter_shardings(setup)
    layers = policy.assignments(setup.paths)
    report: dict[str, Any] = {
        "model": {
            "num_layers": m.num_layers,
            "d_model": m.d_model,
            "num_heads": m.num_heads,
            "num_kv_heads": m.num_kv_heads,
            "mlp_dim": m.mlp_dim,
            "vocab_size": vocab,
            "parameters": params,
        },
        "experts": moe_fields(m, vocab, mesh) if m.num_experts else None,
        "mesh": {**dict(mesh.shape), "devices": num_devices, "platform": devices[0].platform},
        "batch": {"size": config.train.batch_size, "seq_len": config.data.seq_len, "micro_batches": accum},
        "compile_s": {"total": compiled_at - started, "xla": compiled_at - lowered_at},
        "memory_per_device": None if memory is None else {**dataclasses.asdict(memory), "peak": memory.peak},
        "memory_estimate": dataclasses.asdict(estimate) | {"total": estimate.total},
        "flops_per_step": {
            "analytic": analytic.total,
            "analytic_per_device": analytic.total / num_devices,
            "analytic_parts": {
                "linear": analytic.linear,
                "router": analytic.router,
                "attention": analytic.attention,
                "lm_head": analytic.lm_head,
            },
            "xla_per_device": xla_flops,
        },
        "collectives": volume if isinstance(volume, str) else volume.as_dict(),
        "parameter_shardings": dict(shardings),
        "precision": {
            "summary": policy.summary(setup.paths),
            "layers": layers,
            # precision.fp4_param_gather: the layers whose weights cross the mesh in 4 bits, and why none do
            "fp4_param_gather": {"layers": [layer.path for layer in gathered_in_fp4], "note": gather_note},
        },
        **({"plan": plan.as_json()} if plan is not None else {}),
    }
    result = DryRun(compiled_at - started, memory, analytic.total, xla_flops, volume, report)
    if as_json:
        out(json.dumps(report, indent=1))
        return result

    mesh_text = ", ".join(f"{name}={size}" for name, size in mesh.shape.items())
    out("fp4lm train --dry-run: one training step compiled, nothing allocated, nothing written")
    out(
        f"model: {m.num_layers} layers, d_model {m.d_model}, {m.num_heads} heads ({m.num_kv_heads} kv), "
        f"mlp {m.mlp_dim}, vocab {vocab}: {params:,} parameters"
    )
    if m.num_experts:
        out(moe_line(report["experts"]))
    out(
        f"mesh: {mesh_text} ({num_devices} {devices[0].platform} devices); global batch {config.train.batch_size} "
        f"x {config.data.seq_len} tokens in {accum} micro-batch{'es' if accum > 1 else ''}"
    )
    out(
        f"compile: {compiled_at - started:.1f} s (abstract state and lowering {lowered_at - started:.1f} s, "
        f"XLA compilation {compiled_at - lowered_at:.1f} s)"
    )
    out("")
    out("memory per device (the compiled step's memory analysis):")
    out("\n".join(_table(memory.rows())) if memory is not None else "  not available on this backend")
    out(
        f"  fp4lm's estimate (fp4lm.train.memory): {_gib(estimate.total)} = state {_gib(estimate.state)} + "
        f"activations {_gib(estimate.activations)} + logits {_gib(estimate.logits)}"
    )
    out("")
    out("FLOPs per step:")
    out(
        f"  analytic (fp4lm.flops, MaxText's accounting): {_flops(analytic.total)} in all, "
        f"{_flops(analytic.total / num_devices)} per device (linear {analytic.linear:.3e}, "
        + (f"router {analytic.router:.3e}, " if analytic.router else "")
        + f"attention {analytic.attention:.3e}, LM head {analytic.lm_head:.3e})"
    )
    if xla_flops is not None:
        out(f"  XLA's cost analysis of the compiled step: {_flops(xla_flops)} per device{_scan_caveat(m)}")
    out("")
    out("collectives: bytes each device sends per step (ring algorithms; fp4lm.train.collectives)")
    out(f"  {volume}" if isinstance(volume, str) else "\n".join(_table(collective_rows(volume))))
    out("")
    out("parameter shardings (shape (logical axes) -> mesh axes):")
    out("\n".join(_table(group_by_block(shardings))))
    out("")
    out(f"precision: {report['precision']['summary']}; embeddings, norms, attention scores and the LM head in bf16/f32")
    out("\n".join(_table(group_by_block(list(layers.items())))))
    if gather_note is not None:
        out(gather_note)
    if plan is not None:
        out("")
        out(plan.table())
    return result
