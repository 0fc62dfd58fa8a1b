"""Dynamic loss scaling: transitions, skip semantics, and a skipped-then-recovered step in a real step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fp4lm.config import DebugConfig, LossScaleConfig, OptimizerConfig
from fp4lm.train.fault_injection import poisoned_forward
from fp4lm.train.loss_scale import LossScaler, all_finite
from fp4lm.train.optimizer import build_optimizer, learning_rate_schedule
from fp4lm.train.state import init_train_state
from fp4lm.train.step import make_train_step, model_apply_routed, run_model

FINITE, NONFINITE = jnp.asarray(True), jnp.asarray(False)


def _run(scaler, outcomes):
    state = scaler.init()
    history = []
    for finite in outcomes:
        state = scaler.update(state, jnp.asarray(finite))
        history.append(state)
    return history


def test_defaults_follow_the_recipe():
    cfg = LossScaleConfig()
    assert LossScaler.from_config(cfg, recipe_is_quantized=True).enabled
    assert not LossScaler.from_config(cfg, recipe_is_quantized=False).enabled
    forced = LossScaleConfig(enabled=True)
    assert LossScaler.from_config(forced, recipe_is_quantized=False).enabled


def test_grows_after_interval_of_finite_steps():
    scaler = LossScaler(enabled=True, initial_scale=8.0, growth_interval=3, growth_factor=2.0)
    scales = [float(s.scale) for s in _run(scaler, [True] * 7)]
    assert scales == [8.0, 8.0, 16.0, 16.0, 16.0, 32.0, 32.0]


def test_backs_off_counts_and_resets_on_nonfinite():
    scaler = LossScaler(enabled=True, initial_scale=8.0, growth_interval=2, backoff_factor=0.5, min_scale=2.0)
    history = _run(scaler, [True, False, False, False, True, True])
    assert [float(s.scale) for s in history] == [8.0, 4.0, 2.0, 2.0, 2.0, 4.0]  # floor at min_scale
    assert [int(s.consecutive_skips) for s in history] == [0, 1, 2, 3, 0, 0]
    assert [int(s.skipped_steps) for s in history] == [0, 1, 2, 3, 3, 3]
    # A non-finite step restarts the growth count: growth needs 2 finite steps after the last skip.
    assert [int(s.finite_in_a_row) for s in history] == [1, 0, 0, 0, 1, 0]


def test_growth_is_capped():
    scaler = LossScaler(enabled=True, initial_scale=4.0, growth_interval=1, max_scale=8.0)
    assert [float(s.scale) for s in _run(scaler, [True] * 3)] == [8.0, 8.0, 8.0]


def test_disabled_keeps_scale_one_but_still_counts_skips():
    scaler = LossScaler(enabled=False, initial_scale=1024.0)
    history = _run(scaler, [True, False, True])
    assert [float(s.scale) for s in history] == [1.0, 1.0, 1.0]
    assert int(history[-1].skipped_steps) == 1
    grads = {"w": jnp.ones(3)}
    assert scaler.unscale(history[0], grads) is grads
    assert float(scaler.scale_loss(history[0], jnp.asarray(2.0))) == 2.0


def test_scale_and_unscale_are_inverse():
    scaler = LossScaler(enabled=True, initial_scale=2.0**10)
    state = scaler.init()
    assert float(scaler.scale_loss(state, jnp.asarray(3.0))) == 3.0 * 2**10
    unscaled = scaler.unscale(state, {"w": jnp.full(4, 2.0**11)})
    np.testing.assert_array_equal(unscaled["w"], np.full(4, 2.0))


def test_all_finite():
    assert bool(all_finite({"a": jnp.ones(3), "b": {"c": jnp.zeros((2, 2))}}))
    assert not bool(all_finite({"a": jnp.ones(3), "b": jnp.array([1.0, jnp.inf])}))
    assert not bool(all_finite([jnp.array([jnp.nan])]))


class _Table(nnx.Module):
    def __init__(self, table):
        self.table = nnx.Param(table)

    def __call__(self, tokens_BT):
        return self.table[...][tokens_BT]


class _Bigram(nnx.Module):
    """A bigram model: logits = embedding[token] @ head, with the model's entry points (embed, from_embeddings)."""

    def __init__(self):
        key = jax.random.key(0)
        self.embed = _Table(0.1 * jax.random.normal(key, (8, 4)))
        self.head = nnx.Param(0.1 * jax.random.normal(jax.random.fold_in(key, 1), (4, 8)))

    def __call__(self, tokens_BT, *, quant_key=None):
        return self.from_embeddings(self.embed(tokens_BT), quant_key=quant_key)

    def from_embeddings(self, hidden, *, quant_key=None):
        return hidden @ self.head[...]


def _toy_setup(debug: DebugConfig, initial_scale=2.0**8):
    graphdef, state = nnx.split(_Bigram(), nnx.Param)
    params = nnx.to_pure_dict(state)
    toy_apply = model_apply_routed(graphdef, poisoned_forward(debug) or run_model)
    opt_cfg = OptimizerConfig(lr=0.1, warmup_steps=0)
    optimizer = build_optimizer(opt_cfg, 20)
    scaler = LossScaler(enabled=True, initial_scale=initial_scale, growth_interval=100)
    step = jax.jit(make_train_step(toy_apply, optimizer, scaler, learning_rate_schedule(opt_cfg, 20)))
    tokens = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 8
    batch = {"inputs": tokens, "targets": (tokens + 1) % 8}
    return init_train_state(params, optimizer, scaler, 0), step, batch


@pytest.mark.parametrize("into", ["grads", "activations"])
def test_injected_nonfinite_step_is_skipped_and_training_recovers(into):
    state, step, batch = _toy_setup(DebugConfig(inject_nonfinite_at=2, inject_nonfinite_into=into))
    state, m1 = step(state, batch)
    params_before = jax.tree.map(np.asarray, state.params)
    opt_before = jax.tree.map(np.asarray, state.opt_state)
    state, m2 = step(state, batch)
    assert bool(m2["skipped"]) and int(m2["skipped_steps"]) == 1 and int(m2["consecutive_skips"]) == 1
    assert not np.isfinite(float(m2["grad_norm"]))
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, state.params), params_before)
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, state.opt_state), opt_before)
    assert float(state.loss_scale.scale) == 2.0**7  # backed off once
    assert int(state.step) == 2  # the skipped step still counts as a step taken
    losses = []
    for _ in range(4):
        state, m = step(state, batch)
        assert not bool(m["skipped"])
        losses.append(float(m["loss"]))
    assert int(m["consecutive_skips"]) == 0 and int(m["skipped_steps"]) == 1
    assert losses[-1] < float(m1["loss"])  # learning resumed
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(state.params))


def test_consecutive_injected_steps_are_counted():
    state, step, batch = _toy_setup(DebugConfig(inject_nonfinite_at=1, inject_nonfinite_steps=3))
    counts = []
    for _ in range(4):
        state, m = step(state, batch)
        counts.append(int(m["consecutive_skips"]))
    assert counts == [1, 2, 3, 0]
    assert float(state.loss_scale.scale) == 2.0**5


def test_loss_scaling_does_not_change_finite_updates():
    """Scaling by a power of two and unscaling is exact: same update as without scaling."""
    results = []
    for initial in (1.0, 2.0**12):
        state, step, batch = _toy_setup(DebugConfig(), initial_scale=initial)
        for _ in range(3):
            state, _ = step(state, batch)
        results.append(jax.tree.map(np.asarray, state.params))
    jax.tree.map(np.testing.assert_array_equal, results[0], results[1])
