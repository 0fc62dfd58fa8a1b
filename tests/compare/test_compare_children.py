"""`fp4lm compare`'s training children import the fp4lm that runs the comparison, never a folder named
`fp4lm` in the current directory: the runner's own command, in a fresh process."""

from __future__ import annotations

import io
import subprocess
import sys

from fp4lm.compare import runner

STRAY = "import sys\nsys.exit('the fp4lm folder of the current directory was imported')\n"


def test_children_do_not_import_a_folder_named_fp4lm_in_the_current_directory(tmp_path, monkeypatch):
    stray = tmp_path / "fp4lm"
    stray.mkdir()
    (stray / "__init__.py").write_text(STRAY)
    (stray / "__main__.py").write_text(STRAY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)  # a user's shell; the tests' own path is not needed
    plain = subprocess.run([sys.executable, "-m", "fp4lm", "train", "--help"], capture_output=True, text=True)
    assert "current directory was imported" in plain.stderr  # what a child without the guard would run
    echo = io.StringIO()
    outcome = runner.run_training(runner.train_command(None, ["--help"]), tmp_path / "train.log", echo)
    assert outcome.exit_code == 0, echo.getvalue()[-2000:]
    assert "usage: fp4lm train" in echo.getvalue()
