"""Routing of a MoE block: which experts each token goes to, in which order the pairs run, and the router's losses.

One module for both ways the experts run: on one device (fp4lm.model.moe) and split over the mesh's expert
axis (fp4lm.model.expert_parallel); both import these functions.

For the N tokens of a step and X experts, each token picks A of them (model.experts_per_token):

    scores_NX = softmax(logits_NX) | sigmoid(logits_NX)      model.router_score
    experts_NA = top_k(scores_NX + bias_X)                    the bias only with model.router_bias_update
    weights_NA = scores_NX at experts_NA                      rescaled to sum to 1 with model.router_renormalize

The N·A (token, expert) pairs, P of them, run in expert order (`dispatch_order`); a capacity
(model.capacity_factor) caps the pairs an expert takes (`expert_capacity`).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lm.config import ModelConfig


class RouterBias(nnx.Variable):
    """DeepSeek-V3's selection bias of one router, [X] float32 (model.router_bias_update).

    Not a parameter: no gradient, no optimizer state, no weight decay. The train state holds it beside the
    parameters, and the train step moves it after the optimizer (`update_router_biases`)."""


def route(logits_NX: jax.Array, cfg: ModelConfig, bias_X: jax.Array | None = None):
    """(weights_NA float32, experts_NA int32, probabilities_NX): the A experts of each token.

    The bias (DeepSeek-V3's loss-free balancing) only changes which experts are chosen, never the weights.
    `top_k` has no gradient with respect to its input, so none reaches the bias."""
    if cfg.router_score == "softmax":
        scores_NX = jax.nn.softmax(logits_NX, axis=-1)
    else:
        scores_NX = jax.nn.sigmoid(logits_NX)
    choice_NX = scores_NX if bias_X is None else scores_NX + bias_X
    _, experts_NA = jax.lax.top_k(choice_NX, cfg.experts_per_token)
    weights_NA = jnp.take_along_axis(scores_NX, experts_NA, axis=-1)
    if cfg.router_renormalize:
        weights_NA = weights_NA / jnp.maximum(jnp.sum(weights_NA, axis=-1, keepdims=True), 1e-20)
    probabilities_NX = scores_NX / jnp.maximum(jnp.sum(scores_NX, axis=-1, keepdims=True), 1e-20)
    return weights_NA, experts_NA.astype(jnp.int32), probabilities_NX


def expert_capacity(cfg: ModelConfig, tokens: int) -> int | None:
    """Pairs an expert takes: ceil(capacity_factor · tokens · A / X); None when dropless. Exact, for the factor as
    written (its shortest decimal): in binary floats 1.1 · 100 · 2 / 4 is 55.00000000000001, whose ceiling
    would be 56."""
    if cfg.capacity_factor is None:
        return None
    factor = Fraction(repr(cfg.capacity_factor))
    return math.ceil(factor * tokens * cfg.experts_per_token / cfg.num_experts)


def dispatch_order(experts_P: jax.Array, num_experts: int, capacity: int | None):
    """(order_P, group_sizes_X, tokens_per_expert_X): the pairs sorted by expert, stable, the dropped ones last.

    `order_P[r]` is the pair at row r of the grouped GEMM; the first group_sizes_X[0] rows go to expert 0, and
    so on; rows past sum(group_sizes_X) are dropped pairs. tokens_per_expert_X counts before the capacity."""
    order_P = jnp.argsort(experts_P, stable=True)
    tokens_per_expert_X = jnp.bincount(experts_P, length=num_experts)
    if capacity is None:
        return order_P, tokens_per_expert_X, tokens_per_expert_X
    sorted_experts_P = experts_P[order_P]
    starts_X = jnp.cumsum(tokens_per_expert_X) - tokens_per_expert_X
    rank_in_expert_P = jnp.arange(experts_P.shape[0]) - starts_X[sorted_experts_P]
    kept_key_P = jnp.where(rank_in_expert_P < capacity, sorted_experts_P, num_experts)
    order_P = order_P[jnp.argsort(kept_key_P, stable=True)]
    return order_P, jnp.minimum(tokens_per_expert_X, capacity), tokens_per_expert_X


def routing_losses(logits_NX, probabilities_NX, tokens_per_expert_X, pairs: int) -> dict[str, jax.Array]:
    """The unweighted load-balancing loss, z-loss and router entropy (float32 scalars; fp4lm.model.moe's doc)."""
    num_experts = logits_NX.shape[-1]
    share_X = tokens_per_expert_X.astype(jnp.float32) / pairs
    mean_probability_X = jnp.mean(probabilities_NX, axis=0)
    z_N = jax.nn.logsumexp(logits_NX, axis=-1)
    entropy_N = -jnp.sum(probabilities_NX * jnp.log(jnp.maximum(probabilities_NX, 1e-20)), axis=-1)
    return {
        "load_balance": num_experts * jnp.sum(share_X * mean_probability_X),
        "z_loss": jnp.mean(jnp.square(z_N)),
        "entropy": jnp.mean(entropy_N),
    }


def update_router_biases(router_biases: Any, routing: dict[str, dict], rate: float) -> Any:
    """DeepSeek-V3's loss-free balancing, after a step: each block's selection bias moves by `rate` towards
    balance, up for an expert that got fewer tokens than the mean, down for one that got more.

    `router_biases`: the pure dict of the model's RouterBias variables ({"blocks": {1: {"mlp": {"router_bias":
    [X]}}}}); `routing`: {"blocks.1.mlp": that block's RoutingStats value}. Returns a new tree."""
    if not rate:
        return router_biases
    router_biases = jax.tree.map(lambda leaf: leaf, router_biases)  # a new dict tree; the leaves are shared
    for path, stats in routing.items():
        node = router_biases
        for part in path.split("."):
            node = node[int(part) if part.isdigit() and int(part) in node else part]
        load_X = stats["tokens_per_expert"]
        node["router_bias"] = node["router_bias"] + rate * jnp.sign(jnp.mean(load_X) - load_X)
    return router_biases
