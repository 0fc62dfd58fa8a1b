"""Checks that need the recipes and the device (block-size divisibility), resuming, the run directory."""

import errno
import os

import pytest

from fp4lm.config import load_config
from fp4lm.errors import UserError
from fp4lm.quant import Policy
from fp4lm.train.validate import (
    check_batch_splits,
    check_config_for_training,
    check_resume_compatible,
    describe_os_error,
    prepare_run_dir,
)

SMALL = [
    "model.num_layers=2",
    "model.d_model=64",
    "model.num_heads=4",
    "model.num_kv_heads=2",
    "model.mlp_dim=128",
    "data.seq_len=32",
    "train.batch_size=4",
]


def _check(*overrides):
    config = load_config(None, SMALL + list(overrides))
    check_config_for_training(config)
    return Policy.from_config(config)


@pytest.mark.parametrize(
    "overrides, splits",
    [
        (["mesh.data=2", "mesh.fsdp=4"], 8),  # a dense model: its rows are sharded over the batch axes too
        (["mesh.data=1", "mesh.fsdp=2", "mesh.tensor=4", "train.grad_accum_steps=4"], 2),  # 1 row a micro-batch
        (["mesh.fsdp=4", "mesh.tensor=2", "train.batch_size=6"], 4),  # tensor devices share their rows
    ],
)
def test_a_micro_batch_that_does_not_split_over_the_batch_devices_is_refused(overrides, splits):
    config = load_config(None, SMALL + overrides)
    with pytest.raises(UserError, match=f"does not split over the {splits} devices.*multiple of {splits}"):
        check_batch_splits(config, 8)


def test_a_micro_batch_that_splits_over_the_batch_devices_passes():
    check_batch_splits(load_config(None, SMALL + ["mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2"]), 8)
    check_batch_splits(load_config(None, SMALL + ["mesh.fsdp=4", "train.grad_accum_steps=1"]), 4)


def test_divisible_shapes_pass():
    policy = _check()
    assert policy.recipe == "nvfp4"
    _check("precision.recipe=mxfp4")


@pytest.mark.parametrize(
    "overrides, key, multiple",
    [
        (["model.d_model=72", "model.num_heads=4", "model.head_dim=16"], "model.d_model=72", 16),
        (["model.mlp_dim=120"], "model.mlp_dim=120", 16),
        (["model.head_dim=10", "model.num_heads=4", "model.num_kv_heads=2"], "model.num_heads * head_dim=40", 16),
        (
            ["model.d_model=48", "model.num_heads=3", "model.num_kv_heads=1", "precision.recipe=mxfp4"],
            "model.d_model=48",
            32,
        ),
        (["data.seq_len=5", "train.batch_size=3"], "train.batch_size * data.seq_len=15", 16),
    ],
)
def test_widths_not_divisible_by_the_block_name_the_key(overrides, key, multiple):
    with pytest.raises(UserError) as error:
        _check(*overrides)
    message = str(error.value)
    assert message.startswith(key) and "\n" not in message
    if multiple:
        assert f"multiple of {multiple}" in message


def test_bf16_layers_need_no_blocks():
    _check("model.mlp_dim=120", "precision.recipe=bf16")
    _check("model.mlp_dim=120", "precision.bf16_first_layers=1", "precision.bf16_last_layers=1")
    with pytest.raises(UserError, match="model.mlp_dim=120"):
        _check("model.mlp_dim=120", "precision.bf16_last_layers=1")


def test_unknown_recipe_and_dead_rule():
    with pytest.raises(UserError, match="unknown precision recipe 'nvfp5'"):
        _check("precision.recipe=nvfp5")
    with pytest.raises(UserError, match="matches no linear layer"):
        _check(r"precision.rules=blocks\.9\..*=bf16")


def test_resume_compatibility():
    config = load_config(None, SMALL)
    saved = config.to_dict()
    check_resume_compatible(saved, config)
    check_resume_compatible(
        saved, load_config(None, SMALL + ["train.steps=5000", "eval.every=7", "checkpoint.every=9"])
    )
    check_resume_compatible(saved, load_config(None, SMALL + ["model.attention=xla"]))  # how, not what, it computes
    asks_for_wider = r"model.d_model=64, but this run asks for model.d_model=128.*new train.run_dir"
    with pytest.raises(UserError, match=asks_for_wider):
        check_resume_compatible(saved, load_config(None, SMALL + ["model.d_model=128"]))
    with pytest.raises(UserError, match="data.tokenizer=bpe, but this run asks for data.tokenizer=byte"):
        check_resume_compatible(saved, load_config(None, SMALL + ["data.tokenizer=byte", "data.vocab_size=256"]))


def test_a_run_saved_before_a_model_key_existed_had_its_default():
    """A dense run saved before the mixture-of-experts keys existed: asking it for experts is refused by the
    settings (its checkpoint's shapes would otherwise fail to restore, blamed on the checkpoint)."""
    saved = load_config(None, SMALL).to_dict()
    for key in ("num_experts", "moe_mlp_dim", "qk_norm"):
        del saved["model"][key]
    check_resume_compatible(saved, load_config(None, SMALL))
    del saved["model"]["scan_layers"]  # the same parameters either way: free (docs/training.md, "Scanned layers")
    check_resume_compatible(saved, load_config(None, SMALL + ["model.scan_layers=true"]))
    with pytest.raises(UserError, match=r"model.num_experts=0, but this run asks for model.num_experts=4"):
        check_resume_compatible(saved, load_config(None, SMALL + ["model.num_experts=4", "model.moe_mlp_dim=32"]))


MOE_RUN = ["model.num_experts=4", "model.moe_mlp_dim=32", "model.experts_per_token=2"]


@pytest.mark.parametrize(
    "change, saved_value",
    [
        ("model.num_experts=8", "model.num_experts=4"),
        ("model.experts_per_token=1", "model.experts_per_token=2"),
        ("model.moe_mlp_dim=48", "model.moe_mlp_dim=32"),
        ("model.num_shared_experts=1", "model.num_shared_experts=0"),
        ("model.router_score=sigmoid", "model.router_score=softmax"),
        ("model.capacity_factor=1.25", "model.capacity_factor=None"),
        ("model.first_dense_layers=1", "model.first_dense_layers=0"),
    ],
)
def test_a_moe_run_resumes_only_with_its_own_experts_and_router(change, saved_value):
    """Every MoE key is part of the model a checkpoint holds (its shapes, or the function its router learned):
    a resume that changes one is refused, naming the saved value and the asked one."""
    saved = load_config(None, SMALL + MOE_RUN).to_dict()
    check_resume_compatible(saved, load_config(None, SMALL + MOE_RUN))
    with pytest.raises(UserError, match=rf"{saved_value}, but this run asks for {change}; leave these settings out"):
        check_resume_compatible(saved, load_config(None, SMALL + MOE_RUN + [change]))


def test_a_saved_config_without_a_section_is_not_compared_on_it():
    """Only a key missing from a saved section has its default: a config.json with no model or data section (a
    run stopped before its first checkpoint, written by a tool) compares on the keys it holds."""
    check_resume_compatible({"checkpoint": {"enabled": True}}, load_config(None, SMALL + ["model.num_layers=1"]))
    with pytest.raises(UserError, match=r"train.batch_size=16, but this run asks for train.batch_size=4"):
        check_resume_compatible({"train": {"batch_size": 16}}, load_config(None, SMALL))


def test_resume_lists_every_changed_setting_by_its_key():
    config = load_config(None, SMALL)
    saved = config.to_dict()
    changed = load_config(
        None,
        SMALL + ["data.path=/elsewhere/corpus.txt", "train.seed=3", "train.batch_size=8", "precision.recipe=mxfp4"],
    )
    with pytest.raises(UserError) as refused:
        check_resume_compatible(saved, changed)
    line = str(refused.value)
    assert "\n" not in line
    for text in (
        "data.path=/elsewhere/corpus.txt",
        "train.seed=0",
        "train.seed=3",
        "train.batch_size=4",
        "train.batch_size=8",
        "precision.recipe=nvfp4",
        "precision.recipe=mxfp4",
        "train.allow_recipe_change=true",
    ):
        assert text in line, (text, line)


def test_a_recipe_switch_on_resume_needs_its_override():
    saved = load_config(None, SMALL).to_dict()
    with pytest.raises(UserError, match="precision.recipe=nvfp4, but this run asks for precision.recipe=bf16"):
        check_resume_compatible(saved, load_config(None, SMALL + ["precision.recipe=bf16"]))
    check_resume_compatible(
        saved, load_config(None, SMALL + ["precision.recipe=bf16", "train.allow_recipe_change=true"])
    )
    with pytest.raises(UserError, match="model.d_model"):  # the override allows the recipe only
        check_resume_compatible(
            saved, load_config(None, SMALL + ["model.d_model=128", "train.allow_recipe_change=true"])
        )


def test_run_dir_problems(tmp_path):
    assert prepare_run_dir(str(tmp_path / "a" / "b")).is_dir()
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(UserError, match="not a directory"):
        prepare_run_dir(str(file))
    if os.geteuid() != 0:  # root writes anywhere; the message itself is checked below
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(UserError, match="cannot write"):
            prepare_run_dir(str(locked / "run"))


def test_os_error_messages_are_one_line():
    full = describe_os_error(OSError(errno.ENOSPC, "No space left on device", "/x/metrics.jsonl"), "the run")
    assert full.startswith("no space left") and "/x/metrics.jsonl" in full and "\n" not in full
    denied = describe_os_error(PermissionError(errno.EACCES, "Permission denied", "/x"), "train.run_dir=/x")
    assert "cannot write train.run_dir=/x" in denied and "writable" in denied
