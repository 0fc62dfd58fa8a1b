"""The `fp4lm` command as a user meets it: every mistake is one line on stderr, exit code 2, no traceback.

Most checks call the command line's own entry point (`fp4lm.cli.main`) in this process: the same parsing, checks
and one-line answer, without starting an interpreter and importing JAX for each (seconds apiece). The installed
command itself, in a fresh process with a bare environment, is checked once for help and once for an error.
"""

import os
import pathlib
import subprocess
import sys

import pytest

from fp4lm import cli
from fp4lm.errors import TrainingDiverged, UserError
from tests.reliability.helpers_reliability import run_cli_in_process

TIMEOUT_S = 300
REPO = pathlib.Path(__file__).resolve().parents[1]


def _fp4lm_process(*args, cwd=None):
    """`python -m fp4lm ARGS` in a fresh process with a bare environment."""
    return subprocess.run(
        [sys.executable, "-m", "fp4lm", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=cwd,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )


def _fp4lm(*args):
    """`fp4lm ARGS` through `fp4lm.cli.main` in this process, its exit code and output as a finished process's."""
    result = run_cli_in_process(*args)
    return subprocess.CompletedProcess(list(args), result.code, result.stdout, result.stderr)


def _assert_one_line_error(done, *fragments):
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("error: ") and "Traceback" not in done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["train", "train.stepz=3"], ["unknown config key train.stepz", "valid keys in train"]),
        (["train", "train.steps=abc"], ["train.steps: expected an integer"]),
        (["train", "optimiser.lr=1"], ["unknown config section 'optimiser'"]),
        (["train", "no/such/config.yaml"], ["config file no/such/config.yaml not found"]),
        (["train", "steps=3"], ["bad override 'steps=3'", "section.key=value"]),
        (["train", "configs/default.yaml", "oops"], ["unexpected argument 'oops'"]),
        (["train", "model.d_model=0"], ["model.d_model must be positive"]),
        (["train", "model.num_heads=5"], ["model.num_heads=5 does not divide model.d_model"]),
        (["train", "precision.bf16_after=1.5"], ["precision.bf16_after=1.5"]),
        (["frobnicate"], ["invalid choice: 'frobnicate'"]),
        (["sample", "runs/none"], ["--prompt"]),
    ],
)
def test_config_and_usage_errors(args, fragments, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO if "configs/" in " ".join(args) else tmp_path)
    _assert_one_line_error(_fp4lm(*args), *fragments)


def test_the_installed_command_answers_a_mistake_in_one_line(tmp_path):
    _assert_one_line_error(_fp4lm_process("train", "train.stepz=3", cwd=tmp_path), "unknown config key train.stepz")


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (["model.mlp_dim=100"], ["model.mlp_dim=100 is not a multiple of 16", "nvfp4"]),
        (["precision.recipe=nvfp5"], ["unknown precision recipe 'nvfp5'"]),
        (["mesh.data=3"], ["mesh.data=3", "devices"]),
        (["train.run_dir=/etc/hostname/run"], ["cannot write train.run_dir=/etc/hostname/run"]),
    ],
)
def test_errors_found_before_anything_is_written(overrides, fragments, tmp_path):
    run_dir = tmp_path / "run"
    if not any(o.startswith("train.run_dir") for o in overrides):
        overrides = [*overrides, f"train.run_dir={run_dir}"]
    _assert_one_line_error(_fp4lm("train", *overrides), *fragments)
    assert not run_dir.exists()


def test_eval_and_sample_need_a_run(tmp_path):
    _assert_one_line_error(_fp4lm("eval", str(tmp_path)), "has no checkpoints")
    _assert_one_line_error(_fp4lm("sample", str(tmp_path), "--prompt", "hi"), "has no checkpoints")


def test_eval_batches_is_checked_before_the_run_is_loaded(tmp_path):
    """An empty directory would be refused for its missing checkpoints; --batches 0 is named first."""
    _assert_one_line_error(_fp4lm("eval", str(tmp_path), "--batches", "0"), "--batches 0", "at least one batch")


def test_project_is_wired():
    done = _fp4lm("project", "--model", "125m", "--gpu", "gb200", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "nvfp4" in done.stdout
    _assert_one_line_error(_fp4lm("project", "--model", "125m", "--gpu", "h900"), "h900")


def test_help_lists_the_commands():
    done = _fp4lm_process("--help")
    assert done.returncode == 0
    for command in ("train", "eval", "sample", "project", "compare"):
        assert command in done.stdout


def test_exit_codes_in_process(monkeypatch, capsys):
    """main() maps exceptions to exit codes: UserError 2, TrainingDiverged 3, Ctrl-C 130, OSError 2."""

    def raising(error):
        def run(_argv):
            raise error

        return run

    for error, code in [
        (UserError("bad thing; fix it"), 2),
        (TrainingDiverged("diverged at step 7"), 3),
        (KeyboardInterrupt(), 130),
        (OSError(28, "No space left on device", "/r/x"), 2),
    ]:
        monkeypatch.setattr(cli, "run", raising(error))
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["train"])
        assert exit_info.value.code == code
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1
    assert "no space left" in err


def test_a_read_error_is_not_reported_as_a_write(monkeypatch, capsys):
    """eval/sample/project only read: an OSError there says "cannot read", not "cannot write the run"."""

    def run(_argv):
        raise PermissionError(13, "Permission denied", "/runs/x/checkpoints")

    monkeypatch.setattr(cli, "run", run)
    for command, word in [("eval", "cannot read"), ("project", "cannot read"), ("train", "cannot write")]:
        with pytest.raises(SystemExit) as exit_info:
            cli.main([command])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert word in err and "/runs/x/checkpoints" in err, err


def test_a_library_error_names_its_settings_as_config_keys(monkeypatch, capsys):
    """Library code lists the parameters a fix involves; the CLI prints them as config keys."""

    def run(_argv):
        raise UserError("data file x.txt does not exist; fix the data path", settings=("path",))

    monkeypatch.setattr(cli, "run", run)
    with pytest.raises(SystemExit):
        cli.main(["train"])
    assert capsys.readouterr().err.strip() == "error: data file x.txt does not exist; fix the data path (data.path)"


def test_compare_reports_usage_mistakes_with_the_same_parser():
    assert isinstance(cli.build_compare_parser(), cli.Parser)
    with pytest.raises(UserError, match="fp4lm compare: .*see fp4lm compare --help"):
        cli.run(["compare", "--no-such-flag"])


# `fp4lm train` alone is the default run; --help lists every key and what each preset runs.


def test_train_help_lists_every_config_key_with_its_default():
    import dataclasses
    import typing

    from fp4lm.config import Config

    done = _fp4lm("train", "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    for section, section_cls in typing.get_type_hints(Config).items():
        assert f"{section}:" in lines
        for field in dataclasses.fields(section_cls):
            line = next((x for x in lines if x.split()[:1] == [f"{section}.{field.name}"]), None)
            assert line is not None, f"{section}.{field.name} is missing from fp4lm train --help"
            if isinstance(field.default, (int, float, str)) and not isinstance(field.default, bool):
                assert line.split()[1] == str(field.default), line
    assert "model.remat" in done.stdout and "(none|full|save_quantized|save_matmul_operands)" in done.stdout
    assert "bundled:shakespeare" in done.stdout and "make run" in done.stdout


def test_train_without_arguments_trains_the_bundled_default_config(monkeypatch, tmp_path):
    import fp4lm.train
    from fp4lm.config import load_config
    from fp4lm.resources import default_config

    trained = []
    monkeypatch.setattr(fp4lm.train, "train", trained.append)
    monkeypatch.chdir(tmp_path)  # from any directory
    assert cli.run(["train"]) == 0
    assert trained == [load_config(default_config())]
    assert trained[0].model.d_model == 128 and trained[0].train.steps == 300  # the quick run, not the code defaults
    assert cli.run(["train", "train.steps=5"]) == 0  # overrides alone keep the code defaults as their base
    assert trained[1] == load_config(None, ["train.steps=5"])


def test_compare_help_gives_each_presets_duration():
    from fp4lm.compare.presets import EXPECTED_DURATION, PRESETS

    assert set(EXPECTED_DURATION) == set(PRESETS)
    done = _fp4lm("compare", "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    flat = " ".join(done.stdout.split())
    for name, duration in EXPECTED_DURATION.items():
        assert f"{name} ({duration})" in flat


def test_xla_log_is_quieted_only_where_the_user_left_it_unset_and_before_jax(monkeypatch):
    """`fp4lm` hides XLA's C++ warnings (TF_CPP_MIN_LOG_LEVEL=2) for its process; a user's own setting is kept,
    and a program that imported JAX already is left as it is (its backend has read the variable)."""
    from fp4lm.cli import _quiet_xla_log

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "placeholder")  # restored (removed) after the test
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL")
    monkeypatch.delitem(sys.modules, "jax", raising=False)
    _quiet_xla_log()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    _quiet_xla_log()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL")
    monkeypatch.setitem(sys.modules, "jax", object())
    _quiet_xla_log()
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ
