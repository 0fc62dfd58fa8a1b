"""Every config in configs/ loads, validates against the recipes, and holds overrides only."""

import pathlib

import pytest
import yaml

from fp4lm.config import Config, load_config
from fp4lm.train.validate import check_config_for_training

CONFIGS = sorted((pathlib.Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def test_there_are_configs():
    names = {path.stem for path in CONFIGS}
    assert {"default", "shakespeare", "125m", "llama3-8b"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_loads_and_validates(path):
    config = load_config(path)
    assert isinstance(config, Config)
    check_config_for_training(config)
    tree = yaml.safe_load(path.read_text())
    assert isinstance(tree, dict) and tree, "a config holds overrides, nested by section"


def test_default_is_the_documented_cpu_run():
    config = load_config(CONFIGS[0].parent / "default.yaml")
    assert config.precision.recipe == "nvfp4"
    assert config.data.tokenizer == "bpe"
    assert config.data.path == "data/shakespeare.txt.xz"
    assert config.precision.bf16_last_layers >= 1  # the paper keeps the last layers in bf16
    assert config.precision.bf16_last_layers + config.precision.bf16_first_layers < config.model.num_layers
