"""AdamW with a warmup + cosine or warmup-stable-decay schedule, global-norm clipping and a decay mask."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fp4lm.config import OptimizerConfig


def effective_warmup_steps(cfg: OptimizerConfig, total_steps: int) -> int:
    """The warm-up the schedule uses: `warmup_steps`, shortened to `total_steps - 1` when it would not leave
    a single step of decay (the trainer says so at the start of such a run)."""
    return min(cfg.warmup_steps, max(total_steps - 1, 0))


def learning_rate_schedule(cfg: OptimizerConfig, total_steps: int) -> optax.Schedule:
    """Linear warmup from 0 to `lr`, then down to `lr * min_lr_ratio` at `total_steps`.

    cosine: a half cosine over all steps after warmup.
    wsd (warmup-stable-decay): constant `lr` until the last `decay_fraction` of the steps, then linear decay.

    The schedule is a function of the update count and `total_steps` only, so raising `train.steps` of a
    finished (or running) run re-stretches it: the steps after the extension follow the schedule of the new
    total, whose lr at the old end is higher than the old floor (a jump up, then a decay to the new end).
    """
    peak = cfg.lr
    floor = cfg.lr * cfg.min_lr_ratio
    warmup = effective_warmup_steps(cfg, total_steps)
    warmup_schedule = optax.linear_schedule(0.0, peak, max(warmup, 1))
    after = max(total_steps - warmup, 1)
    if cfg.schedule == "cosine":
        main = optax.cosine_decay_schedule(peak, after, alpha=cfg.min_lr_ratio)
    elif cfg.schedule == "wsd":
        decay_steps = max(int(round(cfg.decay_fraction * total_steps)), 1)
        stable_steps = max(after - decay_steps, 0)
        main = optax.join_schedules(
            [optax.constant_schedule(peak), optax.linear_schedule(peak, floor, decay_steps)], [stable_steps]
        )
    else:
        raise AssertionError(f"unknown schedule {cfg.schedule}")  # validated in config
    if warmup == 0:
        return main
    return optax.join_schedules([warmup_schedule, main], [warmup])


def _is_embedding_path(path: tuple) -> bool:
    return any("embed" in str(getattr(key, "key", getattr(key, "name", key))).lower() for key in path)


def weight_decay_mask(params, *, decay_norms_and_embeddings: bool = False):
    """True for leaves that get weight decay.

    Decayed: matrices (rank >= 2) of linear layers and the LM head. Not decayed, unless
    `decay_norms_and_embeddings`: vectors (norm scales, biases) and any parameter whose path names an
    embedding (with tied embeddings the shared table counts as an embedding).
    """

    def decays(path, leaf) -> bool:
        if decay_norms_and_embeddings:
            return True
        return jnp.ndim(leaf) >= 2 and not _is_embedding_path(path)

    return jax.tree_util.tree_map_with_path(decays, params)


def build_optimizer(cfg: OptimizerConfig, total_steps: int) -> optax.GradientTransformation:
    schedule = learning_rate_schedule(cfg, total_steps)
    adamw = optax.adamw(
        learning_rate=schedule,
        b1=cfg.b1,
        b2=cfg.b2,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        mask=lambda params: weight_decay_mask(params, decay_norms_and_embeddings=cfg.decay_norms_and_embeddings),
    )
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), adamw)


def update_count(opt_state) -> jax.Array:
    """How many updates the optimizer has applied (skipped steps do not count): the schedule's position."""
    return optax.tree_utils.tree_get(
        opt_state,
        "count",
        filtering=lambda path, _value: getattr(path[-1], "tuple_name", None) == "ScaleByScheduleState",
    )
