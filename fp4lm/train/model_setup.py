"""The model as the trainer holds it: a graph definition (structure + precision policy) and pure-dict params.

Precision is part of the graph, not of the parameters: the late switch to bf16 swaps the graph
(`set_policy` on an abstract model) and keeps the parameters, so nothing is copied or re-initialised.
"""

from __future__ import annotations

import jax
from flax import nnx

from fp4lm.config import Config
from fp4lm.model import Llama, set_policy
from fp4lm.quant import Policy
from fp4lm.sharding import model_shardings


def abstract_model(config: Config, vocab_size: int, policy: Policy) -> Llama:
    """The model with shapes but no values (nothing is initialised)."""
    return nnx.eval_shape(lambda: Llama(config.model, vocab_size, policy, rngs=nnx.Rngs(config.train.seed)))


def graphdef_of(model: Llama) -> nnx.GraphDef:
    graphdef, _params = nnx.split(model, nnx.Param)  # raises if the model had state other than Param
    return graphdef


def graphdef_with_policy(model: Llama, policy: Policy) -> nnx.GraphDef:
    """The graph of `model` with another precision policy (the parameters are untouched)."""
    return graphdef_of(set_policy(model, policy))


def init_params(config: Config, vocab_size: int, policy: Policy) -> dict:
    """Freshly initialised float32 parameters as a pure dict (call under jit with out_shardings)."""
    model = Llama(config.model, vocab_size, policy, rngs=nnx.Rngs(config.train.seed))
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def param_shardings(model: Llama, mesh) -> dict:
    """NamedSharding per parameter, as a pure dict matching the params."""
    return nnx.to_pure_dict(model_shardings(nnx.state(model, nnx.Param), mesh))


def bf16_switch_step(config: Config) -> int | None:
    """The step count after which quantized layers run in bf16 (`precision.bf16_after` of train.steps)."""
    if config.precision.bf16_after is None:
        return None
    return int(round(config.precision.bf16_after * config.train.steps))


def policy_at(step: int, config: Config, quantized: Policy) -> Policy:
    """The policy for the step that follows `step` completed steps."""
    switch = bf16_switch_step(config)
    if switch is not None and step >= switch:
        return Policy.bf16(config.model.num_layers)
    return quantized


def count_params(params: dict) -> int:
    return sum(int(leaf.size) for leaf in jax.tree.leaves(params))
