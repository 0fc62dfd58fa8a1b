"""Determinism: one config and seed give identical losses in two runs; quantized codes do not depend on how
a tensor is sharded (8 fake CPU devices in a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.compile_flags import xla_flags
from tests.reliability.conftest import REFERENCE_STEPS, reference_overrides
from tests.reliability.helpers_reliability import (
    REPO,
    assert_states_bit_equal,
    eval_records,
    restore_checkpoint,
    run_cli,
    subprocess_env,
    summary_fields,
    train_records,
)

pytestmark = pytest.mark.slow


def test_same_config_and_seed_give_identical_losses(reference_run, corpus, compile_cache, tmp_path):
    run_dir = tmp_path / "again"
    result = run_cli("train", *reference_overrides(corpus, compile_cache, run_dir))
    assert result.code == 0, result.stderr[-3000:]
    assert train_records(run_dir) == train_records(reference_run)
    assert eval_records(run_dir) == eval_records(reference_run)
    assert summary_fields(run_dir) == summary_fields(reference_run)
    assert_states_bit_equal(
        restore_checkpoint(run_dir, REFERENCE_STEPS)["state"],
        restore_checkpoint(reference_run, REFERENCE_STEPS)["state"],
    )


@pytest.fixture(scope="module")
def sharded_results() -> dict:
    env = subprocess_env() | {"XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=8")}
    done = subprocess.run(
        [sys.executable, "-m", "tests.reliability.sharded_codes_worker"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(l for l in done.stdout.splitlines() if l.startswith("RESULTS "))
    return json.loads(line.removeprefix("RESULTS "))


# A 16-element block cut in half across devices: the RHT must still give the same bits (its butterfly is a
# fixed tree of additions, whatever the sharding).
RHT_SPLIT_BLOCKS = "nvfp4_rht_sr/half_blocks_per_device"


def test_quantized_codes_do_not_depend_on_sharding(sharded_results):
    assert len(sharded_results) == 4 * 3 + 4 + 1
    assert all(r["devices"] == 8 for r in sharded_results.values())
    differing = {name: r["differs"] for name, r in sharded_results.items() if r["differs"]}
    assert differing == {}


def test_rht_codes_do_not_depend_on_sharding_even_within_a_block(sharded_results):
    assert sharded_results[RHT_SPLIT_BLOCKS]["differs"] == []
