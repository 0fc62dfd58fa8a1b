"""Checks that need more than the config tree: recipe block sizes, resuming, the run directory.

Each failure is a UserError naming the config key and the fix (one line, exit code 2 in the CLI).
"""

from __future__ import annotations

import errno
import os
import pathlib

from fp4lm.config import Config
from fp4lm.errors import UserError
from fp4lm.linear_layers import linear_layers
from fp4lm.quant import Policy, get_recipe
from fp4lm.quant.recipes import GemmShapeError

# Model shape settings a checkpoint depends on; a resumed run must keep them.
SHAPE_KEYS = ("num_layers", "d_model", "num_heads", "num_kv_heads", "head_dim", "mlp_dim", "tie_embeddings")


def make_policy(config: Config) -> Policy:
    """The run's per-layer precision policy (rules are "REGEX=RECIPE" strings)."""
    p = config.precision
    return Policy(
        p.recipe,
        num_layers=config.model.num_layers,
        bf16_first_layers=p.bf16_first_layers,
        bf16_last_layers=p.bf16_last_layers,
        rules=p.rules,
        backend=p.backend,
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
    so the tokens of a step, train.batch_size * data.seq_len, must be a multiple too.
    """
    policy = policy or make_policy(config)
    tokens = config.train.batch_size * config.data.seq_len
    width_keys = _width_keys(config)
    for layer in linear_layers(config.model):
        recipe = policy.recipe_for(layer.path)
        try:
            recipe.check_gemm_shapes(m=tokens, n=layer.out_features, k=layer.in_features, where=f"layer {layer.path}")
        except GemmShapeError as error:
            key = "train.batch_size * data.seq_len" if error.axis == "M" else width_keys[error.size]
            spec = getattr(recipe, error.slot)
            raise UserError(
                f"{key}={error.size} is not a multiple of {error.multiple}, which recipe {recipe.name!r} needs "
                f"({error.slot}: {spec.describe()}, layer {layer.path}); make {key} a multiple of {error.multiple} "
                "or keep the layer in bf16 (precision.rules, precision.bf16_first/last_layers)"
            ) from None


def check_config_for_training(config: Config) -> Policy:
    """All checks that need the recipe registry; returns the run's (quantized) policy."""
    get_recipe(config.precision.recipe)
    policy = make_policy(config)
    policy.validate([layer.path for layer in linear_layers(config.model)])
    check_quantized_widths(config, policy)
    return policy


def check_resume_compatible(saved: dict, config: Config) -> None:
    """A run directory's checkpoints fit only a model of the same shape."""
    saved_model = saved.get("model", {})
    for key in SHAPE_KEYS:
        before, now = saved_model.get(key), getattr(config.model, key)
        if before != now:
            raise UserError(
                f"train.run_dir={config.train.run_dir} holds checkpoints of a model with model.{key}={before}, "
                f"but this run asks for model.{key}={now}; use a new train.run_dir (or set model.{key}={before})"
            )
    saved_data = saved.get("data", {})
    for key in ("tokenizer", "vocab_size"):
        before, now = saved_data.get(key), getattr(config.data, key)
        if before != now:
            raise UserError(
                f"train.run_dir={config.train.run_dir} was trained with data.{key}={before}, but this run asks "
                f"for data.{key}={now}; use a new train.run_dir (or set data.{key}={before})"
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
