"""Layer policy: ordered rules, bf16 sugar, errors, printable table, stable seeds."""

import dataclasses
import zlib

import pytest

from fp4lm.errors import UserError
from fp4lm.quant.policy import Policy
from fp4lm.quant.recipes import RECIPES

PROJECTIONS = ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up", "mlp.down")


def layer_paths(num_layers):
    return [f"blocks.{i}.{p}" for i in range(num_layers) for p in PROJECTIONS]


def test_default_recipe_applies_everywhere():
    policy = Policy("nvfp4", num_layers=2)
    assert {policy.recipe_for(p).name for p in layer_paths(2)} == {"nvfp4"}


def test_bf16_first_and_last_layers():
    policy = Policy("nvfp4", num_layers=12, bf16_first_layers=1, bf16_last_layers=2)
    names = policy.assignments(layer_paths(12))
    bf16_blocks = {int(p.split(".")[1]) for p, r in names.items() if r == "bf16"}
    assert bf16_blocks == {0, 10, 11}
    assert policy.summary(layer_paths(12)) == "nvfp4: 63 of 84 linear layers; bf16: 21 of 84 linear layers"
    # blocks.1 must not be caught by a sloppy "blocks.1.*" pattern from blocks.10/11
    assert policy.recipe_name_for("blocks.1.mlp.up") == "nvfp4"


def test_rules_first_match_wins_and_regex_is_fullmatch():
    policy = Policy(
        "nvfp4",
        num_layers=4,
        rules=((r"blocks\.\d+\.mlp\.down", "fp8"), (r"blocks\.\d+\.mlp\..*", "mxfp4"), (r"attn", "bf16")),
    )
    paths = layer_paths(4)
    policy.validate(paths[:-1] + ["attn"])  # the "attn" rule only matches a path that is exactly "attn"
    assert policy.recipe_name_for("blocks.2.mlp.down") == "fp8"
    assert policy.recipe_name_for("blocks.2.mlp.up") == "mxfp4"
    assert policy.recipe_name_for("blocks.2.attn.q") == "nvfp4"  # "attn" does not fullmatch
    with pytest.raises(UserError, match="matches no linear layer"):
        policy.validate(paths)


def test_user_rules_come_before_the_sugar():
    policy = Policy("nvfp4", num_layers=4, bf16_last_layers=2, rules=((r"blocks\.3\.mlp\..*", "fp8"),))
    assert policy.recipe_name_for("blocks.3.mlp.up") == "fp8"  # the explicit rule overrides the sugar
    assert policy.recipe_name_for("blocks.3.attn.q") == "bf16"
    assert policy.recipe_name_for("blocks.2.mlp.up") == "bf16"
    assert policy.recipe_name_for("blocks.1.mlp.up") == "nvfp4"


def test_rule_forms_and_hashability():
    as_pairs = Policy("nvfp4", num_layers=2, rules=[["blocks\\.0\\..*", "bf16"]])
    as_strings = Policy("nvfp4", num_layers=2, rules=["blocks\\.0\\..*=bf16"])
    as_mapping = Policy("nvfp4", num_layers=2, rules={"blocks\\.0\\..*": "bf16"})
    assert as_pairs == as_strings == as_mapping
    assert len({as_pairs, as_strings, as_mapping}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        as_pairs.recipe = "bf16"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(recipe="nvfp5", num_layers=2), "unknown precision recipe 'nvfp5'; use one of bf16, nvfp4"),
        (dict(recipe="nvfp4", num_layers=2, rules=(("x", "int4"),)), "unknown precision recipe 'int4'"),
        (dict(recipe="nvfp4", num_layers=2, rules=(("(", "bf16"),)), "regex '\\(' is invalid"),
        (dict(recipe="nvfp4", num_layers=2, bf16_last_layers=3), "exceed num_layers=2"),
        (dict(recipe="nvfp4", num_layers=2, bf16_first_layers=-1), "bf16_first_layers=-1 must be >= 0"),
        (dict(recipe="nvfp4", num_layers=2, backend="tpu"), "unknown GEMM backend 'tpu'"),
        (dict(recipe="nvfp4", num_layers=2, rules=("no-equals-sign",)), "has no recipe"),
    ],
)
def test_user_errors(kwargs, message):
    with pytest.raises(UserError, match=message):
        Policy(**kwargs)


def test_sugar_matching_no_layer_is_an_error():
    policy = Policy("nvfp4", num_layers=24, bf16_last_layers=2)  # but the model only has 4 blocks
    with pytest.raises(UserError, match="bf16_last_layers=2 matches no linear layer"):
        policy.validate(layer_paths(4))


def test_table_lists_every_layer():
    policy = Policy("nvfp4", num_layers=2, bf16_first_layers=1)
    table = policy.table(layer_paths(2))
    lines = table.splitlines()
    assert len(lines) == 2 + 14
    assert lines[2].split() == ["blocks.0.attn.q", "bf16"]
    assert lines[-1].split() == ["blocks.1.mlp.down", "nvfp4"]


def test_layer_seed_is_stable_and_distinct():
    policy = Policy("nvfp4", num_layers=4)
    seeds = [policy.layer_seed(p) for p in layer_paths(4)]
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= s < 2**31 for s in seeds)
    assert Policy("bf16", num_layers=1).layer_seed("blocks.0.attn.q") == policy.layer_seed("blocks.0.attn.q")
    assert policy.layer_seed("blocks.0.attn.q") == zlib.crc32(b"blocks.0.attn.q") & 0x7FFFFFFF


def test_dot_general_for_carries_recipe_and_path():
    policy = Policy("nvfp4", num_layers=2, bf16_first_layers=1, backend="emulated")
    fn = policy.dot_general_for("blocks.1.mlp.up")
    assert fn.recipe is RECIPES["nvfp4"] and fn.name == "blocks.1.mlp.up"
    assert not hasattr(fn, "seed") and fn.backend == "emulated"  # no fixed fallback key: the layer passes key=
    assert policy.dot_general_for("blocks.1.mlp.up") == fn  # equal values: jit caches are reused
    assert not policy.dot_general_for("blocks.0.mlp.up").recipe.is_quantized


def test_bf16_convenience():
    assert Policy.bf16().summary(["blocks.0.attn.q"]) == "bf16: 1 of 1 linear layers"
