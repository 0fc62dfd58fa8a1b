"""A failed export leaves nothing behind: a disk that fills while the files are written or at the
final move is one line naming --out, with no hidden staging copy, no directory the export created, and the
run and any old output unchanged."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys

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


def test_a_killed_exports_staging_copy_is_removed_by_the_next_export(tmp_path):
    """A SIGKILLed export cannot clean up: the next export to the same --out from this host removes its staging
    directory (its process is gone), and leaves a live export's and another host's alone."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    out = tmp_path / "exported"
    abandoned = tmp_path / f".exported.export-{host}-{dead.pid}-0000abcd"
    running = tmp_path / f".exported.export-{host}-{os.getpid()}-1111abcd"
    elsewhere = tmp_path / f".exported.export-otherhost-{dead.pid}-2222abcd"
    for directory in (abandoned, running, elsewhere):
        directory.mkdir()
        (directory / "model.safetensors").write_bytes(b"half a file")
    with output_dir.staged_output(out, log=lambda _: None) as staging:
        (staging / "config.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["exported", running.name, elsewhere.name])
