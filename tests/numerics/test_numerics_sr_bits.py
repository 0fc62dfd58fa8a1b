"""The stochastic-rounding bit source (rounding.random_bits, docs/numerics.md §3.2): a counter-based hash of
the element's global index. SR needs its 8 bits uniform and independent across elements, reproducible from
(key, shape), and different for different keys; these tests check each, and that SR stays unbiased."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from fp4lm.numerics import nvfp4, rounding

random_bits = jax.jit(rounding.random_bits, static_argnums=1)
SHAPE = (512, 1024)  # 2**19 draws: 2048 expected per bin


def draws(seed, shape=SHAPE):
    return np.asarray(random_bits(jax.random.key(seed), shape)).astype(np.int64)


def test_bits_are_uint8_with_the_requested_shape():
    bits = random_bits(jax.random.key(0), (3, 5, 16))
    assert bits.dtype == jnp.uint8 and bits.shape == (3, 5, 16)
    assert random_bits(jax.random.key(0), ()).shape == ()


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_eight_bit_draws_are_uniform_chi_square(seed):
    counts = np.bincount(draws(seed).ravel(), minlength=256)
    _, p = scipy.stats.chisquare(counts)
    assert p > 1e-6, (p, counts.min(), counts.max())


@pytest.mark.parametrize("bit", range(8))
def test_each_bit_is_fair(bit):
    ones = ((draws(3) >> bit) & 1).mean()
    assert abs(ones - 0.5) < 6 * 0.5 / np.sqrt(np.prod(SHAPE)), ones


def test_neighbouring_elements_are_uncorrelated():
    b = draws(4).astype(np.float64)
    n = b.size
    tolerance = 6 / np.sqrt(n)  # ~6 sigma of a sample correlation of independent draws
    along_row = np.corrcoef(b[:, :-1].ravel(), b[:, 1:].ravel())[0, 1]
    along_column = np.corrcoef(b[:-1, :].ravel(), b[1:, :].ravel())[0, 1]
    block_apart = np.corrcoef(b[:, :-16].ravel(), b[:, 16:].ravel())[0, 1]
    assert max(abs(along_row), abs(along_column), abs(block_apart)) < tolerance, (along_row, along_column, block_apart)
    # Pairs of neighbours: the 65536 joint values (b_i, b_i+1) are uniform too (chi-square).
    pairs = np.bincount((b[:, :-1] * 256 + b[:, 1:]).astype(np.int64).ravel(), minlength=65536)
    assert pairs.size == 65536
    _, p = scipy.stats.chisquare(pairs)
    assert p > 1e-6, p


def test_same_key_and_shape_give_identical_bits():
    np.testing.assert_array_equal(draws(5), draws(5))
    eager = np.asarray(rounding.random_bits(jax.random.key(5), SHAPE)).astype(np.int64)
    np.testing.assert_array_equal(eager, draws(5))


def test_different_keys_give_different_bits():
    a, b = draws(6), draws(7)
    split = np.asarray(random_bits(jax.random.split(jax.random.key(6))[1], SHAPE)).astype(np.int64)
    for other in (b, split):
        agree = (a == other).mean()
        assert abs(agree - 1 / 256) < 6 * np.sqrt(1 / 256 / a.size), agree  # as for independent draws


def test_bits_depend_on_the_global_index_only():
    """A tensor's bits are the row-major flat index's: the same key on a reshaped tensor gives the same
    bits, so a shard (which XLA computes from its global iota) sees the bits the whole tensor has."""
    key = jax.random.key(8)
    flat = np.asarray(random_bits(key, (64 * 48,)))
    np.testing.assert_array_equal(np.asarray(random_bits(key, (64, 48))).ravel(), flat)
    np.testing.assert_array_equal(np.asarray(random_bits(key, (4, 16, 48))).ravel(), flat)


def test_too_many_elements_is_a_value_error():
    with pytest.raises(ValueError, match="2\\*\\*32"):
        jax.eval_shape(lambda k: rounding.random_bits(k, (2**17, 2**16)), jax.random.key(0))


@pytest.mark.parametrize("value", [0.1, 0.3, 1.25, 2.2, -3.7, 5.0])
def test_sr_quantize_is_unbiased_for_a_few_values(value):
    """E[Q(x)] = x within the statistical tolerance plus the model's bias (< step/256) for one block scale."""
    n = 2**16
    # One block of 16 with amax 6 pins the scales to 1 (s_b = 448 with S_dec = 6/2688): v = x exactly.
    x = jnp.full((n // 16, 16), value, jnp.float32).at[:, 0].set(6.0)
    q = nvfp4.quantize(x, rounding="stochastic", key=jax.random.key(9)).dequantize()
    samples = np.asarray(q)[:, 1:].ravel().astype(np.float64)
    a = abs(value)
    step = 2.0 if a >= 4 else 1.0 if a >= 2 else 0.5
    tolerance = 6 * step / 2 / np.sqrt(samples.size) + step / 256
    assert abs(samples.mean() - value) < tolerance, (samples.mean(), value, tolerance)
