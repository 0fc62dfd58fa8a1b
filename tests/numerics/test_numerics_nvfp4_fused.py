"""nvfp4_fused: quantize-dequantize in one pass equals quantize(...).dequantize(...) bit for bit.

Over ~1M float32 bit patterns and boundary values and several tensor families (nvfp4_fused_inputs),
for float32 and bfloat16 input and output, 1x16 blocks and 16x16 tiles, RNE and stochastic rounding
(the same key, so the same bits), with and without the RHT. NaN outputs are compared by bits too.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lm.numerics import nvfp4, nvfp4_fused
from tests.numerics import nvfp4_fused_inputs as inputs

BATCHES = {
    "bit_patterns": lambda: inputs.bit_pattern_batch(768, seed=1),
    "boundaries": lambda: inputs.boundary_batch(192, seed=2),
    "scale_edges": lambda: inputs.scale_edge_batch(64, seed=3),
    "families": lambda: inputs.family_batch(70, seed=4),
}
CASES = list(itertools.product(((1, 16), (16, 16)), ("nearest", "stochastic"), (False, True)))


def _all_batches():
    return np.concatenate([make() for make in BATCHES.values()])


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint16 if x.dtype == jnp.bfloat16 else np.uint32)


def _keys(count):
    return jax.random.split(jax.random.key(7), count)


@pytest.fixture(scope="module")
def tensors():
    return _all_batches()


@pytest.mark.parametrize(
    ("block", "rounding", "hadamard"), CASES, ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v)
)
@pytest.mark.parametrize("in_dtype", [jnp.float32, jnp.bfloat16], ids=["f32_in", "bf16_in"])
def test_fused_equals_quantize_then_dequantize(tensors, block, rounding, hadamard, in_dtype):
    x = jnp.asarray(tensors).astype(in_dtype)
    keys = _keys(x.shape[0])
    options = dict(block=block, rounding=rounding, hadamard=hadamard)

    def both(t, key):
        key = key if rounding == "stochastic" else None
        q = nvfp4.quantize(t, key=key, **options)
        fused = {
            dtype: nvfp4_fused.quantize_dequantize(t, key=key, dtype=dtype, **options)
            for dtype in ("float32", "bfloat16")
        }
        return q.dequantize(jnp.float32), q.dequantize(jnp.bfloat16), fused

    want_f32, want_bf16, got = jax.jit(jax.vmap(both))(x, keys)
    assert x.size >= 1_000_000 - 100_000
    np.testing.assert_array_equal(_bits(got["float32"]), _bits(want_f32))
    np.testing.assert_array_equal(_bits(got["bfloat16"]), _bits(want_bf16))


@pytest.mark.parametrize("block", [(1, 16), (16, 16)], ids=["1x16", "16x16"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_block_scaled_values_and_amax_match_eagerly(block, dtype):
    """quantize_block_scaled (the GEMM operand form), eager, against NVFP4Array.block_scaled and amax."""
    x = jnp.asarray(inputs.family_batch(7, seed=5)[:, :, :]).astype(dtype)
    for t in x:
        q = nvfp4.quantize(t, block=block)
        values, amax = nvfp4_fused.quantize_block_scaled(t, block=block, dtype=jnp.bfloat16)
        np.testing.assert_array_equal(_bits(values), _bits(q.block_scaled(jnp.bfloat16)))
        np.testing.assert_array_equal(_bits(amax), _bits(q.amax))
        np.testing.assert_array_equal(_bits(nvfp4_fused.quantize_dequantize(t, block=block)), _bits(q.dequantize()))


def test_same_errors_as_quantize():
    with pytest.raises(ValueError, match="divisible"):
        nvfp4_fused.quantize_dequantize(jnp.ones((4, 24)))
    with pytest.raises(ValueError, match="PRNG key"):
        nvfp4_fused.quantize_dequantize(jnp.ones((4, 32)), rounding="stochastic")
    with pytest.raises(ValueError, match="dtype"):
        nvfp4_fused.quantize_block_scaled(jnp.ones((4, 32), jnp.int32))
