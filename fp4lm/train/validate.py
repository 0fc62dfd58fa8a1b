"""Checks that need more than the config tree: the recipes and the device, resuming, the run directory.

Each failure is a UserError naming the config key and the fix (one line, exit code 2 in the CLI).
"""

from __future__ import annotations

import errno
import os
import pathlib

from jax.sharding import Mesh

from fp4lm.config import Config
from fp4lm.errors import UserError
from fp4lm.linear_layers import LinearLayer, linear_layers
from fp4lm.model.attention import check_attention_setting
from fp4lm.quant import Policy
from fp4lm.quant.policy import fp4_gathered_layers
from fp4lm.quant.weight_gather import TILE
from fp4lm.sharding import FSDP_AXES, all_devices, fsdp_placements, mesh_shape

# What a run was trained with: a resumed run must keep these (every other setting may change on resume).
FIXED_SECTIONS = ("model", "data")
FIXED_KEYS = (
    "train.batch_size",
    "train.seed",
    "precision.recipe",
    "precision.bf16_first_layers",
    "precision.bf16_last_layers",
    "precision.rules",
    "precision.shared_weight_scale",
)
# Keys of the fixed sections that choose only how the same math runs (the last bits may differ): free on resume.
CHANGEABLE_KEYS = ("model.attention",)
# Fixed keys that a run saved before they existed may take either way (the same parameters either way).
FREE_WHEN_ABSENT = ("model.scan_layers",)
RECIPE_KEY = "precision.recipe"  # may change on resume with train.allow_recipe_change=true


def check_config_for_training(config: Config) -> None:
    """What a config must pass before a step is built, beyond `fp4lm.config.validate`: the precision policy
    fits the model (`Policy.from_config`), model.attention can run on this machine, and a MoE model's batch
    splits over the mesh's batch devices."""
    Policy.from_config(config)
    check_attention_setting(config.model.attention, head_dim=config.model.resolved_head_dim)
    check_batch_splits(config, len(all_devices()))


def check_batch_splits(config: Config, num_devices: int) -> None:
    """Each micro-batch's rows are sharded over the batch axes (mesh.data * mesh.fsdp * mesh.expert devices),
    and a MoE model's devices each route their own rows: the rows must split evenly, or the run stops here in
    one line (a UserError) instead of in JAX's sharding check mid-start."""
    data, fsdp, expert, _ = mesh_shape(config.mesh, num_devices)
    splits = data * fsdp * expert
    rows = config.train.batch_size // config.train.grad_accum_steps
    if rows % splits:
        raise UserError(
            f"a micro-batch of {rows} sequences (train.batch_size / train.grad_accum_steps) does not split over "
            f"the {splits} devices of mesh.data * mesh.fsdp * mesh.expert; make it a multiple of {splits}",
            settings=("train.batch_size", "mesh"),
        )


def fp4_gathered_on_mesh(config: Config, policy: Policy, mesh: Mesh) -> list[LinearLayer]:
    """The layers whose weights precision.fp4_param_gather gathers in 4 bits on `mesh`: the quantized ones
    (`fp4_gathered_layers`) sharded over FSDP. Each one's shards must hold whole 16x16 tiles, which each device
    quantizes (the rule the layer applies when traced, checked before a run is written): a UserError otherwise."""
    gathered = []
    for layer in fp4_gathered_layers(config, policy):
        shape = (layer.in_features, layer.out_features)
        if fsdp_placements(layer.logical_axes, shape, mesh, tile=TILE, where=f"layer {layer.path}") is not None:
            gathered.append(layer)
    return gathered


def fp4_param_gather_note(config: Config, policy: Policy, mesh: Mesh, gathered: list[LinearLayer]) -> str | None:
    """A note when precision.fp4_param_gather=true gathers nothing in 4 bits (`gathered`, of
    `fp4_gathered_on_mesh`, is empty): no layer it would gather is quantized, or none is sharded over FSDP.
    None when it does its work or is off. A note, not an error: the run is the same as without it."""
    if not config.precision.fp4_param_gather or gathered:
        return None
    if fp4_gathered_layers(config, policy):
        sizes = ", ".join(f"mesh.{axis}={mesh.shape[axis]}" for axis in FSDP_AXES)
        devices = mesh.devices.size
        why = f"no quantized weight is sharded over FSDP ({sizes}; {devices} device{'s' if devices > 1 else ''})"
    elif any(policy.recipe_for(layer.path).is_quantized for layer in linear_layers(config.model)):
        why = "its only quantized layers are routed experts, which gather their own way"
    else:
        why = f"no linear layer is quantized (precision.recipe={config.precision.recipe})"
    return (
        f"note: precision.fp4_param_gather=true changes nothing here: {why}; it gathers NVFP4 weights sharded "
        "over mesh.fsdp in 4 bits (set it to false to drop this note)"
    )


def fixed_settings(tree: dict) -> dict[str, object]:
    """The settings a resumed run must keep, as "section.key" -> value, from a config's `to_dict()` form."""
    found = {}
    for section in FIXED_SECTIONS:
        for key, value in tree.get(section, {}).items():
            if f"{section}.{key}" not in CHANGEABLE_KEYS:
                found[f"{section}.{key}"] = value
    for dotted in FIXED_KEYS:
        section, key = dotted.split(".")
        if key in tree.get(section, {}):
            found[dotted] = tree[section][key]
    return found


def _same(key: str, before, now) -> bool:
    if key == "data.path" and isinstance(before, str) and isinstance(now, str):
        return os.path.abspath(before) == os.path.abspath(now)
    return before == now


def _saved_settings(saved: dict) -> dict[str, object]:
    """The saved run's fixed settings, a key it lacks at its default (see `resume_mismatches`); only in sections
    it has: a run saved by any fp4lm version has every section, so a missing one says nothing about its keys."""
    defaults = {
        k: v
        for k, v in fixed_settings(Config().to_dict()).items()
        if k not in FREE_WHEN_ABSENT and k.split(".")[0] in saved
    }
    return {**defaults, **fixed_settings(saved)}


def resume_mismatches(saved: dict, config: Config) -> list[str]:
    """The fixed settings `config` changes against the run's `saved` config, as "key" names (sorted by key
    order); the recipe only when train.allow_recipe_change is off. A key the saved config lacks (a run from
    before the key existed) had its default: a new key's default is the behaviour before it (model.num_experts=0,
    a dense model), so an old dense run asked for experts is refused here, not by its checkpoint's shapes;
    except `FREE_WHEN_ABSENT`."""
    before, now = _saved_settings(saved), fixed_settings(config.to_dict())
    allowed = {RECIPE_KEY} if config.train.allow_recipe_change else set()
    return [k for k in now if k in before and k not in allowed and not _same(k, before[k], now[k])]


def check_resume_compatible(saved: dict, config: Config) -> None:
    """A run directory's checkpoints continue only the run they came from: every fixed setting that differs
    is named in one line (saved value, then this run's)."""
    mismatches = resume_mismatches(saved, config)
    if not mismatches:
        return
    before, now = _saved_settings(saved), fixed_settings(config.to_dict())
    show = lambda v: ",".join(map(str, v)) if isinstance(v, list) else v  # noqa: E731
    changes = "; and ".join(f"{k}={show(before[k])}, but this run asks for {k}={show(now[k])}" for k in mismatches)
    recipe = " (train.allow_recipe_change=true switches the recipe deliberately)" if RECIPE_KEY in mismatches else ""
    raise UserError(
        f"train.run_dir={config.train.run_dir} was trained with {changes}; leave these settings out to resume with "
        f"the saved ones{recipe}, or use a new train.run_dir"
    )


def prepare_run_dir(run_dir: str) -> pathlib.Path:
    """Creates the run directory and proves it writable (a one-line UserError otherwise)."""
    path = pathlib.Path(run_dir)
    if path.exists() and not path.is_dir():
        raise UserError(f"train.run_dir={run_dir} exists and is not a directory; choose another train.run_dir")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write_probe_{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as error:
        raise UserError(describe_os_error(error, f"train.run_dir={run_dir}")) from None
    return path


def describe_os_error(error: OSError, what: str) -> str:
    """One line for a failed write: the file, the reason and what to do."""
    where = f" ({error.filename})" if error.filename else ""
    if error.errno == errno.ENOSPC:
        return f"no space left on the device writing {what}{where}; free disk space or choose another train.run_dir"
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot write {what}{where}: {error.strerror}; choose a writable train.run_dir"
    return f"cannot write {what}{where}: {error.strerror or error}; check the path or choose another train.run_dir"
