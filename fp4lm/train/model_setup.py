"""The model as the trainer holds it: a graph definition (structure + precision policy) and pure-dict params.

Precision is part of the graph, not of the parameters: the late switch to bf16 swaps the graph
(`set_policy` on an abstract model) and keeps the parameters, so nothing is copied or re-initialised.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lm.config import Config
from fp4lm.model import Llama, set_policy
from fp4lm.model.moe import set_expert_parallel
from fp4lm.model.routing import RouterBias
from fp4lm.quant import Policy
from fp4lm.sharding import model_shardings


def abstract_model(config: Config, vocab_size: int, policy: Policy) -> Llama:
    """The model with shapes but no values (nothing is initialised)."""
    return nnx.eval_shape(lambda: Llama(config.model, vocab_size, policy, rngs=nnx.Rngs(config.train.seed)))


def graphdef_of(model: Llama) -> nnx.GraphDef:
    # raises if the model had state other than its parameters and the routers' selection biases
    graphdef, _params, _router_biases = nnx.split(model, nnx.Param, RouterBias)
    return graphdef


def graphdef_with_policy(model: Llama, policy: Policy, *, expert_parallel: bool = False) -> nnx.GraphDef:
    """The graph of `model` with another precision policy (the parameters are untouched); `expert_parallel`:
    its MoE blocks run their experts split over the step's mesh (fp4lm.model.expert_parallel)."""
    model = set_policy(model, policy)
    set_expert_parallel(model, expert_parallel)
    return graphdef_of(model)


def init_params(config: Config, vocab_size: int, policy: Policy) -> dict:
    """Freshly initialised float32 parameters as a pure dict (call under jit with out_shardings)."""
    model = Llama(config.model, vocab_size, policy, rngs=nnx.Rngs(config.train.seed))
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def initial_router_biases(model: Llama) -> dict:
    """The MoE routers' selection biases (model.router_bias_update) at the start, zeros, as a pure dict
    ({} without them); `model` may be abstract."""
    biases = nnx.to_pure_dict(nnx.state(model, RouterBias))
    return jax.tree.map(lambda bias: jnp.zeros(bias.shape, bias.dtype), biases)


def param_shardings(model: Llama, mesh) -> dict:
    """NamedSharding per parameter, as a pure dict matching the params."""
    return nnx.to_pure_dict(model_shardings(nnx.state(model, nnx.Param), mesh))


def planned_bf16_switch(bf16_after: float | None, steps: int) -> int | None:
    """The step count after which quantized layers run in bf16: `bf16_after` of `steps` (None: no switch)."""
    if bf16_after is None:
        return None
    return int(round(bf16_after * steps))


def bf16_switch_step(config: Config) -> int | None:
    """The switch `config` plans (`precision.bf16_after` of train.steps); a run that already switched keeps its
    own step (`bf16_switch_made`), whatever train.steps says now."""
    return planned_bf16_switch(config.precision.bf16_after, config.train.steps)


def bf16_switch_made(step: int, saved_config: dict, record: dict | None) -> int | None:
    """The step after which the run of a checkpoint of `step` steps switched to bf16 (None: not yet), as the
    checkpoint records it (`record`); a checkpoint saved before the record existed, from its own config."""
    if record is not None:
        return record.get("bf16_after_step")
    planned = planned_bf16_switch(saved_config.get("precision", {}).get("bf16_after"), saved_config["train"]["steps"])
    return planned if planned is not None and step > planned else None


def policy_at(step: int, config: Config, quantized: Policy, *, switch: int | None = None) -> Policy:
    """The policy for the step that follows `step` completed steps; `switch`: the run's switch step where it is
    known (`bf16_switch_made`, fp4lm.train.bf16_switch), else the one `config` plans."""
    switch = switch if switch is not None else bf16_switch_step(config)
    if switch is not None and step >= switch:
        return Policy.bf16(config.model.num_layers)
    return quantized


def count_params(params: dict) -> int:
    return sum(int(leaf.size) for leaf in jax.tree.leaves(params))
