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


def test_each_choice_is_declared_once_and_shared_with_its_owner():
    """The Literal on a config field is the list of allowed values the implementing module uses too."""
    import dataclasses
    import typing

    from fp4lm import config as config_module
    from fp4lm.data import readers, tokenizer
    from fp4lm.model import llama
    from fp4lm.quant import gemm

    assert llama.REMAT_MODES == typing.get_args(config_module.RematMode)
    assert gemm.BACKENDS == typing.get_args(config_module.GemmBackend)
    assert readers.FORMATS == typing.get_args(config_module.DataFormat)
    assert tokenizer.TOKENIZER_NAMES == typing.get_args(config_module.TokenizerKind)
    hints = typing.get_type_hints(config_module.ModelConfig)
    assert hints["remat"] is config_module.RematMode
    with pytest.raises(ValueError, match=r"model.remat='fast' is not one of: none, full"):
        load_config(None, ["model.remat=fast"])
    built_in_code = dataclasses.replace(Config(), data=dataclasses.replace(Config().data, format="csv"))
    with pytest.raises(ValueError, match=r"data.format='csv' is not one of"):
        config_module.validate(built_in_code)


def test_the_bpe_vocabulary_floor_is_one_number():
    from fp4lm.config import BPE_MIN_VOCAB_SIZE
    from fp4lm.data.tokenizer import BPETokenizer

    load_config(None, [f"data.vocab_size={BPE_MIN_VOCAB_SIZE}"])
    with pytest.raises(ValueError, match=f"at least {BPE_MIN_VOCAB_SIZE}"):
        load_config(None, [f"data.vocab_size={BPE_MIN_VOCAB_SIZE - 1}"])
    with pytest.raises(ValueError, match=f"at least {BPE_MIN_VOCAB_SIZE}"):
        BPETokenizer.train("some text\n" * 10, BPE_MIN_VOCAB_SIZE - 1)
