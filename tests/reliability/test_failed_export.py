"""A failed export leaves nothing behind (issue 21): a disk that fills while the files are written or at the
final move is one line naming --out, with no hidden staging copy, no directory the export created, and the
run and any old output unchanged."""

from __future__ import annotations

import errno
import os

import pytest

from fp4lm.export import output_dir
from fp4lm.hf import safetensors_files
from tests.reliability.helpers_reliability import assert_one_line_user_error, run_cli_in_process, snapshot


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("where", ["writing", "final move"])
def test_a_failed_export_leaves_nothing(reference_run, tmp_path, monkeypatch, where):
    if where == "writing":
        monkeypatch.setattr(safetensors_files, "write_file", _disk_full)
    else:
        monkeypatch.setattr(output_dir.os, "replace", _disk_full)
    before = snapshot(reference_run)
    out = tmp_path / "new" / "deeper" / "exported"
    result = run_cli_in_process("export", str(reference_run), "--format", "nvfp4", "--out", str(out))
    line = assert_one_line_user_error(result, expect_in=(f"--out {out}", "No space left", "nothing was written"))
    assert ".export-" not in line  # the hidden staging directory is not the user's to look for
    assert os.listdir(tmp_path) == [], "the directories the export created are removed again"
    assert snapshot(reference_run) == before
