"""The grouped GEMM at the edges that its fast bit-exactness test (test_grouped_dot.py) does not reach.

- Row chunking (grouped_gemm.chunk_lengths): a padded group of exactly a power-of-two chunk length (256, 512, and
  their sum 768) must be that chunk alone, with no remainder; one block (16 rows) either side takes the
  remainder path or a shorter chunk. Compared bit for bit with the per-expert loop of the dense dot.
- ``first_expert`` (expert parallelism's slice of the experts) under stochastic rounding: expert e of the
  slice draws the bits of global expert ``first_expert + e``, as the per-expert loop over all experts does.

- The static lengths themselves (chunks and wgrad windows), as documented: a wrong set of lengths may still
  compute the right numbers (the lengths only decide the work), so they are checked directly.

These run the loop over the experts (``ragged=False``, the CPU's path) on any device. The first two run
the per-expert loop of bench/grouped_reference.py, written from the definition (the dense
quantized dot on each expert's zero-padded tokens, key ``fold_in(key, expert)``), not from grouped.py.
"""

import functools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench import grouped_reference
from fp4lm import numerics
from fp4lm.numerics.group_layout import GroupLayout, padded_capacity
from fp4lm.numerics.grouped import quantize_groups
from fp4lm.quant import dot_general
from fp4lm.quant.grouped import grouped_dot, uses_ragged_dot
from fp4lm.quant.grouped_gemm import REMAINDER_ROWS, chunk_lengths, window_lengths
from fp4lm.quant.recipes import get_recipe
from tests.quant.fake_quant import LINEAR_DIMS, gaussian, jit
from tests.quant.test_grouped_dot import assert_same_bits, inputs

per_expert_loop = jit(grouped_reference.per_expert_loop, static_argnums=(0, 4))

# Padded to 16 rows: 256, 240, 272, 512, 496, 768. The powers of two alone (512 from 511 tokens too), one block
# short of them (the remainder chunk alone, or the shorter power and the remainder), one block past 256, and
# two powers at once.
POWER_OF_TWO_GROUPS = (256, 240, 257, 511, 496, 768)


@jit(static_argnums=0)
def grouped(recipe, x, w, dy, group_sizes, key, first_expert=0):
    def product(a, b):
        return grouped_dot(a, b, group_sizes, recipe, key=key, first_expert=first_expert, ragged=False)

    y, vjp = jax.vjp(product, x, w)
    return (y, *vjp(dy))


@pytest.mark.parametrize("multiple", [16, 32])
@pytest.mark.parametrize("capacity", [256, 512, 1024, 992, 3968])
def test_the_chunk_lengths_are_the_documented_ones(capacity, multiple):
    """``multiple`` times the powers of two of at least REMAINDER_ROWS rows that fit the buffer, longest first
    (up to the buffer itself when it is one), then every multiple below the shortest of them."""
    large, remainders = chunk_lengths(capacity, multiple)
    powers = [multiple << i for i in range(12) if REMAINDER_ROWS <= multiple << i <= capacity]
    assert large == tuple(reversed(powers))
    assert remainders == tuple(range(multiple, powers[0], multiple))


def test_the_window_lengths_are_the_documented_ones():
    """The wgrad windows: 16 times 1 to 8, 10, 12, 14, 16, 20, ... (three significant binary digits) below the
    buffer, then the buffer: each at most 1.25 times the one before from 8 blocks up."""
    lengths = window_lengths(16 * 40, 16)
    blocks = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32)
    assert lengths == (*(16 * n for n in blocks), 640)
    assert all(b <= 1.25 * a for a, b in zip(lengths[7:], lengths[8:], strict=False))


def test_bf16_experts_are_ragged_dot_only_off_the_cpu():
    """`uses_ragged_dot`: on a GPU or TPU the bf16 experts are the native grouped GEMM; on a CPU, where
    ragged_dot is a dense contraction over every expert, the tiled path (test_grouped_dot.py's bf16 tests
    ask this function which to expect, so they cannot tell if it answers wrongly)."""
    assert not uses_ragged_dot(jax.devices("cpu")[0])
    assert uses_ragged_dot(SimpleNamespace(platform="gpu")) and uses_ragged_dot(SimpleNamespace(platform="tpu"))


def test_the_chunk_lengths_include_the_powers_of_two_these_groups_hit():
    """The premise of the test below: 256 and 512 are chunk lengths of this buffer, 240 a remainder length."""
    capacity = padded_capacity(sum(POWER_OF_TWO_GROUPS), len(POWER_OF_TWO_GROUPS), 16)
    large, remainders = chunk_lengths(capacity, 16)
    assert {256, 512} <= set(large) and REMAINDER_ROWS == 256
    assert remainders[-1] == 240


@jit(static_argnums=0)
def dense_per_expert(groups: tuple[int, ...], x, w):
    """The forward of the per-expert loop: the dense nvfp4 dot of each expert's tokens padded to 16 rows."""
    dot, ys, start = dot_general("nvfp4", backend="emulated"), [], 0
    for expert, size in enumerate(groups):
        x_e = jnp.pad(x[start : start + size], ((0, -size % 16), (0, 0)))
        ys.append(dot(x_e, w[expert], LINEAR_DIMS)[:size])
        start += size
    return jnp.concatenate(ys)


def test_groups_of_exactly_a_chunk_length_are_bit_exact():
    """A padded group of exactly 256 or 512 rows is that one chunk (lax.cond takes it when the rest is at
    least as long); 768 is both chunks; 240, 272 and 496 need the remainder chunk. The forward only: the
    chunks are the same function (`_rows_matmul`) for dgrad, and the forward compiles in half the time."""
    x, w, _ = inputs(groups=POWER_OF_TWO_GROUPS)
    want = dense_per_expert(POWER_OF_TWO_GROUPS, x, w)
    got = jit(functools.partial(grouped_dot, ragged=False), static_argnums=3)(
        x, w, jnp.asarray(POWER_OF_TWO_GROUPS, jnp.int32), "nvfp4"
    )
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_a_slice_of_the_experts_rounds_with_the_global_expert_keys():
    """``grouped_dot(w[first:], first_expert=first)`` (one device's experts) equals, bit for bit, the rows and
    kernel gradients of those experts in the per-expert loop over all of them, under nvfp4's stochastic
    rounding of dY (dgrad and wgrad): expert e of the slice draws with ``fold_in(key, first + e)``. The
    index is traced, as expert parallelism passes it."""
    first_expert, sliced = 3, (40, 7, 33)
    groups = (0,) * first_expert + sliced  # the experts before the slice get no tokens
    x, w, dy = inputs(groups=groups)
    key = jax.random.key(13)
    y, dx, dw = per_expert_loop("nvfp4", x, w, dy, groups, key)
    got = grouped("nvfp4", x, w[first_expert:], dy, jnp.asarray(sliced, jnp.int32), key, jnp.int32(first_expert))
    assert_same_bits(got, (y, dx, dw[first_expert:]))


def test_an_fp8_group_of_tiny_values_is_scaled_as_the_dense_quantizer_scales_it():
    """Per-group FP8 current scaling at its edge: a group whose amax is so small that 448 / amax passes the
    largest float32 takes the dense quantizer's clamped scale (numerics.quantize of that group alone), not
    an infinite one that would zero it. The FP8 codes and the decode scale, bit for bit, group by group."""
    groups = (5, 3)
    x = jnp.concatenate([gaussian(4, (5, 32), jnp.bfloat16), gaussian(5, (3, 32), jnp.bfloat16) * 1e-37])
    layout = GroupLayout.of(jnp.asarray(groups), x.shape[0], 16)
    spec = get_recipe("fp8").fprop_x
    values, scale = quantize_groups(layout.pad(x), layout, spec.format)
    assert scale is not None
    rows, index = np.asarray(layout.row_group_R), np.asarray(layout.row_index_R)
    start = 0
    for expert, size in enumerate(groups):
        want = numerics.quantize(x[start : start + size], spec.format)
        codes = np.asarray(values, np.float32)[(rows == expert) & (index < size)]
        np.testing.assert_array_equal(codes, np.asarray(want.data, np.float32), err_msg=f"group {expert}")
        assert float(scale[expert]) == float(want.scale_inv), expert
        start += size
    assert np.abs(codes).max() > 1  # the tiny group is not flushed to zero
