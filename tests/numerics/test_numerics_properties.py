"""Property tests of the NVFP4 quantizer over random shapes, distributions and magnitudes (docs/numerics.md §13).

Shapes come from a small fixed set so that jit compilations are reused; the data vary freely.
"""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fp4lm.numerics import formats, nvfp4
from tests.numerics import nvfp4_reference
from tests.numerics.data_gen import DISTRIBUTIONS, make_tensor

SHAPES = ((32, 64), (2, 16, 48))
FAST = settings(max_examples=20, deadline=None)


@functools.partial(jax.jit, static_argnames=("block",))
def quantize_view(x, block=(1, 16)):
    """Everything a test compares, from one compiled function: codes, scale bytes, amax, dequantized."""
    q = nvfp4.quantize(x, block=block)
    return q.codes(), q.scale_bytes(), q.amax, q.dequantize()


@functools.partial(jax.jit, static_argnames=("block",))
def requantize_codes(x, block=(1, 16)):
    q = nvfp4.quantize(x, block=block)
    q2 = nvfp4.quantize(q.dequantize(x.dtype), block=block)
    return q.codes(), q.scale_bytes(), q2.codes(), q2.scale_bytes()


tensors = st.builds(
    make_tensor,
    shape=st.sampled_from(SHAPES),
    distribution=st.sampled_from(DISTRIBUTIONS),
    log10_scale=st.floats(-30, 30),
    seed=st.integers(0, 2**31 - 1),
)
blocks = st.sampled_from([(1, 16), (16, 16)])
dtypes = st.sampled_from([np.float32, ml_dtypes.bfloat16])


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


@FAST
@given(x=tensors, block=blocks, dtype=dtypes)
def test_matches_numpy_oracle_bit_exactly(x, block, dtype):
    x = x.astype(dtype)
    codes, scale_bytes, amax, dequant = quantize_view(jnp.asarray(x), block=block)
    want = nvfp4_reference.quantize(x.reshape(-1, x.shape[-1]), block)
    np.testing.assert_array_equal(np.asarray(codes).reshape(-1, x.shape[-1]), want["codes"])
    np.testing.assert_array_equal(np.asarray(scale_bytes).reshape(want["scale_bytes"].shape), want["scale_bytes"])
    assert _bits(amax) == _bits(want["amax"])
    np.testing.assert_array_equal(_bits(dequant).reshape(-1, x.shape[-1]), _bits(want["dequant"]))


@settings(max_examples=6, deadline=None)
@given(x=tensors.filter(lambda x: x.shape == (32, 64)), block=blocks)
def test_jit_equals_eager(x, block):
    """One shape only: eager mode compiles every op per shape, which is slow on CPU."""
    x = jnp.asarray(x)
    eager = nvfp4.quantize(x, block=block)
    codes, scale_bytes, amax, dequant = quantize_view(x, block=block)
    np.testing.assert_array_equal(np.asarray(eager.codes()), np.asarray(codes))
    np.testing.assert_array_equal(np.asarray(eager.scale_bytes()), np.asarray(scale_bytes))
    np.testing.assert_array_equal(_bits(eager.dequantize()), _bits(dequant))


@FAST
@given(x=tensors, block=blocks)
def test_requantizing_the_dequantized_tensor_is_idempotent(x, block):
    """Q(DQ(Q(x))) == Q(x), except code 8 (-0) -> 0, and blocks whose scale is subnormal in E4M3 (or
    underflowed to 0). A subnormal scale is so coarse (one step is 2x near the bottom) that the block's
    dequantized amax can fall a whole step below the original one, and the requantized scale with it."""
    codes, scales, codes2, scales2 = map(np.asarray, requantize_codes(jnp.asarray(x), block=block))
    normal_scale = (scales & 0x78) != 0  # E4M3 exponent field non-zero
    np.testing.assert_array_equal(np.where(normal_scale, scales2, 0), np.where(normal_scale, scales, 0))
    expected = np.where(codes == 8, 0, codes)
    normal = np.repeat(normal_scale, 16, axis=-1)
    np.testing.assert_array_equal(np.where(normal, codes2, 0), np.where(normal, expected, 0))


def _group_by_block(a, block):
    """[..., K] -> [num_blocks, elements]: rows of 16 (1x16) or 16x16 tiles of 256."""
    rows, cols = a.reshape(-1, a.shape[-1]).shape
    if block == (1, 16):
        return a.reshape(-1, 16)
    tiles = a.reshape(rows // 16, 16, cols // 16, 16).transpose(0, 2, 1, 3)
    return tiles.reshape(-1, 256)


@FAST
@given(x=tensors, block=blocks)
def test_block_max_maps_to_six_when_scale_is_normal(x, block):
    """The max-magnitude element of a block (or tile) gets code ±6 when its scale is normal E4M3."""
    codes, scale_bytes, _, _ = map(np.asarray, quantize_view(jnp.asarray(x), block=block))
    magnitudes = _group_by_block(np.abs(x), block)
    scale_bytes = _group_by_block(np.repeat(scale_bytes, 16, axis=-1), block)[:, 0]
    codes = _group_by_block(codes, block)
    max_codes = np.take_along_axis(codes, np.argmax(magnitudes, axis=-1)[:, None], -1)[:, 0]
    normal = scale_bytes >= 0x08  # E4M3 min normal 2^-6
    assert np.all(np.isin(max_codes[normal], (7, 15)))


@FAST
@given(x=tensors)
def test_16x16_quantizing_the_transpose_transposes_codes_and_scales(x):
    x2d = x.reshape(-1, x.shape[-1])
    codes, scales, amax, _ = map(np.asarray, quantize_view(jnp.asarray(x2d), block=(16, 16)))
    codes_t, scales_t, amax_t, _ = map(np.asarray, quantize_view(jnp.asarray(x2d.T), block=(16, 16)))
    np.testing.assert_array_equal(codes_t, codes.T)
    np.testing.assert_array_equal(scales_t[::16], scales[::16].T)
    np.testing.assert_array_equal(scales, np.repeat(scales[::16], 16, axis=0))
    assert _bits(amax) == _bits(amax_t)


@FAST
@given(codes=st.lists(st.integers(0, 15), min_size=64, max_size=64))
def test_pack_unpack_round_trip(codes):
    codes = np.array(codes, np.uint8)
    packed = np.asarray(formats.pack_nibbles(jnp.asarray(codes)))
    np.testing.assert_array_equal(packed, codes[0::2] | (codes[1::2] << 4))  # element 2i in the low nibble
    np.testing.assert_array_equal(np.asarray(formats.unpack_nibbles(jnp.asarray(packed))), codes)


def test_e2m1_decode_matches_the_table():
    values = np.asarray(formats.e2m1_decode(jnp.arange(16, dtype=jnp.uint8)))
    np.testing.assert_array_equal(_bits(values), _bits(formats.E2M1_VALUES))


def test_leading_axes_share_one_global_amax():
    x = make_tensor((3, 4, 32), "outliers", 0.0, seed=1)
    quantize = jax.jit(nvfp4.quantize)
    q, flat = quantize(jnp.asarray(x)), quantize(jnp.asarray(x.reshape(12, 32)))
    assert q.shape == (3, 4, 32) and q.scales.shape == (3, 4, 2) and q.packed.shape == (3, 4, 16)
    np.testing.assert_array_equal(np.asarray(q.codes()).reshape(12, 32), np.asarray(flat.codes()))
    assert float(q.amax) == float(np.abs(x).max())


def test_vmap_quantizes_each_slice_like_a_separate_tensor():
    """Under vmap each slice has its own amax, and the dequantize division guard still holds."""
    x = jnp.asarray(make_tensor((3, 16, 32), "normal", 3.3, seed=2))
    batched = jax.jit(jax.vmap(lambda a: nvfp4.quantize(a).dequantize()))(x)
    for i in range(x.shape[0]):
        single = nvfp4_reference.quantize(np.asarray(x[i]))
        np.testing.assert_array_equal(_bits(batched[i]), _bits(single["dequant"]))
