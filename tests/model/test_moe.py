"""The mixture-of-experts block (fp4lm.model.moe): routing, dispatch, capacity, losses, and the model around it."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fp4lm.config import ModelConfig, load_config
from fp4lm.errors import UserError
from fp4lm.model import Llama
from fp4lm.model import experts as experts_module
from fp4lm.model.moe import MoE, pop_routing_stats, routing_metrics
from fp4lm.model.routing import dispatch_order, expert_capacity, route, routing_losses, update_router_biases
from fp4lm.quant import Policy, grouped
from tests.quant.fake_quant import gaussian

pytestmark = pytest.mark.slow

MOE = ModelConfig(
    num_layers=2,
    d_model=32,
    num_heads=2,
    num_kv_heads=1,
    mlp_dim=64,
    num_experts=4,
    experts_per_token=2,
    moe_mlp_dim=32,
)


def _moe(cfg: ModelConfig, recipe: str = "bf16") -> MoE:
    model = Llama(cfg, 64, Policy(recipe, num_layers=cfg.num_layers), rngs=nnx.Rngs(0))
    block = model.blocks[cfg.first_dense_layers]
    assert isinstance(block.mlp, MoE)
    return block.mlp


def _reference(moe: MoE, x_ND: jax.Array, keep_NK: np.ndarray | None = None) -> np.ndarray:
    """Token by token in float32: sum over its chosen experts of weight * SwiGLU_e(x) (+ shared experts)."""
    cfg = moe.cfg
    logits = np.asarray(x_ND, np.float32) @ np.asarray(moe.router[...])
    weights, experts, _ = route(jnp.asarray(logits), cfg)
    weights, experts = np.asarray(weights), np.asarray(experts)
    bf16 = lambda a: np.asarray(jnp.asarray(a).astype(jnp.bfloat16).astype(jnp.float32))  # noqa: E731
    gate, up, down = (bf16(m.kernel[...]) for m in (moe.gate, moe.up, moe.down))
    x = bf16(x_ND)
    out = np.zeros(x.shape, np.float32)
    for n in range(x.shape[0]):
        for slot in range(cfg.experts_per_token):
            if keep_NK is not None and not keep_NK[n, slot]:
                continue
            e = experts[n, slot]
            g, u = x[n] @ gate[e], x[n] @ up[e]
            hidden = bf16(g / (1 + np.exp(-g)) * u)
            out[n] += weights[n, slot] * (hidden @ down[e])
    return out


def test_route_picks_the_top_k_and_renormalises_their_weights():
    logits = jnp.asarray([[2.0, 1.0, 0.0, -1.0], [0.0, 3.0, 0.0, 2.5]])
    weights, experts, probabilities = route(logits, MOE)
    assert experts.tolist() == [[0, 1], [1, 3]]
    np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(probabilities).sum(-1), 1.0, rtol=1e-6)
    raw, _, _ = route(logits, dataclasses.replace(MOE, router_renormalize=False))
    np.testing.assert_allclose(raw, np.take_along_axis(np.asarray(jax.nn.softmax(logits)), np.asarray(experts), -1))


def test_a_selection_bias_changes_the_choice_but_not_the_weights():
    cfg = dataclasses.replace(MOE, router_score="sigmoid", router_renormalize=False)
    logits = jnp.asarray([[2.0, 1.0, 0.0, -1.0]])
    _, unbiased, _ = route(logits, cfg)
    weights, experts, _ = route(logits, cfg, bias_X=jnp.asarray([0.0, 0.0, 5.0, 0.0]))
    assert unbiased.tolist() == [[0, 1]] and experts.tolist() == [[2, 0]]
    np.testing.assert_allclose(weights, jax.nn.sigmoid(jnp.asarray([[0.0, 2.0]])), rtol=1e-6)


def test_dispatch_sorts_pairs_by_expert_and_drops_past_the_capacity_in_token_order():
    experts = jnp.asarray([2, 0, 2, 2, 1, 0, 2], jnp.int32)
    order, sizes, counts = dispatch_order(experts, 4, None)
    assert np.asarray(experts)[np.asarray(order)].tolist() == [0, 0, 1, 2, 2, 2, 2]
    assert sizes.tolist() == counts.tolist() == [2, 1, 4, 0]
    order, sizes, counts = dispatch_order(experts, 4, 2)
    assert sizes.tolist() == [2, 1, 2, 0] and counts.tolist() == [2, 1, 4, 0]
    assert np.asarray(order).tolist() == [1, 5, 4, 0, 2, 3, 6]  # expert 2's third and fourth pairs dropped, last


@pytest.mark.parametrize(
    "cfg",
    [MOE, dataclasses.replace(MOE, router_score="sigmoid", router_renormalize=False)],
    ids=["softmax_renormalised", "sigmoid_raw_weights"],
)
def test_the_block_equals_a_token_by_token_reference_in_bf16(cfg):
    moe = _moe(cfg)
    x = jax.random.normal(jax.random.key(1), (1, 48, cfg.d_model), jnp.float32).astype(jnp.bfloat16)
    got = moe(x)[0].astype(jnp.float32)
    want = _reference(moe, x[0])
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


def test_a_capacity_drops_pairs_whose_expert_is_full():
    cfg = dataclasses.replace(MOE, capacity_factor=0.5)
    moe = _moe(cfg)
    x = jax.random.normal(jax.random.key(2), (1, 48, cfg.d_model), jnp.float32).astype(jnp.bfloat16)
    got = moe(x)[0].astype(jnp.float32)
    stats = moe.routing.get_value()
    logits = np.asarray(x[0], np.float32) @ np.asarray(moe.router[...])
    _, experts, _ = route(jnp.asarray(logits), cfg)
    capacity = expert_capacity(cfg, 48)
    assert capacity == 12
    seen, keep = {}, np.zeros((48, 2), bool)
    for n, slot in np.ndindex(48, 2):  # pairs in token order, as dispatch_order keeps them
        e = int(experts[n, slot])
        seen[e] = seen.get(e, 0) + 1
        keep[n, slot] = seen[e] <= capacity
    assert float(stats["dropped"]) == (~keep).sum() > 0
    logged = routing_metrics({"blocks.0.mlp": stats})["blocks.0.mlp"]  # what metrics.jsonl gets
    assert float(logged["dropped_fraction"]) == pytest.approx((~keep).sum() / keep.size)
    want = _reference(moe, x[0], keep)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


def test_the_load_balance_loss_is_one_when_balanced_and_its_gradient_reaches_the_router():
    logits = jnp.zeros((8, 4))
    probabilities = jax.nn.softmax(logits)
    losses = routing_losses(logits, probabilities, jnp.asarray([4, 4, 4, 4]), 16)
    assert float(losses["load_balance"]) == pytest.approx(1.0)
    assert float(losses["entropy"]) == pytest.approx(np.log(4), rel=1e-6)
    assert float(losses["z_loss"]) == pytest.approx(np.log(4) ** 2, rel=1e-6)  # logsumexp of 4 zeros, squared
    skewed = routing_losses(logits + jnp.asarray([3.0, 0, 0, 0]), probabilities, jnp.asarray([16, 0, 0, 0]), 16)
    assert float(skewed["load_balance"]) == pytest.approx(1.0)  # all pairs to expert 0, P_0 = 1/4: 4 · 1 · 1/4
    assert float(skewed["z_loss"]) == pytest.approx(np.log(np.exp(3.0) + 3) ** 2, rel=1e-6)

    moe = _moe(MOE)
    x = jax.random.normal(jax.random.key(3), (2, 16, MOE.d_model)).astype(jnp.bfloat16)
    graphdef, params = nnx.split(moe, nnx.Param)

    def aux(params):
        module = nnx.merge(graphdef, params)
        module(x)
        return module.routing.get_value()["aux_loss"]

    grads = jax.grad(aux)(params)
    assert float(jnp.abs(grads["router"][...]).max()) > 0


def test_a_model_reports_each_moe_block_and_scanned_blocks_agree_with_unrolled_ones():
    cfg = dataclasses.replace(MOE, num_layers=3, first_dense_layers=1, num_shared_experts=1, qk_norm=True)
    tokens = jax.random.randint(jax.random.key(4), (2, 32), 0, 64)
    outputs = {}
    for scan in (False, True):
        model = Llama(dataclasses.replace(cfg, scan_layers=scan), 64, Policy("nvfp4", num_layers=3), rngs=nnx.Rngs(0))
        logits = model(tokens, quant_key=jax.random.key(5))
        outputs[scan] = (logits, pop_routing_stats(model))
    assert sorted(outputs[False][1]) == ["blocks.1.mlp", "blocks.2.mlp"]
    assert sorted(outputs[True][1]) == ["blocks.1.mlp", "blocks.2.mlp"]
    np.testing.assert_allclose(outputs[True][0], outputs[False][0], atol=0.05)
    for path, stats in outputs[False][1].items():
        assert float(stats["tokens_per_expert"].sum()) == 2 * 32 * 2
        np.testing.assert_allclose(outputs[True][1][path]["load_balance"], stats["load_balance"], rtol=0.05)


def test_telemetry_reports_each_expert_and_scanned_blocks_agree_with_unrolled_ones():
    from fp4lm.model import collect_layer_stats, pop_layer_stats

    cfg = dataclasses.replace(MOE, num_layers=3, first_dense_layers=1)
    tokens = jax.random.randint(jax.random.key(6), (2, 32), 0, 64)
    stats = {}
    for scan in (False, True):
        model = Llama(dataclasses.replace(cfg, scan_layers=scan), 64, Policy("nvfp4", num_layers=3), rngs=nnx.Rngs(0))
        collect_layer_stats(model)
        model(tokens, quant_key=jax.random.key(7))
        stats[scan] = jax.device_get(pop_layer_stats(model))
        routing = pop_routing_stats(model)
    experts = [name for name in stats[False] if ".experts." in name]
    assert sorted(experts) == sorted(
        f"blocks.{i}.mlp.experts.{p}.{e}" for i in (1, 2) for p in ("gate", "up", "down") for e in range(4)
    )
    assert "blocks.0.mlp.gate" in stats[False]  # the dense first block as before
    assert sorted(stats[True]) == sorted(stats[False])
    for name in experts:
        np.testing.assert_allclose(stats[True][name]["w"]["amax"], stats[False][name]["w"]["amax"])
        assert set(stats[False][name]) == {"x", "w"} and 0 < stats[False][name]["w"]["rel_err"] < 0.2
    load = np.asarray(routing["blocks.2.mlp"]["tokens_per_expert"])  # an expert without tokens reports zeros
    for e in np.flatnonzero(load == 0):
        assert stats[True][f"blocks.2.mlp.experts.gate.{e}"]["x"]["amax"] == 0


def test_the_loss_free_bias_moves_towards_balance():
    params = {"blocks": {1: {"mlp": {"router_bias": jnp.zeros(4)}}}}
    routing = {"blocks.1.mlp": {"tokens_per_expert": jnp.asarray([10.0, 2.0, 4.0, 0.0])}}
    moved = update_router_biases(params, routing, 0.01)
    np.testing.assert_allclose(moved["blocks"][1]["mlp"]["router_bias"], [-0.01, 0.01, 0.0, 0.01])
    assert params["blocks"][1]["mlp"]["router_bias"].tolist() == [0, 0, 0, 0]  # a new tree


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.experts_per_token=5"], "model.experts_per_token=5 exceeds model.num_experts=4"),
        (["model.first_dense_layers=2"], "model.first_dense_layers=2 leaves none of the model.num_layers=2"),
        (["model.capacity_factor=0"], "model.capacity_factor must be positive"),
        (["model.capacity_factor=-1.5"], "model.capacity_factor must be positive"),
        (["model.router_score=softplus"], "model.router_score='softplus' is not one of: softmax, sigmoid"),
    ],
)
def test_bad_moe_settings_are_one_line_errors(overrides, message):
    base = ["model.num_layers=2", "model.num_experts=4", "model.moe_mlp_dim=32"]
    with pytest.raises(UserError, match=message):
        load_config(None, [*base, *overrides])


def test_the_policy_refuses_expert_widths_or_formats_the_grouped_gemm_cannot_take():
    base = ["model.num_layers=2", "model.d_model=64", "model.num_heads=2", "model.num_kv_heads=1"]
    narrow = load_config(None, [*base, "model.num_experts=4", "model.moe_mlp_dim=24"])
    with pytest.raises(UserError, match=r"model.moe_mlp_dim=24 is not a multiple of 16"):
        Policy.from_config(narrow)
    mxfp4 = load_config(None, [*base, "model.num_experts=4", "model.moe_mlp_dim=32", "precision.recipe=mxfp4"])
    with pytest.raises(UserError, match=r"blocks.0.mlp.experts.gate.*grouped GEMM does not implement"):
        Policy.from_config(mxfp4)
    kept = load_config(
        None,
        [*base, "model.num_experts=4", "model.moe_mlp_dim=32", "precision.recipe=mxfp4",
         r"precision.rules=[blocks\.\d+\.mlp\.experts\..*=nvfp4]"],
    )  # fmt: skip
    assert Policy.from_config(kept).recipe_name_for("blocks.1.mlp.experts.down") == "nvfp4"
    for recipe in ("nvfp4_4over6", "nvfp4_row_scaled"):  # the grouped quantizer has neither option yet
        options = load_config(
            None, [*base, "model.num_experts=4", "model.moe_mlp_dim=32", f"precision.recipe={recipe}"]
        )
        with pytest.raises(UserError, match=r"experts.gate: .* no row-scaled or 4over6 token operands yet"):
            Policy.from_config(options)


@pytest.mark.parametrize("rule", [r".*router=nvfp4", r"blocks\.1\.mlp\.router=bf16"])
def test_a_rule_for_the_router_says_it_stays_float32(rule):
    config = load_config(
        None, ["model.num_layers=2", "model.num_experts=4", "model.moe_mlp_dim=32", f"precision.rules=[{rule}]"]
    )
    with pytest.raises(UserError, match="names the MoE router, which stays float32"):
        Policy.from_config(config)


@pytest.mark.parametrize("shared", [False, True])
def test_shared_weight_scale_gives_each_experts_gate_and_up_one_amax(monkeypatch, shared):
    # precision.shared_weight_scale: an expert's gate and up are served fused (one global scale), so the
    # forward quantizes them with their common amax, as the dense SwiGLU's gate and up; down keeps its own.
    model = Llama(MOE, 64, Policy("nvfp4", num_layers=2, shared_weight_scale=shared), rngs=nnx.Rngs(0))
    moe = model.blocks[0].mlp
    seen = {}

    def recording(x, w, group_sizes, recipe, *, name=None, weight_amax=None, **options):
        seen[name.rsplit(".", 1)[1]] = weight_amax
        return grouped.grouped_dot(x, w, group_sizes, recipe, name=name, weight_amax=weight_amax, **options)

    monkeypatch.setattr(experts_module, "grouped_dot", recording)
    moe(gaussian(0, (1, 32, 32), jnp.bfloat16), quant_key=jax.random.key(0))
    if not shared:
        assert seen == {"gate": None, "up": None, "down": None}
        return
    gate, up = (np.abs(np.asarray(m.weight(), np.float32)).max(axis=(1, 2)) for m in (moe.gate, moe.up))
    np.testing.assert_array_equal(np.asarray(seen["gate"]), np.maximum(gate, up))
    np.testing.assert_array_equal(np.asarray(seen["up"]), np.maximum(gate, up))
    assert seen["down"] is None
