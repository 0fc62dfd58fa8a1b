"""Checks that need more than the config tree: recipe block sizes, resuming, the run directory.

Each failure is a UserError naming the config key and the fix (one line, exit code 2 in the CLI).
"""

from __future__ import annotations

import errno
import os
import pathlib

from fp4lm.config import Config
from fp4lm.errors import UserError
from fp4lm.quant import Policy, get_recipe

# slot -> (rows axis, contraction axis) of the GEMM that consumes the operand. For a linear layer
# with K inputs and N outputs on M tokens: fprop Y=XW (M,K)x(K,N); dgrad dX=dY Wᵀ; wgrad dW=Xᵀ dY.
_SLOT_AXES = {
    "fprop_x": ("M", "K"),
    "fprop_w": ("N", "K"),
    "dgrad_g": ("M", "N"),
    "dgrad_w": ("K", "N"),
    "wgrad_g": ("N", "M"),
    "wgrad_x": ("K", "M"),
}

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


def linear_layer_widths(config: Config) -> dict[str, tuple[tuple[int, str], tuple[int, str]]]:
    """Per projection name: ((K, key naming K), (N, key naming N))."""
    m = config.model
    head_dim = config.head_dim
    d = (m.d_model, "model.d_model")
    f = (m.mlp_dim, "model.mlp_dim")
    q = (m.num_heads * head_dim, "model.num_heads * head_dim")
    kv = (m.num_kv_heads * head_dim, "model.num_kv_heads * head_dim")
    return {"attn.q": (d, q), "attn.k": (d, kv), "attn.v": (d, kv), "attn.o": (q, d),
            "mlp.gate": (d, f), "mlp.up": (d, f), "mlp.down": (f, d)}


def check_quantized_widths(config: Config, policy: Policy | None = None) -> None:
    """Every quantized layer's widths (and the token count) must be multiples of its recipe's blocks.

    Uses the recipe objects: each quantized operand needs its contraction axis to be a multiple of
    `spec.contraction_multiple` (16 for NVFP4, 32 for MX formats) and its other axis a multiple of
    `spec.row_multiple` (16 for NVFP4's 16x16 weight tiles). The token axis M is contracted by the
    weight-gradient GEMM, so the tokens of a step, train.batch_size * data.seq_len, must be a multiple too.
    """
    policy = policy or make_policy(config)
    tokens = (config.train.batch_size * config.data.seq_len, "train.batch_size * data.seq_len")
    for index in range(config.model.num_layers):
        for name, (k, n) in linear_layer_widths(config).items():
            path = f"blocks.{index}.{name}"
            recipe = policy.recipe_for(path)
            axes = {"K": k, "N": n, "M": tokens}
            for slot, spec in recipe.specs().items():
                if spec is None:
                    continue
                rows, contraction = _SLOT_AXES[slot]
                for axis, multiple in ((contraction, spec.contraction_multiple), (rows, spec.row_multiple)):
                    size, key = axes[axis]
                    if size % multiple:
                        raise UserError(
                            f"{key}={size} is not a multiple of {multiple}, which recipe {recipe.name!r} needs "
                            f"({slot}: {spec.describe()}, layer {path}); make {key} a multiple of {multiple} "
                            "or keep the layer in bf16 (precision.rules, precision.bf16_first/last_layers)"
                        )


def check_config_for_training(config: Config) -> Policy:
    """All checks that need the recipe registry; returns the run's (quantized) policy."""
    get_recipe(config.precision.recipe)
    policy = make_policy(config)
    policy.validate([f"blocks.{i}.{name}" for i in range(config.model.num_layers) for name in linear_layer_widths(config)])
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
