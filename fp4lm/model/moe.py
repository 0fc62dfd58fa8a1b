"""Mixture-of-experts MLP: a float32 router sends each token to A of X SwiGLU experts, run as grouped GEMMs.

For the N tokens of a step (the batch flattened) and X experts of hidden width M:

    logits_NX = x_ND @ router_DX                    float32, never quantized
    weights_NA, experts_NA = route(logits_NX)       fp4lm.model.routing (top-A, DeepSeek-V3's bias)
    y_ND = sum_a weights_NA * expert_{experts_NA}(x_ND)  (+ the shared experts' SwiGLU of x_ND)

Dispatch. The P = N·A (token, expert) pairs are sorted by expert (`routing.dispatch_order`, a stable sort, so
each expert's tokens keep their order) and the rows x[token] gathered in that order: [P, D], never [N, X, D].
The experts (`fp4lm.model.experts.Experts`) run over those rows, and the rows are scattered back to their
pairs and summed with the routing weights in float32. On a run's mesh of several devices the same experts
run split over it (fp4lm.model.expert_parallel; `set_expert_parallel`).

Capacity. Unset (`model.capacity_factor`): dropless, every pair runs. Set to c: an expert takes at most
ceil(c · N·A / X) pairs, the first in token order; the rest are dropped (sorted past the groups, where the
grouped GEMM writes zeros), so a dropped pair adds nothing and its token keeps its residual.

Losses and telemetry (`RoutingStats`, one per MoE block, taken out of the model by `pop_routing_stats`):
- load balance (Switch Transformer): X · Σ_e f_e · P_e, f_e the share of pairs sent to e and P_e the mean
  router probability of e over the N tokens (probabilities normalised to sum to 1 per token); 1 when
  balanced. Its gradient reaches the router through P. Computed over the whole (global) batch of the step.
- z-loss (ST-MoE): mean over tokens of logsumexp(logits)², keeping the logits small.
- `aux_loss`: the two weighted by model.load_balance_loss and model.router_z_loss, added to the training loss.
- tokens per expert (before capacity), dropped pairs, and the mean entropy of the router's distribution.
With gradient accumulation each micro-batch is a batch here: its own balance, averaged over the step.
The per-expert quantization telemetry (each ExpertKernel's `{path}.{e}` rows) measures each expert's group of
tokens as the grouped GEMM quantizes it; under expert parallelism (fp4lm/model/expert_parallel.py) on the
device that runs the expert, gathered into the same rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lm.config import ModelConfig
from fp4lm.linear_layers import LinearLayer
from fp4lm.model import expert_parallel
from fp4lm.model.experts import ExpertKernel, Experts
from fp4lm.model.layers import COMPUTE_DTYPE, LayerStats, make_param
from fp4lm.model.mlp import SwiGLU
from fp4lm.model.routing import RouterBias, dispatch_order, expert_capacity, route, routing_losses
from fp4lm.quant.policy import Policy


class RoutingStats(nnx.Variable):
    """What one MoE block's router did in the last call: {name: array} (see the module doc).

    Written on every call; `pop_routing_stats` takes it out of the model (the train step adds `aux_loss`
    to the loss and logs the rest)."""


class MoE(nnx.Module):
    """Routed SwiGLU experts (and optional shared experts) in place of a block's MLP (see the module doc).

    `layers` maps "experts.gate", "experts.up", "experts.down" (and "shared.*") to their LinearLayer. The
    routed experts' kernels are `gate`, `up`, `down` (parameters blocks.{i}.mlp.gate.kernel, ...).
    `expert_parallel`: run the experts split over the step's mesh (`set_expert_parallel`)."""

    def __init__(self, cfg: ModelConfig, *, layers: dict[str, LinearLayer], policy: Policy, rngs: nnx.Rngs):
        self.cfg = cfg
        self.expert_parallel = False
        self.router = make_param(rngs.params(), (cfg.d_model, cfg.num_experts), cfg.init_std, ("embed", None))
        if cfg.router_bias_update:
            zeros = jnp.zeros((cfg.num_experts,), jnp.float32)
            self.router_bias = RouterBias(zeros, out_sharding=(None,), eager_sharding=False)
        self.gate = ExpertKernel(layers["experts.gate"], policy=policy, rngs=rngs)
        self.up = ExpertKernel(layers["experts.up"], policy=policy, rngs=rngs)
        self.down = ExpertKernel(layers["experts.down"], policy=policy, rngs=rngs)
        self.shared = nnx.data(None)
        if cfg.num_shared_experts:
            shared = {name.split(".")[1]: layer for name, layer in layers.items() if name.startswith("shared.")}
            self.shared = nnx.data(SwiGLU(layers=shared, policy=policy, rngs=rngs))

    def __call__(self, x_BTD: jax.Array, *, quant_key: jax.Array | None = None) -> jax.Array:
        cfg = self.cfg
        batch, length, d_model = x_BTD.shape
        x_ND = x_BTD.reshape(-1, d_model)
        tokens, per_token = x_ND.shape[0], cfg.experts_per_token
        logits_NX = jnp.dot(x_ND.astype(jnp.float32), self.router[...], precision=jax.lax.Precision.HIGHEST)
        bias_X = self.router_bias[...] if cfg.router_bias_update else None
        weights_NA, experts_NA, probabilities_NX = route(logits_NX, cfg, bias_X)

        capacity = expert_capacity(cfg, tokens)
        kernels = (self.gate, self.up, self.down)
        experts = Experts.of(kernels)
        weights = tuple(kernel.weight() for kernel in kernels)
        keys = tuple(kernel.layer_key(quant_key) for kernel in kernels)
        if self.expert_parallel:
            mesh = expert_parallel.expert_mesh(tokens)
            tokens_per_expert_X = jnp.bincount(experts_NA.reshape(-1), length=cfg.num_experts)
            group_sizes_X = tokens_per_expert_X if capacity is None else jnp.minimum(tokens_per_expert_X, capacity)
            y_ND, expert_stats = expert_parallel.routed_experts(
                mesh, experts, x_ND, weights_NA, experts_NA, weights, keys, capacity=capacity
            )
        else:
            order_R, group_sizes_X, tokens_per_expert_X = dispatch_order(
                experts_NA.reshape(-1), cfg.num_experts, capacity
            )
            y_RD, expert_stats = experts(x_ND[order_R // per_token], group_sizes_X, weights, keys)
            y_PD = jnp.zeros_like(y_RD).at[order_R].set(y_RD)  # back to (token, choice) order
            y_NAD = y_PD.reshape(tokens, per_token, d_model).astype(jnp.float32)
            y_ND = jnp.einsum("na,nad->nd", weights_NA, y_NAD)
        for kernel in kernels:  # each expert's row; under expert parallelism from the device that ran it
            if kernel.collect_stats and kernel.path in expert_stats:
                kernel.stats = LayerStats(_rows_by_expert(expert_stats[kernel.path], cfg.num_experts))  # pyright: ignore[reportAttributeAccessIssue]
        if self.shared is not None:
            y_ND = y_ND + self.shared(x_ND[None], quant_key=quant_key)[0].astype(jnp.float32)

        losses = routing_losses(logits_NX, probabilities_NX, tokens_per_expert_X, tokens * per_token)
        aux_loss = cfg.load_balance_loss * losses["load_balance"] + cfg.router_z_loss * losses["z_loss"]
        self.routing = RoutingStats(
            {
                **losses,
                "aux_loss": aux_loss,
                "tokens_per_expert": tokens_per_expert_X.astype(jnp.float32),
                "dropped": (tokens * per_token - jnp.sum(group_sizes_X)).astype(jnp.float32),
            }
        )
        return y_ND.reshape(batch, length, d_model).astype(COMPUTE_DTYPE)


def _rows_by_expert(stats: dict, num_experts: int) -> dict[str, dict]:
    """{".{e}": expert e's {operand: {metric}}}: the LayerStats rows of `grouped_layer_stats`' [X] values."""
    return {f".{e}": jax.tree.map(lambda values, e=e: values[e], stats) for e in range(num_experts)}


def set_expert_parallel(model: nnx.Module, enabled: bool = True) -> None:
    """Makes every MoE block of `model` run its experts split over the step's mesh (fp4lm.model.expert_parallel)
    or, with `enabled` False, on global arrays. The trainer turns it on for a run whose mesh has more than one
    device (fp4lm.train.run_functions)."""
    for _, module in nnx.iter_graph(model):
        if isinstance(module, MoE):
            module.expert_parallel = enabled


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
