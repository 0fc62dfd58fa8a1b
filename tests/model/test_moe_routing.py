"""The MoE block's routing on a real forward pass, against hand computations from the documented definitions
(fp4lm/model/moe.py's module doc), not from its functions: the load-balancing loss under top-2, the sigmoid
router's normalised probabilities and renormalised weights, and the expert capacity where
capacity_factor · tokens · k / experts is not a whole number (and where floats would miss a whole one).

Small and bf16 (a few experts, 32 features): these run in `make check`; test_moe.py has the heavier ones.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fp4lm.config import ModelConfig
from fp4lm.model import Llama
from fp4lm.model.moe import MoE
from fp4lm.model.routing import expert_capacity
from fp4lm.quant import Policy

CFG = ModelConfig(
    num_layers=1,
    d_model=32,
    num_heads=2,
    num_kv_heads=1,
    mlp_dim=64,
    num_experts=4,
    experts_per_token=2,
    moe_mlp_dim=32,
    load_balance_loss=0.01,
    router_z_loss=0.001,
)


def moe_block(cfg: ModelConfig, router_scale: float = 1.0) -> MoE:
    """The MoE block of a one-block bf16 model, its router scaled (larger logits: top-k sums far from 1)."""
    model = Llama(cfg, 64, Policy("bf16", num_layers=cfg.num_layers), rngs=nnx.Rngs(0))
    block = model.blocks[0].mlp
    assert isinstance(block, MoE)
    block.router[...] = block.router[...] * router_scale
    return block


def tokens(n: int, seed: int = 1) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), (1, n, CFG.d_model), jnp.float32).astype(jnp.bfloat16)


def hand_routing(x_ND: np.ndarray, router: np.ndarray, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """float64, from the definitions: scores (softmax or sigmoid of the logits), the top-k experts, the
    probabilities (scores normalised to sum to 1 per token), the chosen scores renormalised to sum to 1."""
    logits = x_ND.astype(np.float64) @ router.astype(np.float64)
    if cfg.router_score == "softmax":
        scores = np.exp(logits - logits.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
    else:
        scores = 1 / (1 + np.exp(-logits))
    experts = np.argsort(-scores, axis=-1, kind="stable")[:, : cfg.experts_per_token]
    chosen = np.take_along_axis(scores, experts, -1)
    weights = chosen / chosen.sum(-1, keepdims=True) if cfg.router_renormalize else chosen
    probabilities = scores / scores.sum(-1, keepdims=True)
    return {"logits": logits, "experts": experts, "weights": weights, "probabilities": probabilities}


def hand_losses(routing: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, float]:
    """Switch's X · Σ_e f_e · P_e (f_e: the share of the N·k pairs sent to e; P_e: e's mean probability),
    ST-MoE's z-loss (mean logsumexp²), the mean entropy of the probabilities, and their weighted sum."""
    n, k, x = routing["experts"].shape[0], cfg.experts_per_token, cfg.num_experts
    share = np.bincount(routing["experts"].reshape(-1), minlength=x) / (n * k)
    load_balance = x * float(np.sum(share * routing["probabilities"].mean(0)))
    logits = routing["logits"]
    lse = logits.max(-1) + np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1))
    z_loss = float(np.mean(lse**2))
    p = routing["probabilities"]
    entropy = float(np.mean(-np.sum(p * np.log(p), -1)))
    aux = cfg.load_balance_loss * load_balance + cfg.router_z_loss * z_loss
    return {"load_balance": load_balance, "z_loss": z_loss, "entropy": entropy, "aux_loss": aux}


def forward(moe: MoE, x: jax.Array) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(the block's output, its RoutingStats, the hand routing of the same tokens)."""
    y = np.asarray(moe(x)[0], np.float32)
    stats = {name: np.asarray(v) for name, v in moe.routing.get_value().items()}
    return y, stats, hand_routing(np.asarray(x[0], np.float32), np.asarray(moe.router[...]), moe.cfg)


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_the_losses_of_a_top2_forward_pass_are_the_documented_ones(score):
    """Top-2 of 4 experts, 48 tokens: the block's load-balancing loss, z-loss, entropy and aux_loss equal the
    hand computation, and its tokens per expert count all 96 pairs. Under top-2 the shares are of the N·k
    pairs (balanced: 1), and the sigmoid router's probabilities are its scores normalised per token."""
    cfg = dataclasses.replace(CFG, router_score=score)
    moe = moe_block(cfg, router_scale=20.0)
    moe.router[...] = moe.router[...].at[0, 0].set(2.0)
    x = tokens(48).at[..., 0].set(1.5)  # expert 0's logit 3 up: mostly chosen
    _, stats, routing = forward(moe, x)
    want = hand_losses(routing, cfg)
    np.testing.assert_array_equal(stats["tokens_per_expert"], np.bincount(routing["experts"].reshape(-1), minlength=4))
    assert stats["tokens_per_expert"].sum() == 48 * 2 and stats["dropped"] == 0
    for name, value in want.items():
        assert float(stats[name]) == pytest.approx(value, rel=1e-5), name
    assert want["load_balance"] != pytest.approx(1.0, rel=0.05)  # skewed: a loss stuck at 1 would show


def same_experts(moe: MoE) -> None:
    """Gives every expert expert 0's kernels: the block's output is then SwiGLU_0(x) times the sum of the
    token's routing weights over its kept pairs, whichever experts they went to."""
    for module in (moe.gate, moe.up, moe.down):
        kernel = module.kernel[...]
        module.kernel[...] = jnp.broadcast_to(kernel[:1], kernel.shape)


def expert_0(moe: MoE, x: jax.Array) -> np.ndarray:
    """SwiGLU_0 of each token in NumPy, with the bf16 roundings of the block (inputs, hidden)."""
    bf16 = lambda a: np.asarray(jnp.asarray(a, jnp.float32).astype(jnp.bfloat16), np.float32)  # noqa: E731
    gate, up, down = (bf16(m.kernel[0]) for m in (moe.gate, moe.up, moe.down))
    x_ND = bf16(x[0])
    g, u = x_ND @ gate, x_ND @ up
    return bf16(g / (1 + np.exp(-g)) * u) @ down


def assert_close(y: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(y, want, rtol=2e-2, atol=1e-2 * np.abs(want).max())


def test_the_sigmoid_routers_renormalised_weights_sum_to_one_on_a_forward_pass():
    """With every expert the same SwiGLU, the block's output is that SwiGLU times the sum of the token's
    routing weights: with router_renormalize the chosen sigmoids rescaled to sum to 1, so the output is the
    SwiGLU itself. The router is scaled so that the raw top-2 sigmoids sum far from 1 (0.1 to 2)."""
    cfg = dataclasses.replace(CFG, router_score="sigmoid", router_renormalize=True)
    moe = moe_block(cfg, router_scale=20.0)
    same_experts(moe)
    x = tokens(48, seed=2)
    y, _, routing = forward(moe, x)
    raw = 1 / (1 + np.exp(-np.take_along_axis(routing["logits"], routing["experts"], -1)))
    assert np.ptp(raw.sum(-1)) > 0.5  # the raw sums vary: unnormalised weights would show
    np.testing.assert_allclose(routing["weights"].sum(-1), 1.0, rtol=1e-12)
    assert_close(y, expert_0(moe, x))


@pytest.mark.parametrize(
    ("capacity_factor", "tokens_", "k", "experts", "want"),
    [
        (1.0, 9, 2, 8, 3),  # 2.25: ceil 3, round and floor 2
        (1.0, 11, 2, 8, 3),  # 2.75: ceil and round 3, floor 2
        (1.0, 10, 2, 8, 3),  # 2.5: ceil 3, floor and round-half-even 2
        (1.0, 12, 2, 8, 3),  # 3: a whole number stays
        (1.25, 10, 2, 8, 4),  # 3.125
        (1.1, 100, 2, 4, 55),  # 55, which 1.1 * 100 * 2 / 4 in floats puts past (55.00000000000001)
        (1.1, 100, 1, 11, 10),  # 10 (10.000000000000002 in floats)
        (0.3, 7, 1, 3, 1),  # 0.7
    ],
)
def test_the_capacity_is_the_ceiling_of_the_decimal_product(capacity_factor, tokens_, k, experts, want):
    """ceil(capacity_factor · tokens · k / experts) (moe.py's module doc), of the capacity factor as written in
    the config: values that tell ceil from floor and round, and whole products that binary floats overshoot."""
    cfg = dataclasses.replace(CFG, capacity_factor=capacity_factor, experts_per_token=k, num_experts=experts)
    assert expert_capacity(cfg, tokens_) == want
    assert expert_capacity(dataclasses.replace(cfg, capacity_factor=None), tokens_) is None


def test_a_forward_pass_drops_the_pairs_past_a_non_whole_capacity():
    """46 tokens, top-2 of 4, capacity factor 1.1: each expert takes ceil(25.3) = 26 pairs (floor and round
    would give 25), the first in token order. Expert 0 is every token's first choice (46 pairs, weight ~1):
    the block drops exactly the pairs past 26 of every expert, as counted by hand, and (every expert the same
    SwiGLU) each token's output is that SwiGLU times its kept pairs' weights: ~0 for tokens 26 to 45."""
    cfg = dataclasses.replace(CFG, capacity_factor=1.1)
    moe = moe_block(cfg)
    moe.router[...] = moe.router[...].at[0, 0].set(10.0)
    same_experts(moe)
    x = tokens(46, seed=3).at[..., 0].set(5.0)  # logit 0 is 50 above the others
    y, stats, routing = forward(moe, x)
    counts = np.bincount(routing["experts"].reshape(-1), minlength=4)
    assert counts[0] == 46
    capacity = math.ceil(1.1 * 46 * 2 / 4)
    assert capacity == 26
    np.testing.assert_array_equal(stats["tokens_per_expert"], counts)  # counted before the capacity
    assert float(stats["dropped"]) == np.maximum(counts - capacity, 0).sum()
    taken, kept = np.zeros(4, int), np.zeros(routing["experts"].shape, bool)
    for n, slot in np.ndindex(*kept.shape):  # pairs in token order
        expert = routing["experts"][n, slot]
        kept[n, slot] = taken[expert] < capacity
        taken[expert] += 1
    kept_weight = np.sum(routing["weights"] * kept, axis=-1)
    assert kept_weight[:26].min() > 0.99 and kept_weight[26:].max() < 0.01
    assert_close(y, kept_weight[:, None] * expert_0(moe, x))
