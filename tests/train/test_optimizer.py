"""Learning-rate schedules, the weight-decay mask, clipping and the schedule's step count."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lm.config import OptimizerConfig
from fp4lm.train.optimizer import (
    build_optimizer,
    effective_warmup_steps,
    learning_rate_schedule,
    update_count,
    weight_decay_mask,
)

BASE = OptimizerConfig(lr=1.0, min_lr_ratio=0.1, warmup_steps=10, weight_decay=0.1, grad_clip=1.0)


def _lr(schedule, step):
    return float(schedule(step))


def test_warmup_then_cosine():
    schedule = learning_rate_schedule(BASE, 110)
    assert _lr(schedule, 0) == 0.0
    assert _lr(schedule, 5) == pytest.approx(0.5)
    assert _lr(schedule, 10) == pytest.approx(1.0)
    # Halfway through the cosine: floor + (peak - floor) / 2.
    assert _lr(schedule, 60) == pytest.approx(0.55, rel=1e-5)
    assert _lr(schedule, 110) == pytest.approx(0.1)
    assert _lr(schedule, 500) == pytest.approx(0.1)  # stays at the floor
    values = [_lr(schedule, s) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))


def test_warmup_stable_decay():
    cfg = dataclasses.replace(BASE, schedule="wsd", decay_fraction=0.2)
    schedule = learning_rate_schedule(cfg, 100)
    assert _lr(schedule, 5) == pytest.approx(0.5)
    assert all(_lr(schedule, s) == pytest.approx(1.0) for s in (10, 40, 80))
    assert _lr(schedule, 90) == pytest.approx(0.55, rel=1e-5)  # halfway through the linear decay
    assert _lr(schedule, 100) == pytest.approx(0.1)


def test_no_warmup():
    schedule = learning_rate_schedule(dataclasses.replace(BASE, warmup_steps=0), 100)
    assert _lr(schedule, 0) == pytest.approx(1.0)
    assert _lr(schedule, 100) == pytest.approx(0.1)


def _llama_like_params():
    return {
        "embed": {"table": jnp.ones((16, 8))},
        "blocks": {0: {"attn": {"q": {"kernel": jnp.ones((8, 8))}}, "attn_norm": {"scale": jnp.ones(8)}}},
        "final_norm": {"scale": jnp.ones(8)},
        "lm_head": jnp.ones((8, 16)),
    }


def test_weight_decay_mask_excludes_norms_and_embeddings():
    mask = weight_decay_mask(_llama_like_params())
    assert mask["embed"]["table"] is False
    assert mask["blocks"][0]["attn_norm"]["scale"] is False
    assert mask["final_norm"]["scale"] is False
    assert mask["blocks"][0]["attn"]["q"]["kernel"] is True
    assert mask["lm_head"] is True
    everything = weight_decay_mask(_llama_like_params(), decay_norms_and_embeddings=True)
    assert all(jax.tree.leaves(everything))


def test_weight_decay_applies_only_where_masked():
    """With zero gradients AdamW's update is pure decay: -lr * wd * param on masked leaves only."""
    cfg = dataclasses.replace(BASE, warmup_steps=0)
    optimizer = build_optimizer(cfg, 10)
    params = _llama_like_params()
    updates, _ = optimizer.update(jax.tree.map(jnp.zeros_like, params), optimizer.init(params), params)
    np.testing.assert_allclose(updates["blocks"][0]["attn"]["q"]["kernel"], -0.1 * np.ones((8, 8)), rtol=1e-6)
    np.testing.assert_allclose(updates["lm_head"], -0.1 * np.ones((8, 16)), rtol=1e-6)
    np.testing.assert_array_equal(updates["embed"]["table"], 0.0)
    np.testing.assert_array_equal(updates["final_norm"]["scale"], 0.0)


def _updates(optimizer, grads_sequence):
    params = {"w": jnp.zeros(4)}
    state = optimizer.init(params)
    out = []
    for grads in grads_sequence:
        updates, state = optimizer.update(grads, state, params)
        out.append(np.asarray(updates["w"]))
    return out


def test_global_norm_clipping_rescales_large_gradients():
    """Clipping to norm c equals feeding the gradient pre-scaled to norm c; small gradients pass unchanged."""
    cfg = dataclasses.replace(BASE, warmup_steps=0, weight_decay=0.0, grad_clip=0.5)
    unclipped_cfg = dataclasses.replace(cfg, grad_clip=1e9)
    big = {"w": jnp.array([30.0, 40.0, 0.0, 0.0])}  # norm 50
    small = {"w": jnp.array([0.1, 0.0, 0.2, 0.0])}
    pre_scaled = {"w": big["w"] * (0.5 / 50.0)}
    clipped = _updates(build_optimizer(cfg, 10), [big, small])
    expected = _updates(build_optimizer(unclipped_cfg, 10), [pre_scaled, small])
    not_clipped = _updates(build_optimizer(unclipped_cfg, 10), [big, small])
    np.testing.assert_allclose(clipped[1], expected[1], rtol=1e-6)
    assert not np.allclose(clipped[1], not_clipped[1], rtol=1e-3)


def test_update_count_follows_applied_updates():
    optimizer = build_optimizer(BASE, 10)
    params = {"w": jnp.ones(3)}
    state = optimizer.init(params)
    assert int(update_count(state)) == 0
    for _ in range(3):
        _, state = optimizer.update({"w": jnp.ones(3)}, state, params)
    assert int(update_count(state)) == 3


def test_warmup_longer_than_the_run_is_shortened():
    """The schedule keeps one step of decay; the trainer names both numbers at the start."""
    cfg = dataclasses.replace(BASE, warmup_steps=100)
    assert effective_warmup_steps(cfg, 20) == 19
    assert effective_warmup_steps(cfg, 200) == 100
    schedule = learning_rate_schedule(cfg, 20)
    assert _lr(schedule, 19) == pytest.approx(1.0)
    assert _lr(schedule, 20) == pytest.approx(0.1)


def test_extending_a_finished_run_restretches_the_schedule():
    """Raising train.steps from 100 to 200 after the run ended: the schedule is that of the new total, so the lr
    jumps from the old floor back up to the new schedule's value at step 100, then decays to the new end."""
    old, new = learning_rate_schedule(BASE, 100), learning_rate_schedule(BASE, 200)
    assert _lr(old, 100) == pytest.approx(0.1)  # the finished run ended at the floor
    assert _lr(new, 100) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * 90 / 190)), rel=1e-5)
    assert _lr(new, 100) > 0.5  # a jump up
    assert _lr(new, 200) == pytest.approx(0.1)
