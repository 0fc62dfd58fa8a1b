"""The recipe registry: the presets say what the issue and the paper say, and names resolve or fail clearly."""

import pytest

from fp4lm.errors import UserError
from fp4lm.quant.recipes import (
    BACKWARD_SLOTS,
    FORWARD_SLOTS,
    RECIPES,
    SLOTS,
    GemmShapeError,
    QuantSpec,
    Recipe,
    get_recipe,
)

NAMES = (
    "bf16",
    "nvfp4",
    "nvfp4_no_rht",
    "nvfp4_no_sr",
    "nvfp4_1d_weights",
    "nvfp4_fwd_only",
    "nvfp4_naive",
    "mxfp4",
    "mxfp8",
    "fp8",
    "nvfp4_4over6",
    "nvfp4_row_scaled",
    "mxfp8_fwd_nvfp4_bwd",
    "nvfp4_fwd_mxfp8_bwd",
    "nvfp4_bwd_high_precision",
    "nvfp4_bwd_dequantized",
)


def test_registry_has_exactly_the_named_presets():
    assert tuple(RECIPES) == NAMES
    assert all(RECIPES[n].name == n for n in NAMES)
    assert [n for n in NAMES if not RECIPES[n].is_quantized] == ["bf16"]


def test_nvfp4_is_the_papers_recipe():
    r = RECIPES["nvfp4"]
    assert r.fprop_x == QuantSpec(format="nvfp4", block=(1, 16), rounding="nearest")
    assert r.fprop_w == r.dgrad_w == QuantSpec(format="nvfp4", block=(16, 16), rounding="nearest")
    assert r.dgrad_g == QuantSpec(format="nvfp4", rounding="stochastic")
    assert r.wgrad_g == QuantSpec(format="nvfp4", rounding="stochastic", hadamard=True)
    assert r.wgrad_x == QuantSpec(format="nvfp4", rounding="nearest", hadamard=True)


def test_ablations_change_one_thing():
    def specs(name):
        return RECIPES[name].specs()

    nvfp4 = specs("nvfp4")
    no_rht, no_sr = specs("nvfp4_no_rht"), specs("nvfp4_no_sr")
    assert not any(s.hadamard for s in no_rht.values()) and [s.rounding for s in no_rht.values()] == [
        s.rounding for s in nvfp4.values()
    ]
    assert all(s.rounding == "nearest" for s in no_sr.values())
    assert [s.hadamard for s in no_sr.values()] == [s.hadamard for s in nvfp4.values()]
    one_d = specs("nvfp4_1d_weights")
    assert one_d["fprop_w"].block == one_d["dgrad_w"].block == (1, 16)
    assert {k: v for k, v in one_d.items() if k not in ("fprop_w", "dgrad_w")} == {
        k: v for k, v in nvfp4.items() if k not in ("fprop_w", "dgrad_w")
    }
    fwd_only = specs("nvfp4_fwd_only")
    assert fwd_only["fprop_x"] == nvfp4["fprop_x"] and fwd_only["fprop_w"] == nvfp4["fprop_w"]
    assert all(fwd_only[s] is None for s in ("dgrad_g", "dgrad_w", "wgrad_g", "wgrad_x"))
    assert set(specs("nvfp4_naive").values()) == {QuantSpec(format="nvfp4")}


def test_comparison_recipes():
    mx4 = RECIPES["mxfp4"]
    assert {s.format for s in mx4.specs().values()} == {"mxfp4"}
    assert all(s.block == (1, 32) for s in mx4.specs().values())
    assert mx4.wgrad_g.hadamard and mx4.wgrad_x.hadamard and not mx4.fprop_x.hadamard
    assert mx4.dgrad_g.stochastic and mx4.wgrad_g.stochastic and not mx4.fprop_w.stochastic
    assert {s.format for s in RECIPES["mxfp8"].specs().values()} == {"mxfp8"}
    fp8 = RECIPES["fp8"]
    assert [fp8.fprop_x.format, fp8.fprop_w.format, fp8.dgrad_w.format, fp8.wgrad_x.format] == ["fp8_e4m3"] * 4
    assert fp8.dgrad_g.format == fp8.wgrad_g.format == "fp8_e5m2"


def test_get_recipe():
    assert get_recipe("nvfp4") is RECIPES["nvfp4"]
    custom = Recipe(name="x_only", fprop_x=QuantSpec(format="nvfp4"))
    assert get_recipe(custom) is custom and custom.is_quantized
    with pytest.raises(UserError, match=r"unknown precision recipe 'nvfp3'; use one of bf16, nvfp4, .*fp8"):
        get_recipe("nvfp3")


def test_spec_validation_and_multiples():
    with pytest.raises(UserError, match="unknown quantization format 'int4'"):
        QuantSpec(format="int4")
    with pytest.raises(UserError, match="unknown rounding 'up'"):
        QuantSpec(format="nvfp4", rounding="up")
    assert QuantSpec(format="nvfp4", block=(16, 16)).row_multiple == 16
    assert QuantSpec(format="mxfp4", block=(1, 32), hadamard=True).contraction_multiple == 32
    assert QuantSpec(format="fp8_e4m3", hadamard=True).contraction_multiple == 16
    assert QuantSpec(format="fp8_e4m3").contraction_multiple == 1
    assert "wgrad_g  nvfp4 1x16 SR RHT" in RECIPES["nvfp4"].describe()


def test_slots_are_the_recipe_fields_in_key_order():
    assert tuple(RECIPES["nvfp4"].specs()) == SLOTS == FORWARD_SLOTS + BACKWARD_SLOTS
    assert FORWARD_SLOTS == ("fprop_x", "fprop_w")


def test_which_recipes_round_stochastically():
    nvfp4 = RECIPES["nvfp4"]
    assert nvfp4.is_stochastic() and nvfp4.is_stochastic(BACKWARD_SLOTS) and not nvfp4.is_stochastic(FORWARD_SLOTS)
    assert not any(RECIPES[name].is_stochastic() for name in ("bf16", "nvfp4_no_sr", "nvfp4_fwd_only", "fp8"))


def test_gemm_shapes_that_the_blocks_divide_pass():
    for recipe in RECIPES.values():
        recipe.check_gemm_shapes(m=64, n=64, k=64, where="layer 'a'")
    RECIPES["nvfp4"].check_gemm_shapes(m=None, n=32, k=48, where="layer 'a'")  # M unknown: not checked
    RECIPES["nvfp4"].check_gemm_shapes(m=10, n=32, k=48, slots=FORWARD_SLOTS, where="layer 'a'")  # fprop: any M
    RECIPES["bf16"].check_gemm_shapes(m=3, n=5, k=7, where="layer 'a'")


@pytest.mark.parametrize(
    "recipe, m, n, k, slot, gemm, axis, multiple",
    [
        ("nvfp4", 32, 32, 40, "fprop_x", "fprop", "K", 16),
        ("nvfp4", 32, 24, 32, "fprop_w", "fprop", "N", 16),  # 16x16 weight tiles need N too
        ("nvfp4_1d_weights", 32, 24, 32, "dgrad_g", "dgrad", "N", 16),
        ("nvfp4", 10, 32, 32, "wgrad_g", "wgrad", "M", 16),
        ("mxfp4", 64, 64, 48, "fprop_x", "fprop", "K", 32),
    ],
)
def test_gemm_shapes_the_blocks_do_not_divide_name_slot_gemm_size_and_multiple(
    recipe, m, n, k, slot, gemm, axis, multiple
):
    with pytest.raises(GemmShapeError) as error:
        RECIPES[recipe].check_gemm_shapes(m=m, n=n, k=k, where="layer 'blocks.0.mlp.up'")
    size = {"M": m, "N": n, "K": k}[axis]
    message = str(error.value)
    assert message.startswith("layer 'blocks.0.mlp.up': ") and "\n" not in message
    for part in (repr(recipe), slot, f"{gemm} GEMM", f"{axis}={size} to be a multiple of {multiple}", "bf16"):
        assert part in message, (part, message)
    assert "precision." not in message and "model." not in message  # library-neutral: no CLI keys
    assert (error.value.slot, error.value.gemm, error.value.axis) == (slot, gemm, axis)
    assert (error.value.size, error.value.multiple) == (size, multiple)
    assert isinstance(error.value, UserError) and isinstance(error.value, ValueError)


def test_gemm_shapes_checks_only_the_slots_asked_for():
    RECIPES["nvfp4"].check_gemm_shapes(m=10, n=32, k=32, slots=FORWARD_SLOTS, where="w")
    with pytest.raises(GemmShapeError, match="M=10"):
        RECIPES["nvfp4"].check_gemm_shapes(m=10, n=32, k=32, slots=BACKWARD_SLOTS, where="w")


def test_2026_presets_change_what_they_name():
    nvfp4 = RECIPES["nvfp4"].specs()
    four = RECIPES["nvfp4_4over6"].specs()
    for slot in SLOTS:  # TransformerEngine's scope: every operand without the RHT, E4M3 bound 256, MAE
        expected = None if nvfp4[slot].hadamard else "mae"
        assert four[slot].four_over_six == expected and four[slot].e4m3_max == (448 if expected is None else 256)
    rows = RECIPES["nvfp4_row_scaled"].specs()
    assert [rows[s].row_scaled for s in SLOTS] == [nvfp4[s].block == (1, 16) for s in SLOTS]
    hybrid = RECIPES["mxfp8_fwd_nvfp4_bwd"]
    assert {hybrid.fprop_x.format, hybrid.fprop_w.format} == {"mxfp8"}
    assert all(getattr(hybrid, s) == nvfp4[s] for s in BACKWARD_SLOTS)
    reverse = RECIPES["nvfp4_fwd_mxfp8_bwd"]
    assert all(getattr(reverse, s) == nvfp4[s] for s in FORWARD_SLOTS)
    assert {getattr(reverse, s).format for s in BACKWARD_SLOTS} == {"mxfp8"}
    for name, override in (("nvfp4_bwd_high_precision", "high_precision"), ("nvfp4_bwd_dequantized", "dequantized")):
        recipe = RECIPES[name]
        assert recipe.backward_override == override
        assert all(getattr(recipe, s) is None for s in BACKWARD_SLOTS)
        assert all(getattr(recipe, s) == nvfp4[s] for s in FORWARD_SLOTS)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: QuantSpec(format="mxfp8", block=(1, 32), row_scaled=True), "are nvfp4 options"),
        (lambda: QuantSpec(format="nvfp4", block=(16, 16), row_scaled=True), "row_scaled needs 1x16"),
        (lambda: QuantSpec(format="nvfp4", e4m3_max=256), "set four_over_six too"),
        (lambda: Recipe(name="x", backward_override="fp8"), "unknown backward_override"),
        (
            lambda: Recipe(name="x", wgrad_x=QuantSpec(format="nvfp4"), backward_override="dequantized"),
            "wgrad_x are quantized",
        ),
    ],
)
def test_bad_2026_options_are_refused(make, message):
    with pytest.raises(UserError, match=message):
        make()
