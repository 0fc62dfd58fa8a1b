"""Input batches for the fused quantize-dequantize test: T tensors [16, 64] (1,024 values each).

Every tensor is quantized on its own (its own amax), so special values and extreme scales in one
tensor do not hide what happens in the others. Four kinds of batches:
- `bit_pattern_batch`: float32 bit patterns, mostly with the exponent drawn in a window below a
  per-tensor top exponent (so block scales land everywhere: normal, E4M3-subnormal, underflowing),
  plus tensors of fully random bits and sprinkled NaN, ±inf, -0.0 and float32 subnormals;
- `boundary_batch`: every E2M1 rounding decision point (and the grid's top, 6) ±0, 1, 2 ulp,
  divided by the block's actual encode scale, at many block scales;
- `scale_edge_batch`: blocks whose amax_b · m sits around E4M3's saturation (448) and underflow;
- `family_batch`: the data_gen distributions, heavy tails, zero and constant blocks, huge/tiny amax.
"""

import jax
import jax.numpy as jnp
import numpy as np

from fp4lm.numerics import formats, nvfp4
from tests.numerics.data_gen import DISTRIBUTIONS, make_tensor

SHAPE = (16, 64)
DECISION_POINTS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], np.float32)


def _from_bits(bits):
    return np.asarray(bits, np.uint32).view(np.float32)


def bit_pattern_batch(count, seed):
    rng = np.random.default_rng(seed)
    shape = (count,) + SHAPE
    bits = rng.integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32)
    top = rng.integers(1, 255, (count, 1, 1))  # per-tensor top biased exponent
    exponent = np.clip(top - rng.integers(0, 40, shape), 0, 254).astype(np.uint32)
    windowed = (bits & np.uint32(0x807FFFFF)) | (exponent << 23)
    raw = rng.random((count, 1, 1)) < 0.05  # a few tensors of fully random bits (mostly NaN/inf)
    bits = np.where(raw, bits, windowed)
    # -0.0 and subnormals in every tensor; NaN (either sign) in ~5% of the tensors, ±inf in ~10%.
    quiet = np.array([0x80000000, 0x00000001, 0x807FFFFF], np.uint32)
    bits = np.where(rng.random(shape) < 0.003, quiet[rng.integers(0, len(quiet), shape)], bits)
    kind = rng.random((count, 1, 1))
    loud = np.where(kind < 0.05, np.uint32(0x7FC00000), np.where(rng.random(shape) < 0.5, 0x7F800000, 0xFF800000))
    loud = np.where((kind < 0.025) & (rng.random(shape) < 0.5), np.uint32(0xFFC00001), loud).astype(np.uint32)
    bits = np.where((kind < 0.15) & (rng.random(shape) < 0.002), loud, bits)
    return _from_bits(bits)


def _encode_scales(x):
    """enc_b per element ([T, 16, 64] float32) for 1x16 blocks, computed with the library's own scale math."""

    def one(t):
        block_amax = formats.abs_max(t.reshape(-1, SHAPE[1] // 16, 16), axis=-1)
        amax = formats.abs_max(block_amax)
        scales = nvfp4.global_scales(amax)
        scale = formats.from_bytes(nvfp4.block_scale_bytes(block_amax, scales), jnp.float8_e4m3fn).astype(jnp.float32)
        return jnp.repeat(nvfp4.block_encode_scale(scale, scales), 16, axis=-1).reshape(SHAPE)

    return np.asarray(jax.jit(jax.vmap(one))(jnp.asarray(x)))


def boundary_batch(count, seed):
    """Each 1x16 block: element 0 holds the block amax (sets the scale), the others decision points ±ulps."""
    rng = np.random.default_rng(seed)
    shape = (count,) + SHAPE
    tensor_amax = np.float32(2.0) ** rng.integers(-100, 100, (count, 1, 1, 1)).astype(np.float32)
    block_amax = tensor_amax * (np.float32(2.0) ** -rng.uniform(0, 22, (count, 16, 4, 1))).astype(np.float32)
    block_amax = np.repeat(block_amax, 16, axis=-1).reshape(shape).astype(np.float32)
    block_amax[:, 0, 0] = tensor_amax[:, 0, 0, 0]
    encode = _encode_scales(block_amax)
    points = DECISION_POINTS[rng.integers(0, len(DECISION_POINTS), shape)]
    with np.errstate(all="ignore"):
        x = (points / encode).astype(np.float32)
    ulps = rng.integers(-2, 3, shape).astype(np.int32)
    x = (x.view(np.int32) + ulps).view(np.float32)
    x = np.where(np.isfinite(x) & (np.abs(x) <= block_amax), x, block_amax * np.float32(0.5))
    x = np.where(rng.random(shape) < 0.5, -x, x).astype(np.float32)
    first = np.zeros(shape, bool)
    first[..., ::16] = True
    return np.where(first, block_amax, x).astype(np.float32)


def scale_edge_batch(count, seed):
    """Blocks with amax_b / amax near 1 (saturation at 448) and near 2^-10/448 (E4M3 underflow)."""
    rng = np.random.default_rng(seed)
    shape = (count,) + SHAPE
    amax = np.float32(2.0) ** rng.integers(-60, 60, (count, 1, 1)).astype(np.float32)
    near_top = 1 - rng.integers(0, 64, (count, 16, 4, 1)) * np.float32(2.0**-24)
    near_bottom = np.float32(2.0**-10 / 448) * np.float32(2.0) ** rng.uniform(-2, 2, (count, 16, 4, 1))
    ratio = np.where(rng.random((count, 16, 4, 1)) < 0.5, near_top, near_bottom).astype(np.float32)
    values = rng.uniform(-1, 1, (count, 16, 4, 16)).astype(np.float32)
    values[..., 0] = 1.0
    x = (values * ratio * amax[..., None]).astype(np.float32).reshape(shape)
    x[:, 0, 0] = amax[:, 0, 0]
    return x


def family_batch(count, seed):
    rng = np.random.default_rng(seed)
    tensors = []
    for i in range(count):
        distribution = DISTRIBUTIONS[i % len(DISTRIBUTIONS)]
        x = make_tensor(SHAPE, distribution, float(rng.uniform(-30, 30)), seed * 100_003 + i)
        if i % 11 == 0:
            x[:, :16] = 0.0  # all-zero blocks in a nonzero tensor
        if i % 13 == 0:
            peak = np.max(np.abs(x).astype(np.float64))
            target = 2.0**127 if i % 2 else 2.0**-100  # huge / tiny amax
            x = x * (target / peak) if peak > 0 else x
        tensors.append(x.astype(np.float32))
    return np.stack(tensors)
