"""Where stochastic-rounding bits come from: an NNX stream per module, a key per call, never a fixed key."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fp4lm.quant import QuantizedDotGeneral, QuantizedDotModule, dot_general
from tests.quant.fake_quant import gaussian


def test_the_module_draws_from_the_stochastic_rounding_stream_else_default():
    assert dot_general("nvfp4", rngs=nnx.Rngs(0, stochastic_rounding=5)).rngs.tag == "stochastic_rounding"
    assert dot_general("nvfp4", rngs=nnx.Rngs(0)).rngs.tag == "default"
    assert dot_general("nvfp4", rngs=nnx.Rngs(0, params=1).params).rngs.tag == "params"  # a stream as it is
    assert isinstance(dot_general("nvfp4", rngs=nnx.Rngs(0)), QuantizedDotModule)
    assert isinstance(dot_general("nvfp4"), QuantizedDotGeneral)


def linear(recipe: str, seed: int) -> nnx.Linear:
    rngs = nnx.Rngs(seed)
    return nnx.Linear(32, 16, dot_general=dot_general(recipe, rngs=rngs), rngs=rngs)


@nnx.jit
def loss_and_grad(layer, x):
    return nnx.value_and_grad(lambda layer: jnp.mean(jnp.square(layer(x).astype(jnp.float32))))(layer)


def test_nnx_value_and_grad_advances_the_stream_once_per_call_and_seeds_replay():
    x = gaussian(0, (32, 32))
    a, b = linear("nvfp4", 3), linear("nvfp4", 3)
    assert int(a.dot_general.rngs.count[...]) == 0
    steps_a = [loss_and_grad(a, x) for _ in range(2)]
    assert int(a.dot_general.rngs.count[...]) == 2  # part of the layer's graph: nnx.jit writes the count back
    steps_b = [loss_and_grad(b, x) for _ in range(2)]
    (loss_1, grad_1), (loss_2, grad_2) = steps_a
    assert float(loss_1) == float(loss_2)  # nvfp4's forward pass rounds to nearest
    assert not np.array_equal(grad_1.kernel[...], grad_2.kernel[...])
    for (_, want), (_, got) in zip(steps_a, steps_b, strict=True):
        np.testing.assert_array_equal(got.kernel[...], want.kernel[...])


def test_a_recipe_without_stochastic_rounding_draws_nothing():
    layer = linear("nvfp4_no_sr", 0)
    loss_and_grad(layer, gaussian(1, (32, 32)))
    assert int(layer.dot_general.rngs.count[...]) == 0


def test_no_key_raises_only_where_bits_would_be_drawn():
    dot = dot_general("nvfp4", name="blocks.0.mlp.up")
    x, kernel = gaussian(2, (32, 32), jnp.bfloat16), gaussian(3, (32, 16), jnp.bfloat16)
    dims = (((1,), (0,)), ((), ()))
    assert dot(x, kernel, dims).shape == (32, 16)  # evaluation and sampling need no key
    with pytest.raises(ValueError, match=r"layer 'blocks\.0\.mlp\.up': recipe 'nvfp4' .* pass key="):
        jax.eval_shape(jax.grad(lambda x: jnp.sum(dot(x, kernel, dims))), x)
    jax.eval_shape(jax.grad(lambda x: jnp.sum(dot_general("nvfp4_no_sr")(x, kernel, dims))), x)
