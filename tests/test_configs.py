"""Every config in configs/ loads, validates against the recipes, and holds overrides only."""

import dataclasses
import math
import pathlib
import re
import typing
from typing import Any

import pytest
import yaml

from fp4lm.config import Config, load_config
from fp4lm.train.validate import check_config_for_training

CONFIGS = sorted((pathlib.Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def test_there_are_configs():
    names = {path.stem for path in CONFIGS}
    assert {"default", "shakespeare", "125m", "llama3-8b"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_loads_and_validates(path, monkeypatch):
    from fp4lm.sharding import MESH_AXES
    from fp4lm.train import validate

    config = load_config(path)
    assert isinstance(config, Config)
    # On the devices its mesh states (a -1 axis counted as one), as a run of the config would see them.
    devices = math.prod(max(1, getattr(config.mesh, axis)) for axis in MESH_AXES)
    monkeypatch.setattr(validate, "all_devices", lambda: [None] * devices)
    check_config_for_training(config)
    tree = yaml.safe_load(path.read_text())
    assert isinstance(tree, dict) and tree, "a config holds overrides, nested by section"


def test_default_is_the_documented_cpu_run():
    config = load_config(CONFIGS[0].parent / "default.yaml")
    assert config.precision.recipe == "nvfp4"
    assert config.data.tokenizer == "bpe"
    assert config.data.path == "bundled:shakespeare"
    assert config.precision.bf16_last_layers >= 1  # the paper keeps the last layers in bf16
    assert config.precision.bf16_last_layers + config.precision.bf16_first_layers < config.model.num_layers


def test_each_choice_is_declared_once_and_shared_with_its_owner():
    """The Literal on a config field is the list of allowed values the implementing module uses too."""
    import dataclasses
    import typing

    from fp4lm import config as config_module
    from fp4lm import tokenizer
    from fp4lm.data import raw_source
    from fp4lm.model import attention, llama
    from fp4lm.quant import gemm

    assert typing.get_args(config_module.RematMode) == llama.REMAT_MODES
    assert typing.get_args(config_module.GemmBackend) == gemm.BACKENDS
    assert typing.get_args(config_module.DataFormat) == raw_source.FORMATS
    assert typing.get_args(config_module.TokenizerKind) == tokenizer.TOKENIZER_KEYWORDS
    assert (*typing.get_args(config_module.AttentionImplementation), "reference") == attention.IMPLEMENTATIONS
    assert typing.get_args(config_module.AttentionPrecision) == attention.PRECISIONS
    hints = typing.get_type_hints(config_module.ModelConfig)
    assert hints["remat"] is config_module.RematMode
    with pytest.raises(ValueError, match=r"model.remat='fast' is not one of: none, full"):
        load_config(None, ["model.remat=fast"])
    built_in_code = dataclasses.replace(Config(), data=dataclasses.replace(Config().data, format="csv"))
    with pytest.raises(ValueError, match=r"data.format='csv' is not one of"):
        config_module.validate(built_in_code)


def test_the_bpe_vocabulary_floor_is_one_number():
    from fp4lm.config import BPE_MIN_VOCAB_SIZE
    from fp4lm.tokenizer import BPETokenizer

    load_config(None, [f"data.vocab_size={BPE_MIN_VOCAB_SIZE}"])
    with pytest.raises(ValueError, match=f"at least {BPE_MIN_VOCAB_SIZE}"):
        load_config(None, [f"data.vocab_size={BPE_MIN_VOCAB_SIZE - 1}"])
    with pytest.raises(ValueError, match=f"at least {BPE_MIN_VOCAB_SIZE}"):
        BPETokenizer.train("some text\n" * 10, BPE_MIN_VOCAB_SIZE - 1)


def test_the_default_config_is_package_data_and_configs_default_links_to_it():
    from fp4lm import resources

    packaged = resources.default_config()
    assert packaged.is_file() and packaged.parent.name == "resources"
    assert CONFIGS[0].parent.joinpath("default.yaml").resolve() == packaged.resolve()
    assert resources.data_file("bundled:shakespeare").is_file()
    pyproject = (CONFIGS[0].parents[1] / "pyproject.toml").read_text()
    assert '"fp4lm.resources" = ["*.yaml", "*.txt.xz"]' in pyproject


def test_the_editable_install_serves_the_package_data_from_any_directory(tmp_path):
    """A fresh interpreter outside the repository (no PYTHONPATH) finds both packaged files."""
    import subprocess
    import sys

    code = (
        "from fp4lm import resources; "
        "print(resources.default_config().is_file(), resources.data_file('bundled:shakespeare').is_file())"
    )
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.stdout.split() == ["True", "True"], done.stderr[-2000:]


def test_a_relative_data_path_is_relative_to_the_config_file(tmp_path, monkeypatch):
    config_dir = tmp_path / "project" / "configs"
    config_dir.mkdir(parents=True)
    (config_dir / "run.yaml").write_text("data: {path: ../corpus/text.txt}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_config(config_dir / "run.yaml").data.path == str(tmp_path / "project" / "corpus" / "text.txt")
    # on the command line a relative path means the current directory; the config holds it absolute
    assert load_config(config_dir / "run.yaml", ["data.path=mine.txt"]).data.path == str(elsewhere / "mine.txt")
    assert load_config(None, ["data.path=bundled:shakespeare"]).data.path == "bundled:shakespeare"
    with pytest.raises(
        ValueError, match=r"unknown bundled corpus 'bundled:nope'; bundled corpora: bundled:shakespeare"
    ):
        load_config(None, ["data.path=bundled:nope"])


def _float_keys():
    import dataclasses
    import typing

    for section, section_cls in typing.get_type_hints(Config).items():
        for field in dataclasses.fields(section_cls):
            if "float" in str(typing.get_type_hints(section_cls)[field.name]):
                yield f"{section}.{field.name}"


FLOAT_KEYS = list(_float_keys())


def test_the_float_keys_are_found():
    assert {"optimizer.lr", "optimizer.grad_clip", "model.init_std", "precision.bf16_after"} <= set(FLOAT_KEYS)


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e999", ".nan"])
def test_every_float_key_refuses_non_finite_numbers(key, text):
    with pytest.raises(ValueError, match=rf"{key}: expected a finite number"):
        load_config(None, [f"{key}={text}"])


def test_non_finite_numbers_in_a_yaml_file_are_refused(tmp_path):
    path = tmp_path / "nan.yaml"
    path.write_text("optimizer: {lr: .nan}\n")
    with pytest.raises(ValueError, match=r"optimizer.lr: expected a finite number"):
        load_config(path)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("model:\n  d_model: 64\n  d_model: 32\n", "key 'd_model' is given twice (lines 2 and 3)"),
        (
            "model: {d_model: 64}\ndata: {seq_len: 32}\nmodel: {num_layers: 2}\n",
            "key 'model' is given twice (lines 1 and 3)",
        ),
        ("model: {d_model: 64, d_model: 32}\n", "key 'd_model' is given twice (lines 1 and 1)"),
    ],
)
def test_a_key_given_twice_is_refused_with_its_lines(tmp_path, text, fragment):
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(fragment) + "; keep one of them"):
        load_config(path)


def test_the_duplicate_key_check_is_scoped_to_our_loader():
    assert yaml.safe_load("a: 1\na: 2\n") == {"a": 2}  # yaml itself is not patched


def test_the_config_imports_no_model_quant_or_jax_code():
    """fp4lm.config is the lowest layer (beside fp4lm.errors): importing it loads nothing above it."""
    import subprocess
    import sys

    code = (
        "import sys, fp4lm.config; "
        "print([m for m in sys.modules if m.split('.')[0] == 'jax' or m.startswith(('fp4lm.model', 'fp4lm.quant', "
        "'fp4lm.train', 'fp4lm.data'))])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr[-2000:]


def _keys_with_a_bad_value():
    """(section.key, a value its declared rule refuses) for every key whose rule is a range or positivity."""
    import dataclasses
    import math
    import typing

    from fp4lm.config.fields import InRange, positive

    for section, section_cls in typing.get_type_hints(Config).items():
        for field in dataclasses.fields(section_cls):
            rule = field.metadata.get("rule")
            if rule is positive:
                yield f"{section}.{field.name}", 0
            elif isinstance(rule, InRange):
                yield f"{section}.{field.name}", rule.low if rule.low_open else rule.low - 1
                if rule.high != math.inf:
                    yield f"{section}.{field.name}", rule.high if rule.high_open else rule.high + 1


KEYS_WITH_A_BAD_VALUE = list(_keys_with_a_bad_value())


def test_the_rules_declared_with_the_fields_are_found():
    keys = {key for key, _ in KEYS_WITH_A_BAD_VALUE}
    assert {"model.d_model", "data.val_fraction", "optimizer.b2", "eval.sample_top_p", "profile.steps"} <= keys
    assert {"precision.bf16_first_layers", "precision.bf16_last_layers"} <= keys  # each count's own rule


def test_train_steps_beyond_the_int32_step_counter_are_refused_with_the_field():
    from fp4lm.errors import UserError

    load_config(None, ["train.steps=2147483647"])
    with pytest.raises(UserError, match=r"^train.steps=2,147,483,648 is more than the step counter holds"):
        load_config(None, ["train.steps=2147483648"])


@pytest.mark.parametrize("key, value", KEYS_WITH_A_BAD_VALUE, ids=lambda v: str(v))
def test_each_declared_rule_refuses_with_one_line_naming_its_key(key, value):
    from fp4lm.errors import UserError

    with pytest.raises(UserError) as refused:
        load_config(None, [f"{key}={value}"])
    message = str(refused.value)
    assert message.startswith(key) and "\n" not in message and "; " in message, message


def _keys_and_fields(prefix: str, section_cls: Any):
    """(key, field) for every field of `section_cls` and of the dataclasses in its lists (data.sources[].path)."""
    hints = typing.get_type_hints(section_cls)
    for field in dataclasses.fields(section_cls):
        key = f"{prefix}.{field.name}" if prefix else field.name
        if dataclasses.is_dataclass(hints[field.name]):  # a section of Config
            yield from _keys_and_fields(key, hints[field.name])
            continue
        yield key, field
        for entry in typing.get_args(hints[field.name]):
            if dataclasses.is_dataclass(entry):
                yield from _keys_and_fields(f"{key}[]", entry)


def test_every_key_has_help_text():
    from fp4lm.config.fields import help_of

    keys = dict(_keys_and_fields("", Config))
    assert {"data.sources[].path", "metrics.progress", "precision.bf16_last_layers"} <= keys.keys()
    assert [key for key, field in keys.items() if not help_of(field)] == []


def test_keys_help_shows_each_keys_help_text():
    from fp4lm.config import keys_help

    lines = keys_help().splitlines()
    kv_heads = next(line for line in lines if line.split()[:1] == ["model.num_kv_heads"])
    assert kv_heads.split()[1:3] == ["2", "(int)"] and kv_heads.endswith("grouped-query attention); divides num_heads")
