"""Checks that need more than the config tree: recipe block sizes, the device, resuming, the run directory.

Each failure is a UserError naming the config key and the fix (one line, exit code 2 in the CLI).
"""

from __future__ import annotations

import errno
import os
import pathlib

from fp4lm.config import Config
from fp4lm.errors import UserError
from fp4lm.linear_layers import linear_layers
from fp4lm.model.attention import check_attention_setting
from fp4lm.quant import Policy, get_recipe
from fp4lm.quant.policy import normalise_rules
from fp4lm.quant.recipes import GemmShapeError

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
RECIPE_KEY = "precision.recipe"  # may change on resume with train.allow_recipe_change=true


def make_policy(config: Config) -> Policy:
    """The run's per-layer precision policy (rules are "REGEX=RECIPE" strings)."""
    p = config.precision
    return Policy(
        p.recipe,
        num_layers=config.model.num_layers,
        bf16_first_layers=p.bf16_first_layers,
        bf16_last_layers=p.bf16_last_layers,
        rules=normalise_rules(p.rules),
        backend=p.backend,
        shared_weight_scale=p.shared_weight_scale,
    )


def _width_keys(config: Config) -> dict[int, str]:
    """The setting behind each width of the linear layers (a width that several give is named by the first)."""
    m = config.model
    keys: dict[int, str] = {}
    for size, key in (
        (m.d_model, "model.d_model"),
        (m.mlp_dim, "model.mlp_dim"),
        (m.num_heads * m.resolved_head_dim, "model.num_heads * head_dim"),
        (m.num_kv_heads * m.resolved_head_dim, "model.num_kv_heads * head_dim"),
    ):
        keys.setdefault(size, key)
    return keys


def check_quantized_widths(config: Config, policy: Policy | None = None) -> None:
    """Every quantized layer's widths (and the token count) must be multiples of its recipe's blocks.

    The rule is the recipe's (`Recipe.check_gemm_shapes`, the same one the quantized matmul applies when
    traced); this adds the setting to change. The token axis M is contracted by the weight-gradient GEMM,
    so the tokens of a step, train.batch_size * data.seq_len, must be a multiple too (of a micro-batch,
    train.batch_size / train.grad_accum_steps * data.seq_len, with gradient accumulation).
    """
    policy = policy or make_policy(config)
    accum = config.train.grad_accum_steps
    tokens = config.train.batch_size // accum * config.data.seq_len
    tokens_key = "train.batch_size * data.seq_len" if accum == 1 else "train.batch_size / grad_accum_steps * seq_len"
    width_keys = _width_keys(config)
    for layer in linear_layers(config.model):
        recipe = policy.recipe_for(layer.path)
        try:
            recipe.check_gemm_shapes(m=tokens, n=layer.out_features, k=layer.in_features, where=f"layer {layer.path}")
        except GemmShapeError as error:
            key = tokens_key if error.axis == "M" else width_keys[error.size]
            spec = getattr(recipe, error.slot)
            raise UserError(
                f"{key}={error.size} is not a multiple of {error.multiple}, which recipe {recipe.name!r} needs "
                f"({error.slot}: {spec.describe()}, layer {layer.path}); make {key} a multiple of {error.multiple} "
                "or keep the layer in bf16 (precision.rules, precision.bf16_first/last_layers)"
            ) from None


def check_config_for_training(config: Config) -> Policy:
    """All checks that need the recipe registry or the device; returns the run's (quantized) policy."""
    check_attention_setting(config.model.attention, head_dim=config.model.resolved_head_dim)
    get_recipe(config.precision.recipe)
    policy = make_policy(config)
    policy.validate([layer.path for layer in linear_layers(config.model)])
    check_quantized_widths(config, policy)
    return policy


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


def resume_mismatches(saved: dict, config: Config) -> list[str]:
    """The fixed settings `config` changes against the run's `saved` config, as "key" names (sorted by key
    order); the recipe only when train.allow_recipe_change is off. Keys the saved config lacks are not compared."""
    before, now = fixed_settings(saved), fixed_settings(config.to_dict())
    allowed = {RECIPE_KEY} if config.train.allow_recipe_change else set()
    return [k for k in now if k in before and k not in allowed and not _same(k, before[k], now[k])]


def check_resume_compatible(saved: dict, config: Config) -> None:
    """A run directory's checkpoints continue only the run they came from: every fixed setting that differs
    is named in one line (saved value, then this run's)."""
    mismatches = resume_mismatches(saved, config)
    if not mismatches:
        return
    before, now = fixed_settings(saved), fixed_settings(config.to_dict())
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
