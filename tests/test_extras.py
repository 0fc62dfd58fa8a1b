"""Optional extras: a missing one stops only what needs it, with the pip command that installs it."""

import importlib
import io

import pytest

from fp4lm import cli, extras
from fp4lm.errors import UserError
from fp4lm.train.metrics import MetricsWriter
from fp4lm.train.progress import Reporter


@pytest.fixture
def hide_module(monkeypatch):
    """Make importing the given top-level packages fail as if they were not installed (for this test only)."""

    def hide(*names: str) -> None:
        real_import_module = importlib.import_module

        def import_module(name, package=None):
            top_level = name.partition(".")[0]
            if top_level in names:
                raise ModuleNotFoundError(f"No module named {top_level!r}", name=top_level)
            return real_import_module(name, package)

        monkeypatch.setattr(importlib, "import_module", import_module)

    return hide


def test_require_returns_the_module():
    assert extras.require("json", "none", purpose="a test") is importlib.import_module("json")
    assert extras.available("json")


def test_missing_extra_names_the_extra_and_the_install_command(hide_module):
    hide_module("matplotlib")
    with pytest.raises(UserError) as error:
        extras.require("matplotlib.figure", "report", purpose="drawing the comparison's plots")
    message = str(error.value)
    assert message.startswith("drawing the comparison's plots needs the Python package 'matplotlib'")
    assert message.endswith("install the 'report' extra: pip install 'fp4lm[report]'")
    assert isinstance(error.value, ValueError)  # an ordinary exception to library callers
    assert not extras.available("matplotlib")


def test_a_broken_dependency_of_an_installed_package_keeps_its_own_error(monkeypatch):
    def import_module(name, package=None):  # matplotlib is installed, but one of its own imports is not
        raise ModuleNotFoundError("No module named 'kiwisolver'", name="kiwisolver")

    monkeypatch.setattr(importlib, "import_module", import_module)
    with pytest.raises(ModuleNotFoundError) as error:
        extras.require("matplotlib", "report", purpose="plots")
    assert not isinstance(error.value, UserError)


def test_install_hint_is_quoted_for_the_shell():
    assert extras.install_hint("all") == "pip install 'fp4lm[all]'"


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_auto_falls_back_to_plain_lines_without_rich(hide_module):
    hide_module("rich")
    assert Reporter("auto", stream=_Terminal()).rich is False
    with pytest.raises(UserError, match=r"pip install 'fp4lm\[progress\]'"):
        Reporter("rich", stream=_Terminal())


def test_progress_auto_uses_rich_on_a_terminal_when_installed():
    assert Reporter("auto", stream=_Terminal()).rich is True


def test_tensorboard_without_its_extra_names_it_and_writes_nothing(hide_module, tmp_path):
    hide_module("tensorboardX")
    with pytest.raises(UserError, match=r"metrics.tensorboard=true.*pip install 'fp4lm\[tensorboard\]'"):
        MetricsWriter(tmp_path, tensorboard=True)
    assert list(tmp_path.iterdir()) == []
    MetricsWriter(tmp_path, tensorboard=False).close()  # without TensorBoard it is not needed


def test_compare_without_matplotlib_stops_before_training(hide_module, tmp_path, capsys):
    hide_module("matplotlib")
    out_dir = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_request:
        cli.main(["compare", "--recipes", "bf16", "--out", str(out_dir)])
    assert exit_request.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: fp4lm compare's plots needs the Python package 'matplotlib'")
    assert error.endswith("pip install 'fp4lm[report]'") and "\n" not in error
    assert not out_dir.exists()
