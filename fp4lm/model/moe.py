"""Mixture-of-experts MLP: a float32 router sends each token to k of X SwiGLU experts, run as grouped GEMMs.

For the N tokens of a step (the batch flattened) and X experts of hidden width M:

    logits_NX = x_ND @ router_DX                    float32, never quantized
    scores_NX = softmax(logits) | sigmoid(logits)   model.router_score
    experts_NK = top_k(scores + bias)               the bias only with model.router_bias_update (DeepSeek-V3)
    weights_NK = scores at experts_NK               rescaled to sum to 1 with model.router_renormalize
    y_ND = sum_k weights_NK * expert_{experts_NK}(x_ND)  (+ the shared experts' SwiGLU of x_ND)

Dispatch. The N·K (token, expert) pairs are sorted by expert (a stable sort, so each expert's tokens keep
their order) and the rows x[token] gathered in that order: [N·K, D], never [N, X, D]. Each projection then
runs once over all experts as `fp4lm.quant.grouped.grouped_dot` with one group of rows per expert, under the
precision policy's recipe for `blocks.{i}.mlp.experts.{gate,up,down}` (each expert its own quantized tensor).
The rows are scattered back to their pairs and summed with the routing weights in float32.

Capacity. Unset (`model.capacity_factor`): dropless, every pair runs. Set to c: an expert takes at most
ceil(c · N·K / X) pairs, the first in token order; the rest are dropped (sorted past the groups, where the
grouped GEMM writes zeros), so a dropped pair adds nothing and its token keeps its residual.

Losses and telemetry (`RoutingStats`, one per MoE block, taken out of the model by `pop_routing_stats`):
- load balance (Switch Transformer): X · Σ_e f_e · P_e, f_e the share of pairs sent to e and P_e the mean
  router probability of e over the N tokens (probabilities normalised to sum to 1 per token); 1 when
  balanced. Its gradient reaches the router through P. Computed over the whole (global) batch of the step.
- z-loss (ST-MoE): mean over tokens of logsumexp(logits)², keeping the logits small.
- `aux_loss`: the two weighted by model.load_balance_loss and model.router_z_loss, added to the training loss.
- tokens per expert (before capacity), dropped pairs, and the mean entropy of the router's distribution.
With gradient accumulation each micro-batch is a batch here: its own balance, averaged over the step.
The per-expert quantization telemetry (GroupedLinear's `{path}.{e}` rows) measures each expert's group of
tokens as the grouped GEMM quantizes it; under expert parallelism (fp4lm/model/expert_parallel.py) on the
device that runs the expert, gathered into the same rows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lm.config import ModelConfig
from fp4lm.linear_layers import LinearLayer
from fp4lm.model import expert_parallel
from fp4lm.model.layers import COMPUTE_DTYPE, LayerStats, QuantLinear, make_param
from fp4lm.model.mlp import SwiGLU
from fp4lm.numerics.formats import abs_max
from fp4lm.quant.grouped import grouped_dot
from fp4lm.quant.policy import Policy
from fp4lm.quant.recipes import Recipe
from fp4lm.quant.stats import grouped_layer_stats


class RoutingStats(nnx.Variable):
    """What one MoE block's router did in the last call: {name: array} (see the module doc).

    Written on every call; `pop_routing_stats` takes it out of the model (the train step adds `aux_loss`
    to the loss and logs the rest)."""


class GroupedLinear(QuantLinear):
    """The routed experts' projection: X kernels [X, in, out], applied to rows sorted by expert.

    A QuantLinear (path, policy, seed, telemetry switch) whose matmul is the grouped GEMM: expert e's rows
    are multiplied by kernel e under the policy's recipe for `path`, each expert its own quantized tensor.
    It holds the kernels and is not called itself: MoE runs its `projection()` over its `weight()` (one
    path for one device and for expert parallelism, `expert_hidden_rows`). With telemetry on, each
    expert's operands are measured alone (`grouped_layer_stats`) and reported as `{path}.{e}`.
    """

    def __init__(self, layer: LinearLayer, *, policy: Policy, rngs: nnx.Rngs):
        self.path = layer.path
        self.policy = policy
        self.collect_stats = False
        shape = (layer.experts, layer.in_features, layer.out_features)
        self.kernel = make_param(rngs.params(), shape, layer.init_std, layer.logical_axes)

    def projection(self) -> ExpertProjection:
        return ExpertProjection(self.path, self.policy.recipe_for(self.path), self.policy.shared_weight_scale)

    def layer_key(self, quant_key: jax.Array | None) -> jax.Array | None:
        """The step's key folded with this layer's seed (QuantLinear's), before the expert index."""
        return None if quant_key is None else jax.random.fold_in(quant_key, self.layer_seed())

    def stats_by_path(self, stats: dict) -> dict[str, dict]:
        """{"{path}.{e}": expert e's {operand: {metric}}}: the per-expert rows of `grouped_layer_stats`."""
        experts = self.kernel.shape[0]
        return {f"{self.path}.{e}": jax.tree.map(lambda values, e=e: values[e], stats) for e in range(experts)}


@dataclasses.dataclass(frozen=True)
class ExpertProjection:
    """One of the experts' three projections as a pure function of its kernels (static: path and recipe), so
    that expert parallelism (fp4lm.model.expert_parallel) can run it on a device's slice of the experts."""

    path: str
    recipe: Recipe
    shared_weight_scale: bool = False  # precision.shared_weight_scale: each expert's gate and up share an amax

    def apply(
        self,
        x_RD: jax.Array,
        w_XDN: jax.Array,
        group_sizes_X: jax.Array,
        key: jax.Array | None,
        first_expert=0,
        weight_amax: jax.Array | None = None,
    ) -> jax.Array:
        """y [rows, out] in bfloat16; `w_XDN` holds experts first_expert, first_expert + 1, ... of the layer."""
        x_RD = x_RD.astype(COMPUTE_DTYPE)
        y_RN = grouped_dot(
            x_RD,
            w_XDN,
            group_sizes_X,
            self.recipe,
            key=key,
            name=self.path,
            first_expert=first_expert,
            weight_amax=weight_amax,
        )
        return y_RN.astype(COMPUTE_DTYPE)


def expert_gate_up_amax(gate: ExpertProjection, up: ExpertProjection, w_gate_XDM, w_up_XDM) -> jax.Array | None:
    """Each expert's one weight amax for its gate and up projections, [X] float32, when the policy shares
    the global scale of a fused group (precision.shared_weight_scale), as the dense SwiGLU's gate/up share
    one: serving engines fuse an expert's gate and up into one GEMM with one global scale. None when the
    policy does not share, or neither projection is quantized."""
    if not gate.shared_weight_scale or not (gate.recipe.is_quantized or up.recipe.is_quantized):
        return None
    return jnp.maximum(abs_max(w_gate_XDM, axis=(1, 2)), abs_max(w_up_XDM, axis=(1, 2)))


def route(logits_NX: jax.Array, cfg: ModelConfig, bias_X: jax.Array | None = None):
    """(weights_NK float32, experts_NK int32, probabilities_NX): the top-k experts of each token.

    The bias (DeepSeek-V3's loss-free balancing) only changes which experts are chosen, never the weights,
    and carries no gradient."""
    if cfg.router_score == "softmax":
        scores = jax.nn.softmax(logits_NX, axis=-1)
    else:
        scores = jax.nn.sigmoid(logits_NX)
    choice = scores if bias_X is None else scores + jax.lax.stop_gradient(bias_X)
    _, experts_NK = jax.lax.top_k(choice, cfg.experts_per_token)
    weights_NK = jnp.take_along_axis(scores, experts_NK, axis=-1)
    if cfg.router_renormalize:
        weights_NK = weights_NK / jnp.maximum(jnp.sum(weights_NK, axis=-1, keepdims=True), 1e-20)
    probabilities_NX = scores / jnp.maximum(jnp.sum(scores, axis=-1, keepdims=True), 1e-20)
    return weights_NK, experts_NK.astype(jnp.int32), probabilities_NX


def expert_capacity(cfg: ModelConfig, tokens: int) -> int | None:
    """Pairs an expert takes: ceil(capacity_factor · tokens · k / X); None when dropless. Exact, for the factor as
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
    order = jnp.argsort(experts_P, stable=True)
    tokens_per_expert = jnp.bincount(experts_P, length=num_experts)
    if capacity is None:
        return order, tokens_per_expert, tokens_per_expert
    sorted_experts = experts_P[order]
    starts = jnp.cumsum(tokens_per_expert) - tokens_per_expert
    rank_in_expert = jnp.arange(experts_P.shape[0]) - starts[sorted_experts]
    kept_key = jnp.where(rank_in_expert < capacity, sorted_experts, num_experts)
    order = order[jnp.argsort(kept_key, stable=True)]
    return order, jnp.minimum(tokens_per_expert, capacity), tokens_per_expert


def expert_swiglu(x_RD: jax.Array, gate: Callable, up: Callable, down: Callable) -> jax.Array:
    """down(silu(gate(x)) * up(x)) [rows, D] in bfloat16 for rows sorted by expert, the product formed in
    float32; `gate`, `up`, `down` map rows to rows (the grouped projections)."""
    hidden_RM = jax.nn.silu(gate(x_RD).astype(jnp.float32)) * up(x_RD).astype(jnp.float32)
    return down(hidden_RM.astype(COMPUTE_DTYPE))


def expert_hidden_rows(
    x_RD, group_sizes_X, projections, kernels, keys, first_expert=0, *, with_stats: bool = False
) -> tuple[jax.Array, dict]:
    """(`expert_swiglu` of pure projections, telemetry): `projections`, `kernels` (bfloat16 [X, in, out], a
    slice of the experts starting at `first_expert`) and `keys` are (gate, up, down)'s. With `with_stats`,
    the telemetry is {path: `grouped_layer_stats`} of each quantized projection (one row per expert of the
    slice); else {}."""
    gate_up_amax = expert_gate_up_amax(projections[0], projections[1], kernels[0], kernels[1])
    inputs = {}

    def apply(projection: ExpertProjection, w, key, amax):
        def run(rows):
            inputs[projection.path] = rows
            return projection.apply(rows, w, group_sizes_X, key, first_expert=first_expert, weight_amax=amax)

        return run

    gate, up, down = (
        apply(p, w, k, amax)
        for p, w, k, amax in zip(projections, kernels, keys, (gate_up_amax, gate_up_amax, None), strict=True)
    )
    y_RD = expert_swiglu(x_RD, gate, up, down)
    if not with_stats:
        return y_RD, {}
    return y_RD, {
        p.path: grouped_layer_stats(inputs[p.path].astype(COMPUTE_DTYPE), w, group_sizes_X, p.recipe)
        for p, w in zip(projections, kernels, strict=True)
        if p.recipe.is_quantized
    }


def routing_losses(logits_NX, probabilities_NX, tokens_per_expert_X, pairs: int) -> dict[str, jax.Array]:
    """The unweighted load-balancing loss, z-loss and router entropy (float32 scalars; module doc)."""
    num_experts = logits_NX.shape[-1]
    share_X = tokens_per_expert_X.astype(jnp.float32) / pairs
    mean_probability_X = jnp.mean(probabilities_NX, axis=0)
    z = jax.nn.logsumexp(logits_NX, axis=-1)
    entropy = -jnp.sum(probabilities_NX * jnp.log(jnp.maximum(probabilities_NX, 1e-20)), axis=-1)
    return {
        "load_balance": num_experts * jnp.sum(share_X * mean_probability_X),
        "z_loss": jnp.mean(jnp.square(z)),
        "entropy": jnp.mean(entropy),
    }


class MoE(nnx.Module):
    """Routed SwiGLU experts (and optional shared experts) in place of a block's MLP (see the module doc).

    `layers` maps "experts.gate", "experts.up", "experts.down" (and "shared.*") to their LinearLayer."""

    def __init__(self, cfg: ModelConfig, *, layers: dict[str, LinearLayer], policy: Policy, rngs: nnx.Rngs):
        self.cfg = cfg
        self.router = make_param(rngs.params(), (cfg.d_model, cfg.num_experts), cfg.init_std, ("embed", None))
        if cfg.router_bias_update:
            zeros = jnp.zeros((cfg.num_experts,), jnp.float32)
            self.router_bias = nnx.Param(zeros, out_sharding=(None,), eager_sharding=False)
        self.gate = GroupedLinear(layers["experts.gate"], policy=policy, rngs=rngs)
        self.up = GroupedLinear(layers["experts.up"], policy=policy, rngs=rngs)
        self.down = GroupedLinear(layers["experts.down"], policy=policy, rngs=rngs)
        self.shared = nnx.data(None)
        if cfg.num_shared_experts:
            shared = {name.split(".")[1]: layer for name, layer in layers.items() if name.startswith("shared.")}
            self.shared = nnx.data(SwiGLU(layers=shared, policy=policy, rngs=rngs))

    def __call__(self, x_BTD: jax.Array, *, quant_key: jax.Array | None = None) -> jax.Array:
        cfg = self.cfg
        batch, length, d_model = x_BTD.shape
        x_ND = x_BTD.reshape(-1, d_model)
        tokens, k = x_ND.shape[0], cfg.experts_per_token
        logits_NX = jnp.dot(x_ND.astype(jnp.float32), self.router[...], precision=jax.lax.Precision.HIGHEST)
        bias = self.router_bias[...] if cfg.router_bias_update else None
        weights_NK, experts_NK, probabilities_NX = route(logits_NX, cfg, bias)

        capacity = expert_capacity(cfg, tokens)
        modules = (self.gate, self.up, self.down)
        projections = tuple(m.projection() for m in modules)
        kernels = tuple(m.weight() for m in modules)
        keys = tuple(m.layer_key(quant_key) for m in modules)
        with_stats = any(m.collect_stats for m in modules)
        mesh = expert_parallel.active_mesh(tokens)
        if mesh is None:
            order_R, group_sizes_X, tokens_per_expert_X = dispatch_order(
                experts_NK.reshape(-1), cfg.num_experts, capacity
            )
            y_RD, expert_stats = expert_hidden_rows(
                x_ND[order_R // k], group_sizes_X, projections, kernels, keys, with_stats=with_stats
            )
            y_PD = jnp.zeros_like(y_RD).at[order_R].set(y_RD)  # back to (token, slot) order
            y_NKD = y_PD.reshape(tokens, k, d_model).astype(jnp.float32)
            y_ND = jnp.einsum("nk,nkd->nd", weights_NK, y_NKD)
        else:
            tokens_per_expert_X = jnp.bincount(experts_NK.reshape(-1), length=cfg.num_experts)
            group_sizes_X = tokens_per_expert_X if capacity is None else jnp.minimum(tokens_per_expert_X, capacity)
            y_ND, expert_stats = expert_parallel.routed_experts(
                mesh,
                x_ND,
                weights_NK,
                experts_NK,
                kernels,
                keys,
                capacity=capacity,
                dispatch_order=dispatch_order,
                hidden_rows=lambda x_RD, sizes, kernels, keys, first: expert_hidden_rows(
                    x_RD, sizes, projections, kernels, keys, first, with_stats=with_stats
                ),
            )
        for module in modules:  # each expert's row; under expert parallelism from the device that ran it
            if module.collect_stats and module.path in expert_stats:
                module.stats = LayerStats(expert_stats[module.path])
        if self.shared is not None:
            y_ND = y_ND + self.shared(x_ND[None], quant_key=quant_key)[0].astype(jnp.float32)

        losses = routing_losses(logits_NX, probabilities_NX, tokens_per_expert_X, tokens * k)
        aux_loss = cfg.load_balance_loss * losses["load_balance"] + cfg.router_z_loss * losses["z_loss"]
        self.routing = RoutingStats(
            {
                **losses,
                "aux_loss": aux_loss,
                "tokens_per_expert": tokens_per_expert_X.astype(jnp.float32),
                "dropped": (tokens * k - jnp.sum(group_sizes_X)).astype(jnp.float32),
            }
        )
        return y_ND.reshape(batch, length, d_model).astype(COMPUTE_DTYPE)


def pop_routing_stats(model: nnx.Module) -> dict[str, dict[str, jax.Array]]:
    """{"blocks.{i}.mlp": RoutingStats value} of the last call, removed from the model."""
    popped = nnx.to_flat_state(nnx.pop(model, RoutingStats))
    return {".".join(map(str, path[:-1])): variable.get_value() for path, variable in popped}


def routing_metrics(routing: dict[str, dict]) -> dict[str, dict[str, jax.Array]]:
    """Per MoE block, the scalars logged each step: the busiest expert's tokens over the mean (1 when balanced),
    the share of (token, expert) pairs dropped by the capacity, the losses and the router's entropy."""
    summary = {}
    for path, stats in routing.items():
        load = stats["tokens_per_expert"]
        summary[path] = {
            "max_over_mean_tokens": jnp.max(load) / jnp.maximum(jnp.mean(load), 1e-20),
            "dropped_fraction": stats["dropped"] / jnp.maximum(jnp.sum(load), 1e-20),
            "load_balance": stats["load_balance"],
            "z_loss": stats["z_loss"],
            "aux_loss": stats["aux_loss"],
            "entropy": stats["entropy"],
        }
    return summary


def update_router_biases(params: Any, routing: dict[str, dict], rate: float) -> Any:
    """DeepSeek-V3's loss-free balancing, after a step: each block's selection bias moves by `rate` towards
    balance, up for an expert that got fewer tokens than the mean, down for one that got more."""
    if not rate:
        return params
    params = jax.tree.map(lambda leaf: leaf, params)  # a new dict tree; the leaves are shared
    for path, stats in routing.items():
        node = params
        for part in path.split("."):
            node = node[int(part) if part.isdigit() and int(part) in node else part]
        load = stats["tokens_per_expert"]
        node["router_bias"] = node["router_bias"] + rate * jnp.sign(jnp.mean(load) - load)
    return params
