"""divide_correctly_rounded: correctly rounded on ~1M float32 pairs, whatever the approximate divide does.

The oracle is NumPy's float64 quotient rounded to float32, which is the correctly rounded float32
quotient (53 >= 2·24 + 2, so the double rounding is innocuous), subnormals included.
"""

import ast
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lm.numerics import division
from tests.numerics.perturbed_division import off_by_one_ulp, off_by_ulps, perturbed

F32 = np.float32
SPECIALS = np.array(
    [
        0.0,
        -0.0,
        np.inf,
        -np.inf,
        np.nan,
        1.0,
        -1.0,
        2688.0,
        448.0,
        6.0,
        1 / 6,
        3.0,
        7.0,
        0.1,
        np.finfo(F32).max,
        -np.finfo(F32).max,
        np.finfo(F32).tiny,
        np.finfo(F32).smallest_subnormal,
        -np.finfo(F32).smallest_subnormal,
        F32(2.0**-127),
        F32(2.0**-149) * 3,
        1.9999999,
        1.0000001,
        F32(2.0**127),
        F32(2.0**-126) * F32(0.75),
        2688.0 / np.finfo(F32).max,
        1e-38,
        1e38,
    ],
    F32,
)


def _bits(a):
    return np.asarray(a, F32).view(np.uint32)


def _reference(a, b):
    with np.errstate(all="ignore"):
        return (a.astype(np.float64) / b.astype(np.float64)).astype(F32)


def _random_bits(rng, n):
    return rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(F32)


def _near_exponents(rng, n, exponent_range):
    """Random significands and signs, exponents drawn from `exponent_range` (biased, 0 = subnormal)."""
    low, high = exponent_range
    sign = rng.integers(0, 2, n, dtype=np.uint32) << 31
    exponent = rng.integers(low, high + 1, n, dtype=np.uint32) << 23
    fraction = rng.integers(0, 2**23, n, dtype=np.uint32)
    return (sign | exponent | fraction).view(F32)


def pairs(seed=0, n=1 << 17):
    """~1M (a, b) pairs: raw bit patterns, quotients in the normal range, quotients near or below the
    subnormal boundary, near overflow, exact quotients, and every pair of special values."""
    rng = np.random.default_rng(seed)
    families = [
        (_random_bits(rng, n), _random_bits(rng, n)),
        (_near_exponents(rng, n, (100, 154)), _near_exponents(rng, n, (100, 154))),
        (_near_exponents(rng, n, (1, 40)), _near_exponents(rng, n, (120, 160))),  # subnormal results
        (_near_exponents(rng, n, (0, 3)), _near_exponents(rng, n, (0, 130))),  # subnormal operands
        (_near_exponents(rng, n, (230, 254)), _near_exponents(rng, n, (100, 127))),  # overflow edge
        (_near_exponents(rng, n, (127, 127)), _near_exponents(rng, n, (127, 127))),  # significands only
    ]
    b = _near_exponents(rng, n, (110, 140))
    multiple = rng.integers(1, 2**12, n).astype(F32)
    families.append(((b * multiple).astype(F32), b))  # exact quotients (usually)
    small = rng.integers(1, 2**24, n).astype(F32) * F32(2.0**-149)
    families.append((small, rng.integers(1, 64, n).astype(F32)))  # subnormal ties
    special_a, special_b = np.meshgrid(SPECIALS, SPECIALS)
    families.append((special_a.ravel(), special_b.ravel()))
    return np.concatenate([a for a, _ in families]), np.concatenate([b for _, b in families])


def assert_same_bits(got, want):
    got, want = np.asarray(got, F32), np.asarray(want, F32)
    same = (_bits(got) == _bits(want)) | (np.isnan(got) & np.isnan(want))
    if not same.all():
        bad = np.flatnonzero(~same)[:5]
        pytest.fail(f"{(~same).sum()} of {same.size} quotients differ, e.g. indices {bad.tolist()}")


@pytest.mark.parametrize("approximation", ["exact", "one_ulp_up", "one_ulp_down", "60_ulps_off"])
def test_correctly_rounded_on_a_million_pairs(approximation, monkeypatch):
    a, b = pairs()
    assert a.size > 1_000_000
    perturbations = {
        "exact": division._approximate_divide,
        "one_ulp_up": off_by_one_ulp(+1),
        "one_ulp_down": off_by_one_ulp(-1),
        "60_ulps_off": off_by_ulps(60),
    }
    with perturbed(monkeypatch, perturbations[approximation]):
        got = jax.jit(division.divide_correctly_rounded)(a, b)
    assert_same_bits(got, _reference(a, b))


def test_signs_zeros_infinities_and_nan():
    divide = jax.jit(division.divide_correctly_rounded)
    cases = [
        (1.0, 0.0, np.inf),
        (-1.0, 0.0, -np.inf),
        (1.0, -0.0, -np.inf),
        (0.0, 5.0, 0.0),
        (-0.0, 5.0, -0.0),
        (0.0, -5.0, -0.0),
        (3.0, np.inf, 0.0),
        (-3.0, np.inf, -0.0),
        (np.inf, 2.0, np.inf),
        (np.inf, -2.0, -np.inf),
        (6.0, -3.0, -2.0),
        (2688.0, np.finfo(F32).smallest_subnormal, np.inf),
    ]
    for a, b, want in cases:
        assert_same_bits(divide(F32(a), F32(b)), F32(want))
    for a, b in [(0.0, 0.0), (np.inf, -np.inf), (np.nan, 1.0), (1.0, np.nan), (0.0, np.nan)]:
        assert np.isnan(divide(F32(a), F32(b)))


def test_subnormal_results_are_not_flushed_even_where_xla_flushes():
    """XLA:CPU flushes subnormal results of `a / b` to zero; the helper builds them from bits."""
    a, b = F32(1.0), np.finfo(F32).max
    assert_same_bits(division.reciprocal_correctly_rounded(b), F32(a) / b)
    assert _bits(division.divide_correctly_rounded(F32(2.0**-140), F32(3.0))) == _bits(F32(2.0**-140) / F32(3))


def test_broadcasting_python_scalars_and_bfloat16():
    x = jnp.asarray([[1.0, 3.0], [7.0, 0.5]], jnp.bfloat16)
    got = division.divide_correctly_rounded(1.0, x)
    assert got.dtype == jnp.float32 and got.shape == (2, 2)
    assert_same_bits(got, _reference(np.ones((2, 2), F32), np.asarray(x, F32)))


# Divisions allowed on the quantization path: host-side constants computed by NumPy/Python at trace time.
HOST_CONSTANT_DIVISIONS = {
    "rht_signs()[:, None] * sylvester / 4.0",
    "rht_signs() / 4.0",
    "1.0 / 6.0",
    "1.0 / 256.0",
}


def test_no_other_division_on_the_quantization_path():
    """Every traced division goes through divide_correctly_rounded; a new `/` must be justified here."""
    package = pathlib.Path(division.__file__).resolve().parents[1]
    files = sorted((package / "numerics").glob("*.py")) + [package / "quant" / "gemm.py"]
    found = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                found.add(ast.unparse(node))
    assert found <= HOST_CONSTANT_DIVISIONS, found - HOST_CONSTANT_DIVISIONS


def test_the_patched_guess_is_really_used(monkeypatch):
    """A guess far outside the documented 64 ulps gives wrong quotients: the fixture reaches the helper."""
    a, b = pairs(n=1 << 10)
    with perturbed(monkeypatch, off_by_ulps(1000)):
        got = np.asarray(jax.jit(division.divide_correctly_rounded)(a, b))
    want = _reference(a, b)
    assert ((_bits(got) != _bits(want)) & np.isfinite(want) & (want != 0)).any()
