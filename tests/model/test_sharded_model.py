"""The model on 8 fake CPU devices (mesh 2x2x2) and under rematerialisation, in one subprocess.

The subprocess (tests/model/sharded_worker.py) needs its own XLA flags before jax starts: 8 host devices,
and no excess precision, so that differently fused programs round bfloat16 intermediates alike and the
comparisons below can be exact.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.compile_flags import xla_flags
from tests.worker_shared import computed_once

REPO = pathlib.Path(__file__).resolve().parents[2]
FLAGS = xla_flags("--xla_force_host_platform_device_count=8 --xla_allow_excess_precision=false")


pytestmark = pytest.mark.slow  # one subprocess, ~1 min of CPU (mostly XLA compiling 10 programs)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    """The worker's measurements, computed once per session and shared by the xdist workers."""
    return computed_once(tmp_path_factory, "sharded_model", _measure)


def _measure() -> dict:
    env = dict(os.environ, XLA_FLAGS=FLAGS, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "tests.model.sharded_worker"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_mesh_is_2x2x2(results):
    assert results["mesh_shape"] == {"data": 2, "fsdp": 2, "expert": 1, "tensor": 2}


@pytest.mark.parametrize("recipe", ["bf16", "nvfp4"])
def test_sharded_forward_equals_single_device_forward(results, recipe):
    assert results[f"forward_logits_sharded_{recipe}"] == 8  # the logits really live on 8 devices
    assert results[f"forward_rel_diff_{recipe}"] <= 1e-5


def test_parameters_follow_the_logical_axis_table(results):
    assert results["q_kernel_spec"] == ["fsdp", "tensor"]
    assert results["q_kernel_devices"] == 8
    assert results["create_sharded_placed"] and results["create_sharded_same_values"]


@pytest.mark.parametrize("block", ["1x16", "16x16", "rht"])
def test_quantized_codes_of_a_sharded_tensor_equal_unsharded(results, block):
    assert results["codes_input_devices"] == 8
    assert results[f"codes_equal_{block}"]


@pytest.mark.parametrize("mode", ["full", "save_quantized", "save_matmul_operands"])
def test_remat_modes_give_identical_gradients(results, mode):
    assert results["grad_norm"] > 0
    assert results[f"remat_max_diff_{mode}"] == 0.0
