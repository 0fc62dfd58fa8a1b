"""Telemetry: each statistic on data where its value is known by construction; jittable."""

import jax.numpy as jnp
import numpy as np
import pytest

from fp4lm import numerics
from fp4lm.quant import RECIPES, QuantSpec
from fp4lm.quant.stats import grouped_layer_stats, layer_stats, operand_stats
from tests.quant.fake_quant import gaussian, jit

NVFP4 = QuantSpec(format="nvfp4")


def test_relative_error_and_amax_match_a_direct_computation():
    x = gaussian(0, (64, 64), jnp.float32)
    spec = QuantSpec(format="nvfp4", hadamard=True)

    @jit
    def both(x):
        transformed = numerics.rht(x)
        dequantized = numerics.quantize(x, "nvfp4", hadamard=True).dequantize()
        direct = jnp.linalg.norm(dequantized - transformed) / jnp.linalg.norm(transformed)
        return operand_stats(x, spec), direct, jnp.max(jnp.abs(transformed))

    stats, direct, amax = both(x)
    np.testing.assert_allclose(stats["rel_err"], direct, rtol=1e-6)
    assert 0.07 < float(stats["rel_err"]) < 0.12  # the spec's 1x16 RMSE on N(0, 1) is 0.095
    np.testing.assert_array_equal(stats["amax"], amax)


def test_saturation_counts_block_maxima_clipped_by_a_rounded_down_scale():
    """Spec TV3: tensor amax 10, a block of 1.0s: d = 44.8 rounds down to the E4M3 scale 44, so every 1.0
    scales to 6.1 and is clamped at 6. In a block whose scale is exact (amax_b = 10 -> 448) nothing clips."""
    clipped_block = jnp.ones(16)
    exact_block = jnp.concatenate([jnp.array([10.0]), jnp.linspace(-9.0, 9.0, 15)])
    x = jnp.concatenate([clipped_block, exact_block, jnp.zeros(32)]).reshape(1, 64)
    stats = jit(lambda x: operand_stats(x, NVFP4))(x)
    assert float(stats["saturated_frac"]) == 16 / 64
    assert float(stats["underflow_frac"]) == 0.0


def test_underflow_counts_nonzero_blocks_whose_scale_is_zero():
    """Spec TV5-like: next to an outlier of 1e4, a block of 1e-6 needs a scale below E4M3's smallest
    subnormal and flushes to zero; an all-zero block does not count."""
    x = jnp.zeros((4, 64)).at[0, 0].set(1e4).at[1, 16:32].set(1e-6)
    stats = jit(lambda x: operand_stats(x, NVFP4))(x)
    assert float(stats["underflow_frac"]) == 1 / 16
    assert float(stats["amax"]) == 1e4


@pytest.mark.parametrize(
    "spec",
    [QuantSpec(format="mxfp4", block=(1, 32)), QuantSpec(format="mxfp8", block=(1, 32)), QuantSpec(format="fp8_e4m3")],
)
def test_other_formats(spec):
    x = gaussian(1, (32, 64), jnp.float32)
    stats = jit(lambda x: operand_stats(x, spec))(x)
    assert float(stats["saturated_frac"]) == 0.0  # round-up scale rules and per-tensor amax never clip
    assert float(stats["underflow_frac"]) == 0.0
    assert 0.005 < float(stats["rel_err"]) < 0.15


def test_layer_stats_for_every_recipe_are_finite():
    x = gaussian(2, (2, 16, 64), jnp.bfloat16)
    kernel = gaussian(3, (64, 32), jnp.bfloat16)
    recipes = [RECIPES[name] for name in ("bf16", "nvfp4", "mxfp4", "fp8")]
    stats = jit(lambda x, kernel: [layer_stats(x, kernel, r) for r in recipes])(x, kernel)
    assert all(set(s) == {"x", "w"} for s in stats)
    assert all(set(s["x"]) == {"rel_err", "saturated_frac", "underflow_frac", "amax"} for s in stats)
    assert float(stats[0]["x"]["rel_err"]) == 0.0  # bf16: nothing quantized
    assert float(stats[1]["w"]["rel_err"]) > float(stats[1]["x"]["rel_err"]) > 0.05  # 16x16 tiles cost more
    np.testing.assert_array_equal(stats[1]["w"]["amax"], jnp.max(jnp.abs(kernel.astype(jnp.float32))))
    assert all(bool(jnp.isfinite(v)) for s in stats for operand in s.values() for v in operand.values())


def test_stochastic_operand_telemetry_needs_a_key():
    """No fixed key is made up for stochastic rounding, in telemetry as in the matmul."""
    import jax
    import jax.numpy as jnp
    import pytest

    from fp4lm.quant import get_recipe
    from fp4lm.quant.stats import operand_stats

    spec = get_recipe("nvfp4").dgrad_g
    x = jnp.ones((16, 32))
    with pytest.raises(ValueError, match="needs a key"):
        operand_stats(x, spec)
    assert float(operand_stats(x, spec, key=jax.random.key(1))["amax"]) == 1.0


def test_each_expert_is_measured_on_its_own_rows_and_weight():
    """Expert e's statistics are those of its rows alone and its own kernel: neither the other experts' rows,
    nor the padding, nor the rows a capacity dropped (past the groups) change a value or a fraction."""
    sizes = [5, 0, 19, 7]  # 31 rows in groups; 5 more, dropped, hold outliers that must not show anywhere
    x = gaussian(4, (36, 64), jnp.float32).at[31:].mul(1e4).at[5:24].mul(30.0)  # expert 2's rows are larger
    x = x.at[6, :16].set(1e-9).astype(jnp.bfloat16)  # a block of expert 2 that underflows next to its amax
    w = gaussian(5, (4, 64, 32), jnp.bfloat16)
    recipe = RECIPES["nvfp4"]
    stats = jit(lambda x, w: grouped_layer_stats(x, w, jnp.asarray(sizes), recipe))(x, w)
    starts = np.cumsum([0, *sizes])
    for e, size in enumerate(sizes):
        rows = x[starts[e] : starts[e] + size]
        want = {"w": operand_stats(w[e].T, recipe.fprop_w)}
        # no tokens: an empty operand reports zeros, as an all-zero one does
        want["x"] = operand_stats(rows, recipe.fprop_x) if size else dict.fromkeys(want["w"], 0.0)
        for operand in ("x", "w"):
            for metric, value in want[operand].items():
                np.testing.assert_allclose(stats[operand][metric][e], value, rtol=1e-6, err_msg=f"{e} {operand}")
    assert stats["x"]["underflow_frac"][2] == np.float32(1 / (19 * 4))  # one of expert 2's 76 blocks
    assert float(stats["x"]["underflow_frac"][0]) == 0.0
