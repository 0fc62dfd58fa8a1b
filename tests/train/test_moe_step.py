"""The train step of a mixture-of-experts model: router losses in the gradient, loss-free bias, micro-batches."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fp4lm.config import load_config
from fp4lm.quant import Policy
from fp4lm.sharding import make_mesh
from fp4lm.train import model_setup
from fp4lm.train.loss_scale import LossScaler
from fp4lm.train.setup import build_run
from fp4lm.train.step import cross_entropy, make_train_step, model_apply, model_apply_routed
from tests.train.conftest import TINY

pytestmark = pytest.mark.slow

MOE = ["model.num_layers=2", "model.num_experts=4", "model.experts_per_token=2", "model.moe_mlp_dim=32"]
BATCH, SEQ = 8, 16


def _run(*overrides: str):
    config = load_config(None, [*TINY, *MOE, "precision.recipe=bf16", f"train.batch_size={BATCH}", *overrides])
    policy = Policy.from_config(config)
    run = build_run(config, make_mesh(config.mesh), policy)
    return config, run, model_setup.graphdef_with_policy(run.model, policy)


def _batch() -> dict:
    tokens = np.random.default_rng(0).integers(0, 200, size=(BATCH, SEQ + 1), dtype=np.int32)
    return {"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:])}


def _sgd_step(config, graphdef, count: int = 1):
    """Rate-1 SGD: old params - new params are the gradients (the router bias excepted: the step moves it)."""
    step = make_train_step(
        model_apply_routed(graphdef),
        optax.sgd(1.0),
        LossScaler(enabled=False),
        lambda _: 1.0,
        count,
        config.model.router_bias_update,
    )
    return jax.jit(step)


def test_the_router_losses_join_the_gradient_but_not_the_logged_loss():
    config, run, graphdef = _run("model.load_balance_loss=0.5", "model.router_z_loss=0.1")
    state, batch = run.fresh_state(), _batch()
    after, metrics = _sgd_step(config, graphdef)(run.fresh_state(), batch)
    logits = model_apply(graphdef)(state.params, batch["inputs"])
    assert float(metrics["loss"]) == pytest.approx(float(cross_entropy(logits, batch["targets"])), rel=1e-4)
    routing = metrics["routing"]["blocks.0.mlp"]
    assert float(routing["aux_loss"]) == pytest.approx(
        0.5 * float(routing["load_balance"]) + 0.1 * float(routing["z_loss"]), rel=1e-5
    )
    assert float(routing["max_over_mean_tokens"]) >= 1.0 and float(routing["dropped_fraction"]) == 0.0

    def ce_only(params):
        return cross_entropy(model_apply(graphdef)(params, batch["inputs"]), batch["targets"])

    router = lambda params: params["blocks"][0]["mlp"]["router"]  # noqa: E731
    ce_grad = router(jax.grad(ce_only)(state.params))
    step_grad = router(state.params) - router(after.params)
    assert float(jnp.max(jnp.abs(step_grad - ce_grad))) > 1e-6  # the router losses add to its gradient


def test_the_loss_free_bias_is_train_state_of_its_own_moved_after_each_step():
    config, run, graphdef = _run("model.router_bias_update=0.01", "model.load_balance_loss=0")
    state = run.fresh_state()
    after, _ = _sgd_step(config, graphdef)(state, _batch())
    for block in (0, 1):
        bias = np.abs(np.asarray(after.router_biases["blocks"][block]["mlp"]["router_bias"]))
        assert np.any(bias) and np.allclose(bias[bias > 0], 0.01)
        assert "router_bias" not in after.params["blocks"][block]["mlp"]  # not a parameter: no gradient
    # nor does the optimizer (AdamW: moments, weight decay) hold anything for it
    paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(state.opt_state)[0]]
    assert paths and not any("router_bias" in path for path in paths)


def test_the_forward_pass_routes_with_the_states_biases():
    config, run, graphdef = _run("model.router_bias_update=0.01", "model.load_balance_loss=0")
    state = run.fresh_state()
    pushed = jax.tree.map(lambda bias: bias.at[3].set(100.0), state.router_biases)  # every token picks expert 3
    _, metrics = _sgd_step(config, graphdef)(state.replace(router_biases=pushed), _batch())
    assert float(metrics["routing"]["blocks.0.mlp"]["max_over_mean_tokens"]) == pytest.approx(2.0)  # 1 of 2 picks


def test_micro_batches_average_the_routing_statistics():
    config, run, graphdef = _run()
    _, metrics = _sgd_step(config, graphdef, count=2)(run.fresh_state(), _batch())
    routing = metrics["routing"]["blocks.1.mlp"]
    assert np.isfinite(float(routing["load_balance"])) and float(routing["entropy"]) > 0
