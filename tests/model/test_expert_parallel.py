"""Expert parallelism (fp4lm.model.expert_parallel): a MoE model on 8 fake CPU devices with its experts split
over the mesh's expert axis computes what it computes on one device.

One subprocess (tests/model/expert_parallel_worker.py) with the 8 devices and no excess precision (as
test_sharded_model.py), comparing each mesh against one device: mesh.expert=4 mesh.data=2 in bf16 and NVFP4
(stochastic rounding on), the same with a capacity factor, and mesh.expert=2 mesh.fsdp=2 mesh.tensor=2 (the
devices of an expert shard split its experts among themselves along fsdp and tensor).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.worker_shared import computed_once

REPO = pathlib.Path(__file__).resolve().parents[2]
FLAGS = "--xla_force_host_platform_device_count=8 --xla_allow_excess_precision=false"
CASES = ["expert4_data2_bf16", "expert4_data2_nvfp4", "capacity_nvfp4", "expert2_fsdp2_tensor2_nvfp4"]

pytestmark = pytest.mark.slow  # one subprocess compiling 8 programs with their backward passes: minutes of CPU


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    """The worker's measurements, computed once per session and shared by the xdist workers (4 minutes)."""
    return computed_once(tmp_path_factory, "expert_parallel", _measure)


def _measure() -> dict:
    env = dict(os.environ, XLA_FLAGS=FLAGS, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "tests.model.expert_parallel_worker"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES)
def test_the_forward_pass_equals_one_device(results, case):
    """Each expert runs once over all its tokens of the batch, quantized as one tensor: the logits agree
    within the dense model's tolerance (test_sharded_model.py); with top-2 the float32 sums of a token's two
    experts cannot even be reordered, and they are equal."""
    assert results[f"{case}_logits_devices"] == 8  # the logits really live on 8 devices
    assert results[f"{case}_logits_rel_diff"] <= 1e-5
    assert results[f"{case}_loss_diff"] <= 1e-5


@pytest.mark.parametrize("case", CASES)
def test_the_experts_are_split_and_their_gradients_equal_one_device(results, case):
    """Kernel gradients are those of one device: the same tokens in each expert's group, in the same order,
    the same stochastic-rounding bits (the global expert index in the key), the same NVFP4 blocks."""
    assert results[f"{case}_expert_grad_spec"][0] == "expert"
    assert results[f"{case}_expert_grad_rel_diff"] <= 1e-6


@pytest.mark.parametrize("case", CASES)
def test_no_tokens_by_experts_by_width_array(results, case):
    """No array of the sharded program (per device: all the batch's tokens are gathered) is as large as
    tokens x experts x d_model of the whole batch."""
    assert results[f"{case}_largest_array"] < results["tokens_experts_d_model"]
