"""The recipe registry: the presets say what the issue and the paper say, and names resolve or fail clearly."""

import pytest

from fp4lm.errors import UserError
from fp4lm.quant.recipes import RECIPES, QuantSpec, Recipe, get_recipe

NAMES = ("bf16", "nvfp4", "nvfp4_no_rht", "nvfp4_no_sr", "nvfp4_1d_weights", "nvfp4_fwd_only", "nvfp4_naive",
         "mxfp4", "mxfp8", "fp8")


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
        s.rounding for s in nvfp4.values()]
    assert all(s.rounding == "nearest" for s in no_sr.values())
    assert [s.hadamard for s in no_sr.values()] == [s.hadamard for s in nvfp4.values()]
    one_d = specs("nvfp4_1d_weights")
    assert one_d["fprop_w"].block == one_d["dgrad_w"].block == (1, 16)
    assert {k: v for k, v in one_d.items() if k not in ("fprop_w", "dgrad_w")} == {
        k: v for k, v in nvfp4.items() if k not in ("fprop_w", "dgrad_w")}
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
