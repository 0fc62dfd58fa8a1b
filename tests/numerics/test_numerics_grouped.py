"""The segment-aware quantizers: each group of a padded buffer is coded as the dense quantizer codes it alone.

For every format, group x's values (and its global scale) in `quantize_groups`' output equal, bit for bit,
those of `numerics.quantize` applied to group x's rows by themselves, padded with zero rows to the layout's
multiple (or to their transpose, blocks and the RHT along the rows), with stochastic rounding drawing the bits
that the group's own key draws for that tensor.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lm import numerics
from fp4lm.numerics.group_layout import GroupLayout
from fp4lm.numerics.grouped import quantize_groups
from fp4lm.numerics.nvfp4 import tensor_decode_scale
from fp4lm.numerics.rounding import random_bits_seeds

GROUPS = (5, 0, 45, 17)  # an empty group, groups of less than one block and of more than one
FEATURES, MULTIPLE = 64, 32


def rows_and_layout():
    keys = jax.random.split(jax.random.key(0), len(GROUPS))
    scales = (1.0, 1.0, 30.0, 1e-3)  # groups of different magnitudes: a shared amax would show
    rows = jnp.concatenate(
        [jax.random.normal(k, (n, FEATURES), jnp.float32) * s for k, n, s in zip(keys, GROUPS, scales, strict=True)]
    ).astype(jnp.bfloat16)
    layout = GroupLayout.of(jnp.asarray(GROUPS), rows.shape[0], MULTIPLE)
    return rows, layout


def dense_values(q):
    """(the values an emulated GEMM multiplies, the global scale) of a dense quantized tensor."""
    if isinstance(q, numerics.NVFP4Array):
        return q.block_scaled(jnp.bfloat16), tensor_decode_scale(q.amax)
    if isinstance(q, numerics.MXArray):
        return q.data.astype(jnp.bfloat16) * jnp.repeat(q.scales.astype(jnp.bfloat16), 32, axis=-1), None
    return q.data.astype(jnp.bfloat16), q.scale_inv


CASES = [
    ("nvfp4", (1, 16), False, False, False),
    ("nvfp4", (16, 16), False, False, False),
    ("nvfp4", (1, 16), True, False, True),  # wgrad's dY: RHT and stochastic rounding along the rows
    ("nvfp4", (16, 16), True, True, False),
    ("mxfp8", (1, 32), False, False, False),
    ("mxfp8", (1, 32), True, False, False),
    ("fp8_e4m3", (1, 16), False, False, False),
    ("fp8_e5m2", (1, 16), True, True, False),
]


@pytest.mark.parametrize("format, block, transposed, hadamard, stochastic", CASES)
def test_each_group_is_the_dense_quantizer_of_that_group_alone(format, block, transposed, hadamard, stochastic):
    rows, layout = rows_and_layout()
    group_keys = jax.random.split(jax.random.key(1), len(GROUPS))
    seeds = None
    if stochastic:
        seeds = jnp.concatenate([jax.vmap(random_bits_seeds)(group_keys), jnp.zeros((1, 2), jnp.uint32)])
    values, scale = quantize_groups(
        layout.pad(rows), layout, format, block=block, hadamard=hadamard, transposed=transposed, seeds_X2=seeds
    )
    starts, sizes, first = np.asarray(layout.padded_starts_X), np.asarray(layout.padded_sizes_X), 0
    for group, size in enumerate(GROUPS):
        if size == 0:
            first += size
            continue
        alone = jnp.pad(rows[first : first + size], ((0, -size % MULTIPLE), (0, 0)))
        tensor = alone.T if transposed else alone
        q = numerics.quantize(
            tensor,
            format,
            block=block,
            hadamard=hadamard,
            rounding="stochastic" if stochastic else "nearest",
            key=group_keys[group] if stochastic else None,
        )
        want, want_scale = dense_values(q)
        window = slice(starts[group], starts[group] + sizes[group])
        got = values[:, window] if transposed else values[window]
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32), err_msg=str(group))
        if want_scale is not None:
            assert scale is not None and float(scale[group]) == float(want_scale), group
        first += size


def test_a_format_without_a_segment_aware_quantizer_is_refused():
    rows, layout = rows_and_layout()
    with pytest.raises(ValueError, match=r"no segment-aware quantizer for format 'mxfp4'"):
        quantize_groups(layout.pad(rows), layout, "mxfp4")
    with pytest.raises(ValueError, match=r"stochastic rounding of groups is implemented for nvfp4 only"):
        quantize_groups(layout.pad(rows), layout, "mxfp8", seeds_X2=jnp.zeros((len(GROUPS) + 1, 2), jnp.uint32))
