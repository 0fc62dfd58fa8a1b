"""Row-scaled NVFP4 and 4over6, bit for bit with TransformerEngine's reference quantizer.

tests/fixtures/nvfp4_option_vectors.npz holds what `NVFP4QuantizerRef` (TransformerEngine d0067d0) gives for
every option combination it accepts, on float32 and bfloat16 inputs with edges; its generator is
tests/fixtures/make_nvfp4_option_vectors.py. Each case is checked rowwise (the tensor) and columnwise (its
transpose, quantized again: TransformerEngine's columnwise copy, with one amax per row of the transpose when
row-scaled) in packed codes, scale bytes and amax, under jit.
"""

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lm.numerics import nvfp4, nvfp4_fused

pytestmark = pytest.mark.slow

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "nvfp4_option_vectors.npz"
VECTORS = dict(np.load(FIXTURE))
CASES = sorted({key.rsplit("/", 1)[0].removeprefix("case/") for key in VECTORS if key.startswith("case/")})


def options_of(name: str) -> dict:
    """'1d_rows_MAE_256' -> the keyword arguments of nvfp4.quantize."""
    parts = name.split("_")
    mode = next((p.lower() for p in parts if p in ("MAE", "MSE")), None)
    return dict(
        block=(16, 16) if parts[0] == "2d" else (1, 16),
        row_scaled="rows" in parts,
        four_over_six=mode,
        e4m3_max=256 if "256" in parts else 448,
    )


def input_of(input_name: str, dtype_name: str) -> jax.Array:
    raw = VECTORS[f"input/{input_name}/{dtype_name}"]
    if dtype_name == "bfloat16":
        return jnp.asarray(raw.view(jnp.bfloat16))
    return jnp.asarray(raw.view(np.float32))


@functools.cache
def quantizer(**kwargs):
    return jax.jit(functools.partial(nvfp4.quantize, **kwargs))


def bits(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("case", CASES)
def test_matches_transformer_engine(case):
    input_name, dtype_name, option_name = case.split("/")
    x = input_of(input_name, dtype_name)
    quantize = quantizer(**options_of(option_name))
    for suffix, operand in (("", x), ("_t", x.T)):
        q = quantize(operand)
        got = {"packed": q.packed, "scale_bytes": q.scale_bytes(), "amax": jnp.ravel(q.amax)}
        for field, value in got.items():
            want = VECTORS[f"case/{case}/{field}{suffix}"]
            np.testing.assert_array_equal(
                np.asarray(value).view(want.dtype) if field != "amax" else bits(value),
                want if field != "amax" else bits(want),
                err_msg=f"{case} {field}{suffix}",
            )


def test_cases_cover_every_option():
    """Every option combination the reference accepts, in both dtypes, on every input kind."""
    options = {case.split("/")[2] for case in CASES}
    assert len(options) == 15, sorted(options)
    assert {case.split("/")[1] for case in CASES} == {"float32", "bfloat16"}
    assert len(CASES) == 15 * 2 * 6


def test_four_over_six_picks_both_candidates():
    """The vectors exercise the choice: some blocks take the map-to-4 scale, most keep map-to-6."""
    x = input_of("normal", "float32")
    plain = nvfp4.quantize(x, four_over_six=None)
    chosen = nvfp4.quantize(x, four_over_six="mae")
    changed = np.asarray(plain.scale_bytes()) != np.asarray(chosen.scale_bytes())
    assert 0 < changed.mean() < 1


@pytest.mark.parametrize("block", [(1, 16), (16, 16)])
def test_quantize_divides_a_few_times_per_tensor(block):
    """Each correctly rounded division is ~100 integer operations for XLA to compile. Plain NVFP4 needs
    three: S_enc, S_dec (once per quantize, shared by the scale bytes and the encode scales) and the
    blocks' encode scales. 4over6 adds three, its candidates and grid points stacked: one per point and
    candidate (28 per tensor) made a 4-layer model's training step take 16 GiB and 4.5 minutes to compile."""
    x = jnp.ones((64, 64), jnp.float32)

    def divisions(**options):
        lowered = jax.jit(functools.partial(nvfp4.quantize, block=block, **options)).lower(x)
        return lowered.as_text().count("call @_divide")

    assert divisions() == 3
    assert divisions(four_over_six="mae", e4m3_max=256) == 6


def test_four_over_six_lowers_the_error_it_measures():
    """Per block, the chosen candidate's MSE is never above plain map-to-6's (the same scale or a better one)."""
    x = input_of("heavy_tails", "float32")
    errors = {}
    for mode in (None, "mse"):
        dq = nvfp4.quantize(x, four_over_six=mode).dequantize()
        errors[mode] = np.asarray(jnp.sum(((dq - x) ** 2).reshape(32, 4, 16), axis=-1))
    assert np.all(errors["mse"] <= errors[None] * (1 + 1e-5) + 1e-30)
    assert errors["mse"].sum() < errors[None].sum()


def test_row_scaled_amax_is_per_row():
    x = input_of("row_magnitudes", "float32")
    q = nvfp4.quantize(x, row_scaled=True)
    assert q.amax.shape == (32,)
    np.testing.assert_array_equal(bits(q.amax), bits(jnp.max(jnp.abs(x), axis=-1)))
    plain = nvfp4.quantize(x)

    def row_error(q):  # rows of small magnitude keep their resolution only with their own amax
        return np.asarray(jnp.max(jnp.abs(q.dequantize() - x), axis=-1) / jnp.max(jnp.abs(x), axis=-1))

    assert row_error(q).max() < 0.35
    assert row_error(plain).max() > row_error(q).max()


@pytest.mark.parametrize("option_name", ["1d_rows", "1d_MAE_256", "2d_MSE", "1d_rows_MSE_256"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_fused_path_equals_codes(option_name, rounding):
    """The GEMM's fused quantizer (no codes) gives the codes path's values and amax with every option."""
    x = input_of("outliers", "bfloat16")
    kwargs = options_of(option_name)
    key = jax.random.key(3) if rounding == "stochastic" else None
    q = nvfp4.quantize(x, rounding=rounding, key=key, **kwargs)
    block = kwargs.pop("block")
    values, amax = nvfp4_fused.quantize_block_scaled(
        x, block=block, rounding=rounding, key=key, options=nvfp4.Options(**kwargs)
    )
    np.testing.assert_array_equal(bits(values), bits(q.block_scaled()))
    np.testing.assert_array_equal(bits(amax), bits(q.amax))
    dq = nvfp4_fused.quantize_dequantize(x, block=block, rounding=rounding, key=key, options=nvfp4.Options(**kwargs))
    np.testing.assert_array_equal(bits(dq), bits(q.dequantize()))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(block=(16, 16), row_scaled=True), "row_scaled needs 1x16"),
        (dict(e4m3_max=256), "set four_over_six too"),
        (dict(four_over_six="max"), "four_over_six must be"),
        (dict(four_over_six="mae", e4m3_max=300), "e4m3_max must be 448 or 256"),
        (dict(row_scaled=True, tensor_amax=1.0), "leave tensor_amax unset"),
    ],
)
def test_bad_options_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        nvfp4.quantize(jnp.ones((16, 16)), **kwargs)
