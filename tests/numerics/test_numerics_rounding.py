"""E2M1 rounding: RNE ties and signs, and the 8-bit stochastic-rounding model (docs/numerics.md §3, §13 B)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from fp4lm.numerics import formats, nvfp4, rounding

ALL_K = jnp.arange(256, dtype=jnp.uint8)
stochastic_codes = jax.jit(rounding.stochastic_codes)
nearest_codes = jax.jit(rounding.nearest_codes)


def sr_outcomes(v):
    """Dequantized E2M1 value for each of the 256 random-bit patterns k, for one scaled value v."""
    codes = stochastic_codes(jnp.full((256,), v, jnp.float32), ALL_K)
    return np.asarray(formats.e2m1_decode(codes))


def grid_neighbours(a):
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    lo = grid[np.searchsorted(grid, a, side="right") - 1]
    hi = grid[min(np.searchsorted(grid, a, side="right"), 7)]
    return lo, hi


def model_p_up(v):
    """P(round up) = floor(256·frac)/256 (float64; the chosen values are far from fp32 rounding issues)."""
    a = min(abs(v), 6.0)
    lo, hi = grid_neighbours(a)
    return 0.0 if hi == lo else np.floor(256 * (a - lo) / (hi - lo)) / 256


# docs/numerics.md §13 example B: value -> {outcome: count of 256}, mean
EXAMPLE_B = [
    (0.1, {0.0: 205, 0.5: 51}, 0.099609),
    (1.25, {1.0: 128, 1.5: 128}, 1.25),
    (2.2, {2.0: 205, 3.0: 51}, 2.199219),
    (4.5, {4.0: 192, 6.0: 64}, 4.5),
    (5.99, {4.0: 2, 6.0: 254}, 5.984375),
    (6.5, {6.0: 256}, 6.0),
    (-0.3, {-0.5: 153, -0.0: 103}, -0.298828),
]


@pytest.mark.parametrize("v,counts,mean", EXAMPLE_B)
def test_example_b_exact_counts_over_all_256_bit_patterns(v, counts, mean):
    outcomes = sr_outcomes(v)
    values, found = np.unique(outcomes, return_counts=True)
    assert dict(zip(values.tolist(), found.tolist(), strict=True)) == counts
    assert abs(outcomes.mean() - mean) < 5e-7
    if v < 0:  # the zero outcome of a negative value is -0 (code 8)
        zero_codes = np.asarray(stochastic_codes(jnp.full((256,), v, jnp.float32), ALL_K))
        assert set(zero_codes[outcomes == 0].tolist()) == {8}


def test_exact_model_mean_is_biased_toward_zero_by_less_than_step_over_256():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.uniform(0, 6, 300), -rng.uniform(0, 6, 100)]).astype(np.float32)
    codes = stochastic_codes(jnp.asarray(np.repeat(values[:, None], 256, 1)), jnp.tile(ALL_K, (400, 1)))
    means = np.asarray(formats.e2m1_decode(codes)).mean(axis=1)
    step = np.where(np.abs(values) >= 4, 2.0, np.where(np.abs(values) >= 2, 1.0, 0.5))
    bias = np.abs(values) - np.abs(means)
    assert np.all(bias >= -1e-6) and np.all(bias < step / 256)
    p_up = [model_p_up(float(v)) for v in values]
    lo = np.array([grid_neighbours(abs(float(v)))[0] for v in values])
    np.testing.assert_allclose(np.abs(means), lo + step * np.array(p_up), atol=1e-6)


def test_nearest_ties_signs_and_specials():
    v = jnp.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.2501, 6.0, 7.9, 1e30, np.inf], jnp.float32)
    want = np.array([0, 2, 2, 4, 4, 6, 6, 1, 7, 7, 7, 7])
    np.testing.assert_array_equal(np.asarray(rounding.nearest_codes(v)), want)
    np.testing.assert_array_equal(np.asarray(rounding.nearest_codes(-v)), want + 8)
    special = jnp.array([-0.0, np.nan, -np.nan, -0.1, 0.1], jnp.float32)
    np.testing.assert_array_equal(np.asarray(rounding.nearest_codes(special)), [0, 0, 0, 8, 0])
    bits = jnp.full(special.shape, 255, jnp.uint8)
    np.testing.assert_array_equal(np.asarray(rounding.stochastic_codes(special, bits)), [0, 0, 0, 9, 1])


def test_nearest_matches_round_half_even_on_the_grid():
    rng = np.random.default_rng(1)
    v = np.concatenate([rng.uniform(-7, 7, 5000), np.linspace(-6.5, 6.5, 1041)]).astype(np.float32)
    grid = formats.E2M1_VALUES[:8].astype(np.float64)
    a = np.minimum(np.abs(v).astype(np.float64), 6.0)
    dist = np.abs(a[:, None] - grid[None, :])
    best = dist.min(axis=1, keepdims=True)
    candidates = dist == best
    even_mantissa = (np.arange(8) % 2 == 0)[None, :]  # codes with mantissa bit 0 win ties
    choice = np.where(candidates.sum(1) > 1, np.argmax(candidates & even_mantissa, 1), np.argmax(candidates, 1))
    want = choice | ((v < 0) << 3)
    np.testing.assert_array_equal(np.asarray(nearest_codes(jnp.asarray(v))), want)


# --- statistical tests through the full NVFP4 quantizer (explicit keys, so deterministic) -------
# Element 0 sets the block scale (6 -> s_b = 1). 1 + 2^-10 and 2 + 511/512 sit within 1/256 of a grid
# step from a neighbour, where the 8-bit model differs from continuous SR: P(up) = 0 and 255/256.
SR_VALUES = np.array(
    [6.0, 0.1, 1.0009765625, 0.7, 1.1, 2.998046875, 1.9, 2.2, 2.7, 3.4, 4.5, 5.2, 5.9, -0.4, -1.6, -3.3], np.float32
)
SR_ROWS = 2048


def sr_tensor():
    """Rows [2688, 0 x15 | SR_VALUES]: S_enc = 1 and the second block's scale is exactly 1 (like TV2),
    so each scaled value v equals the input and every row is an independent SR draw."""
    row = np.zeros(32, np.float32)
    row[0] = 2688.0
    row[16:] = SR_VALUES
    return jnp.asarray(np.tile(row, (SR_ROWS, 1)))


@jax.jit
def sr_dequantized(x, key):
    return nvfp4.quantize(x, rounding="stochastic", key=key).dequantize()


@jax.jit
def sr_quantized_view(x, key):
    q = nvfp4.quantize(x, rounding="stochastic", key=key)
    return q.scale_bytes(), q.dequantize()


@jax.jit
def rn_dequantized(x):
    return nvfp4.quantize(x).dequantize()


def test_sr_quantizer_matches_the_model_probabilities_chi_square():
    scale_bytes, dq = sr_quantized_view(sr_tensor(), jax.random.key(7))
    assert np.all(np.asarray(scale_bytes)[:, 1] == 0x38)  # scale 1.0
    dq = np.asarray(dq)[:, 17:]
    chi2, dof = 0.0, 0
    for j, v in enumerate(SR_VALUES[1:]):
        lo, hi = grid_neighbours(abs(float(v)))
        magnitudes = np.abs(dq[:, j])
        assert set(np.unique(magnitudes).tolist()) <= {lo, hi}
        assert np.all(np.signbit(dq[:, j]) == (v < 0))
        ups = int((magnitudes == hi).sum())
        p_up = model_p_up(float(v))
        if p_up in (0.0, 1.0):
            assert ups == SR_ROWS * p_up, (v, ups)
            continue
        observed = np.array([SR_ROWS - ups, ups])
        expected = SR_ROWS * np.array([1 - p_up, p_up])
        chi2 += float(((observed - expected) ** 2 / expected).sum())
        dof += 1
    assert scipy.stats.chi2.sf(chi2, dof) > 1e-4, chi2


def test_sr_sample_mean_is_unbiased_within_tolerance():
    dq = np.asarray(sr_quantized_view(sr_tensor(), jax.random.key(3))[1])[:, 17:]
    for j, v in enumerate(SR_VALUES[1:]):
        a = abs(float(v))
        lo, hi = grid_neighbours(a)
        sigma = (hi - lo) * np.sqrt(0.25 / SR_ROWS)
        step = hi - lo
        assert abs(np.abs(dq[:, j]).mean() - a) < step / 256 + 5 * sigma


def test_sr_average_beats_nearest():
    x = jax.random.normal(jax.random.key(0), (64, 256), jnp.float32)
    rn_error = float(jnp.sqrt(jnp.mean((rn_dequantized(x) - x) ** 2)))
    keys = jax.random.split(jax.random.key(1), 32)
    average = sum(sr_dequantized(x, keys[i]) for i in range(32)) / 32
    sr_error = float(jnp.sqrt(jnp.mean((average - x) ** 2)))
    assert sr_error < rn_error / 3, (sr_error, rn_error)


def test_sr_is_reproducible_and_key_dependent():
    x = jax.random.normal(jax.random.key(0), (64, 256), jnp.float32)
    a, b = sr_dequantized(x, jax.random.key(5)), sr_dequantized(x, jax.random.key(5))
    c = sr_dequantized(x, jax.random.key(6))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(a), np.asarray(c))


def test_sr_requires_a_key():
    with pytest.raises(ValueError, match="key"):
        nvfp4.quantize(jnp.ones((1, 16)), rounding="stochastic")
    with pytest.raises(ValueError, match="rounding"):
        nvfp4.quantize(jnp.ones((1, 16)), rounding="up")
