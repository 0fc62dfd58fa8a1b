import pytest

from fp4lm.compare.presets import PRESETS, preset_overrides
from fp4lm.compare.specs import parse_entry, parse_recipes, sanitise
from fp4lm.config import load_config
from fp4lm.errors import UserError


def test_plain_recipe_is_its_own_label():
    spec = parse_entry("nvfp4")
    assert (spec.recipe, spec.overrides, spec.label, spec.display) == ("nvfp4", (), "nvfp4", "nvfp4")
    assert not spec.is_baseline
    assert parse_entry("bf16").is_baseline


def test_overrides_become_label_and_display():
    spec = parse_entry("nvfp4_naive@precision.bf16_last_layers=0@precision.bf16_first_layers=0")
    assert spec.recipe == "nvfp4_naive"
    assert spec.overrides == ("precision.bf16_last_layers=0", "precision.bf16_first_layers=0")
    assert spec.label == "nvfp4_naive_bf16_last_layers-0_bf16_first_layers-0"
    assert spec.display == "nvfp4_naive + bf16_last_layers=0 + bf16_first_layers=0"
    assert parse_entry("nvfp4@precision.bf16_after=0.8").label == "nvfp4_bf16_after-0.8"
    assert not parse_entry("bf16@train.seed=1").is_baseline


def test_a_key_that_several_sections_have_keeps_its_section():
    """`enabled` alone could be checkpoint's or loss scaling's: such a key is named with its section."""
    spec = parse_entry("nvfp4@loss_scale.enabled=false")
    assert (spec.label, spec.display) == ("nvfp4_loss_scale.enabled-false", "nvfp4 + loss_scale.enabled=false")
    assert parse_entry("bf16@eval.every=50").display == "bf16 + eval.every=50"
    assert parse_entry("bf16@optimizer.warmup_steps=90").display == "bf16 + warmup_steps=90"


def test_labels_are_file_name_safe():
    assert sanitise("a/b c=d:e") == "a_b_c_d_e"
    assert sanitise("///") == "run"
    label = parse_entry("nvfp4@precision.rules=blocks\\.0\\..*=bf16").label
    assert "/" not in label and "\\" not in label and "*" not in label


def test_recipe_list_parsing_and_errors():
    specs = parse_recipes(" bf16, nvfp4 ,nvfp4@precision.bf16_after=0.8,")
    assert [s.label for s in specs] == ["bf16", "nvfp4", "nvfp4_bf16_after-0.8"]
    with pytest.raises(UserError, match="same run"):
        parse_recipes("nvfp4,nvfp4")
    with pytest.raises(UserError, match="empty"):
        parse_recipes(" , ")
    with pytest.raises(UserError, match="compare sets itself"):
        parse_recipes("nvfp4@train.run_dir=/tmp/x")
    with pytest.raises(UserError, match="no recipe name"):
        parse_recipes("@precision.bf16_after=0.8")
    with pytest.raises(UserError, match="section.key=value"):
        parse_recipes("nvfp4@bf16_after")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid_configs(name):
    config = load_config(None, preset_overrides(name))
    for section, values in PRESETS[name].items():
        for key, value in values.items():
            assert getattr(getattr(config, section), key) == value


def test_quick_preset_is_smaller_than_standard():
    quick, standard = (load_config(None, preset_overrides(n)) for n in ("quick", "standard"))
    assert quick.train.steps * quick.train.batch_size * quick.data.seq_len < (
        standard.train.steps * standard.train.batch_size * standard.data.seq_len
    )
    assert quick.model.d_model < standard.model.d_model


def test_unknown_preset_and_no_preset():
    with pytest.raises(UserError, match="unknown preset 'huge'.*quick"):
        preset_overrides("huge")
    assert preset_overrides(None) == []
