"""Rounding a scaled value v onto the E2M1 grid {0, 0.5, 1, 1.5, 2, 3, 4, 6}: RNE and stochastic.

Both return the 4-bit code `magnitude | (v < 0) << 3` (docs/numerics.md §3):
- the sign bit is set iff v < 0 strictly, so -0.0 gives code 0 and a negative value that
  rounds to magnitude 0 gives code 8 (-0);
- NaN matches no threshold and gets code 0;
- magnitudes above 6 (and ±inf) saturate to 6, so callers need not clamp first.

The magnitudes are computed with comparisons only (a sum of threshold tests), which XLA fuses
into one vectorised elementwise loop and which no compiler pass can fold away.
"""

import math

import jax
import jax.numpy as jnp

from fp4lm.numerics import formats

# Round-to-nearest-even decision points on |v| between consecutive grid values, and whether a
# value exactly at the point rounds UP (True: the upper neighbour has the even mantissa).
# Ties: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4 (docs/numerics.md §3.1).
_NEAREST_STEPS = (
    (0.25, False),
    (0.75, True),
    (1.25, False),
    (1.75, True),
    (2.5, False),
    (3.5, True),
    (5.0, False),
)
# The E2M1 grid values above zero: magnitude code i+1 is reached at _GRID_UP[i].
_GRID_UP = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

RANDOM_BITS_DTYPE = jnp.uint8  # 8 random bits per element, as the hardware uses


def _count_true(predicates):
    total = predicates[0].astype(jnp.uint8)
    for predicate in predicates[1:]:
        total = total + predicate.astype(jnp.uint8)
    return total


def nearest_magnitude(a):
    """Magnitude code 0..7 of |v| = a under RNE with saturation at 6 (uint8). NaN -> 0."""
    return _count_true([(a >= point) if up else (a > point) for point, up in _NEAREST_STEPS])


def nearest_magnitude_value(a):
    """The E2M1 grid value of |v| = a under RNE with saturation at 6, as float32. NaN -> 0.

    The same decision points as `nearest_magnitude`, but each passed point adds the height of its
    step on the grid (0.5 below 2, 1 in [2, 4), 2 from 4 on) instead of 1: a sum of at most seven
    exact float32 terms that is the grid value itself, so no code or table lookup is needed.
    """
    total = jnp.zeros_like(a)
    lower = 0.0
    for (point, up), upper in zip(_NEAREST_STEPS, _GRID_UP, strict=True):
        passed = (a >= point) if up else (a > point)
        total = total + jnp.where(passed, jnp.float32(upper - lower), jnp.float32(0.0))
        lower = upper
    return total


def grid_magnitude(q):
    """Magnitude code 0..7 of a value already on the E2M1 grid (exact). NaN -> 0."""
    return _count_true([q >= value for value in _GRID_UP])


def _grid_step(a):
    """Spacing of the E2M1 grid at or above |v| = a: 0.5 below 2, 1 in [2, 4), 2 from 4 on."""
    return jnp.where(a >= 4.0, jnp.float32(2.0), jnp.where(a >= 2.0, jnp.float32(1.0), jnp.float32(0.5)))


def _inverse_grid_step(a):
    """1 / _grid_step(a), exact (powers of two), so no platform divide is involved."""
    return jnp.where(a >= 4.0, jnp.float32(0.5), jnp.where(a >= 2.0, jnp.float32(1.0), jnp.float32(2.0)))


def stochastic_magnitude_value(a, random_bits):
    """The hardware's 8-bit stochastic rounding of a = |v| >= 0, as a float32 grid value.

    TE's software model of `cvt.rs.satfinite.e2m1x4.f32` (docs/numerics.md §3.2), with k the element's 8 random
    bits (uint8):
        t = fp32(a + (k/256)·step(a))      (the product is exact, so one rounding: an FMA is fine)
        q = min(floor(t · (1/step(t))) · step(t), 6)   (1/step is a power of two: exact)
    which rounds up with probability floor(256·frac)/256, frac = (a - lo)/(hi - lo), up to that one
    rounding of t. Values >= 6 (and inf) give 6; NaN stays NaN (and later maps to code 0).
    """
    k = random_bits.astype(jnp.float32)
    t = a + k * (_grid_step(a) * jnp.float32(1.0 / 256.0))
    return jnp.minimum(jnp.floor(t * _inverse_grid_step(t)) * _grid_step(t), jnp.float32(formats.E2M1_MAX))


def nearest_codes(v):
    """E2M1 codes (uint8) of scaled float32 values v under RNE with saturation."""
    return formats.e2m1_code(nearest_magnitude(jnp.abs(v)), v < 0)


def stochastic_codes(v, random_bits):
    """E2M1 codes (uint8) of scaled float32 values v under 8-bit stochastic rounding."""
    q = stochastic_magnitude_value(jnp.abs(v), random_bits)
    return formats.e2m1_code(grid_magnitude(q), v < 0)


_GOLDEN = 0x9E3779B9  # odd: multiplying by it is a bijection of uint32 that spreads consecutive indices
_FMIX_MULTIPLIERS = (0x85EBCA6B, 0xC2B2AE35)  # murmur3's 32-bit finaliser
MAX_RANDOM_BITS_ELEMENTS = 2**32  # the element index is a uint32 counter


def _fmix32(h):
    """murmur3's fmix32: a bijection of uint32 in which every input bit flips each output bit with p ~ 1/2."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(_FMIX_MULTIPLIERS[0])
    h = h ^ (h >> 13)
    h = h * jnp.uint32(_FMIX_MULTIPLIERS[1])
    return h ^ (h >> 16)


def _global_index(shape):
    """The row-major flat index of every element of `shape`, as uint32 (iotas: XLA fuses them, and under
    sharding each device sees the GLOBAL indices of its shard)."""
    index = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(len(shape))):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride % 2**32)
        stride *= shape[axis]
    return index


def random_bits(key, shape):
    """8 random bits per element (uint8): a counter-based hash of the element's global index.

    Two 32-bit seeds are drawn from `key` once per tensor (jax.random.bits); element i gets the top 8
    bits of fmix32(fmix32(i·0x9E3779B9 + seed0) ^ seed1), murmur3's finaliser applied twice. SR needs
    these bits uniform on 0..255 and independent across elements, not unpredictable: the two rounds of
    full-avalanche mixing give that (tests/numerics/test_numerics_sr_bits.py: chi-square over 256 bins,
    neighbour correlation, E[Q(x)] = x). The bits are a pure function of (key, shape, element index), so
    they are the same whatever the sharding, and the hash is a few uint32 multiply/xor/shift operations
    per element that XLA fuses into the quantize pass (faster than threefry bits: BENCHMARKS.md). A tensor may
    have at most 2**32 elements.
    """
    shape = tuple(shape)
    size = math.prod(shape)
    if size > MAX_RANDOM_BITS_ELEMENTS:
        raise ValueError(f"random_bits: {size} elements; the uint32 element counter allows at most 2**32")
    seeds = random_bits_seeds(key)
    return hashed_random_bits(seeds[0], seeds[1], _global_index(shape))


def random_bits_seeds(key):
    """The two uint32 seeds `random_bits` draws from ``key`` (once per tensor)."""
    return jax.random.bits(key, (2,), jnp.uint32)


def hashed_random_bits(seed0, seed1, index):
    """The 8 random bits (uint8) of the elements at flat ``index`` (uint32) of a tensor whose seeds are
    ``seed0``, ``seed1`` (broadcastable): `random_bits` is this at every element's row-major index. A caller
    that packs several tensors into one buffer (a grouped GEMM's experts) gives each element its own
    tensor's seeds and index, and gets the bits each tensor would have drawn alone."""
    h = _fmix32(jnp.asarray(index, jnp.uint32) * jnp.uint32(_GOLDEN) + seed0)
    h = _fmix32(h ^ seed1)
    return (h >> 24).astype(RANDOM_BITS_DTYPE)


def e2m1_codes(v, rounding, key):
    """E2M1 codes of v with `rounding` "nearest" or "stochastic" (the latter draws bits from `key`)."""
    if rounding == "nearest":
        return nearest_codes(v)
    assert rounding == "stochastic" and key is not None, (rounding, key)
    return stochastic_codes(v, random_bits(key, v.shape))


ROUNDINGS = ("nearest", "stochastic")


def check_rounding(rounding, key, *, fmt):
    """Validate the rounding mode and key of a quantize call (ValueError on misuse)."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"{fmt}: unknown rounding {rounding!r}; use one of {ROUNDINGS}")
    if rounding == "stochastic" and key is None:
        raise ValueError(f"{fmt}: stochastic rounding needs a PRNG key; pass key=jax.random.key(...)")
