"""An interrupted `fp4lm prepare` (kill -9 mid-way) resumes: the same command again finishes it, and the result is
byte-identical to a prepare that was never interrupted; what the killed run left half-written is never taken
for finished."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from fp4lm.data.prepare import STATE_DIR, Options, prepare
from fp4lm.data.prepared import MANIFEST_FILE
from tests.data.test_prepare import directory_bytes, write_sources

OPTIONS = Options(val_fraction=0.2, shard_tokens=2000, piece_bytes=3000)
_CHILD = """
import sys
from fp4lm.data.prepare import Options, prepare
prepare([sys.argv[1]], tokenizer="byte", out=sys.argv[2], options=Options(**eval(sys.argv[3])), progress="off")
"""


def _options_literal(options: Options) -> str:
    return repr({k: getattr(options, k) for k in ("val_fraction", "shard_tokens", "piece_bytes")})


def test_kill_9_mid_prepare_then_rerun_gives_the_uninterrupted_result(tmp_path):
    sources = tmp_path / "sources"
    write_sources(sources)
    reference = prepare([str(sources)], tokenizer="byte", out=tmp_path / "reference", options=OPTIONS, progress="off")
    out = tmp_path / "out"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(sources), str(out), _options_literal(OPTIONS)],
        start_new_session=True,  # its own process group: kill -9 reaches any worker too
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    state = out / STATE_DIR
    deadline = time.monotonic() + 120
    try:
        while len(list(state.glob("unit-*.json"))) < 3 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    finished = len(list(state.glob("unit-*.json")))
    assert finished >= 3 and not (out / MANIFEST_FILE).exists(), "the prepare finished before it could be killed"

    # What a kill leaves mid-write: a part under its temporary name. Another, planted here, must not count either.
    (state / "unit-00000-train-000.npy.12345-deadbeef.tmp").write_bytes(b"\x93NUMPY half a shard")
    resumed = prepare([str(sources)], tokenizer="byte", out=out, options=OPTIONS, progress="off")
    assert directory_bytes(resumed.directory) == directory_bytes(reference.directory)
    assert not state.exists()
    resumed.verify()
