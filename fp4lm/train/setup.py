"""Setting a run up: everything train, eval and sample build the same way from a config and a mesh.

`build_run(config, mesh, quantized_policy)` gives the abstract model (shapes only), the optimizer and its
learning-rate schedule, the loss scaler, the shape of the training state and the sharding of every leaf.
From those, `restore_target()` is what a checkpoint restores into and `fresh_state()` a new run's state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import optax
from jax.sharding import Mesh

from fp4lm.config import Config
from fp4lm.model import Llama
from fp4lm.quant import Policy
from fp4lm.tokenizer import planned_model_vocab_size
from fp4lm.train import model_setup
from fp4lm.train.loss_scale import LossScaler
from fp4lm.train.optimizer import build_optimizer, learning_rate_schedule
from fp4lm.train.state import TrainState, init_train_state, state_shardings


@dataclasses.dataclass(frozen=True)
class RunSetup:
    config: Config
    mesh: Mesh
    quantized_policy: Policy  # the policy before any late switch to bf16
    model: Llama  # abstract: shapes, no values
    paths: list[str]  # the model's linear layers, in execution order
    optimizer: optax.GradientTransformation
    schedule: Callable  # learning rate of an update count
    scaler: LossScaler
    abstract_state: TrainState  # jax.ShapeDtypeStruct leaves
    state_shardings: TrainState  # a NamedSharding per leaf
    init: Callable[[], TrainState]  # a fresh state (call under jit with out_shardings=state_shardings)

    def restore_target(self) -> TrainState:
        """The abstract state with each leaf's sharding: what a checkpoint is restored into."""
        return jax.tree.map(
            lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
            self.abstract_state,
            self.state_shardings,
        )

    def fresh_state(self) -> TrainState:
        """A newly initialised state, placed as `state_shardings` says. With `train.init_from`, the parameters
        are the Hugging Face checkpoint's (fp4lm.hf.init_from), with a fresh optimizer state, at step 0."""
        init_from = self.config.train.init_from
        if not init_from:
            return jax.jit(self.init, out_shardings=self.state_shardings)()
        from fp4lm.hf.init_from import read_params

        params = read_params(init_from, self.config, self.abstract_state.params)
        params = jax.device_put(params, self.state_shardings.params)
        seed = self.config.train.seed

        def init(params: dict) -> TrainState:
            router_biases = model_setup.initial_router_biases(self.model)
            return init_train_state(params, self.optimizer, self.scaler, seed, router_biases)

        return jax.jit(init, out_shardings=self.state_shardings)(params)


def build_run(config: Config, mesh: Mesh, quantized_policy: Policy, vocab_size: int | None = None) -> RunSetup:
    """The pieces of a run of `config` on `mesh` (nothing is initialised; see `RunSetup.fresh_state`).
    `vocab_size`: the model's vocabulary, which follows the run's tokenizer (`fp4lm.data.Data.vocab_size`);
    None: as planned from the config alone (`planned_model_vocab_size`)."""
    if vocab_size is None:
        vocab_size = planned_model_vocab_size(config.data)
    model = model_setup.abstract_model(config, vocab_size, quantized_policy)
    paths = model.linear_paths()
    total = config.train.steps
    optimizer = build_optimizer(config.optimizer, total)
    any_quantized = any(quantized_policy.recipe_for(p).is_quantized for p in paths)
    scaler = LossScaler.from_config(config.loss_scale, recipe_is_quantized=any_quantized)

    def init() -> TrainState:
        params = model_setup.init_params(config, vocab_size, quantized_policy)
        router_biases = model_setup.initial_router_biases(model)
        return init_train_state(params, optimizer, scaler, config.train.seed, router_biases)

    abstract_state = jax.eval_shape(init)
    shardings = state_shardings(optimizer, abstract_state, model_setup.param_shardings(model, mesh), mesh)
    return RunSetup(
        config=config,
        mesh=mesh,
        quantized_policy=quantized_policy,
        model=model,
        paths=paths,
        optimizer=optimizer,
        schedule=learning_rate_schedule(config.optimizer, total),
        scaler=scaler,
        abstract_state=abstract_state,
        state_shardings=shardings,
        init=init,
    )
