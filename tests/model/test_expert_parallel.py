"""Expert parallelism (fp4lm.model.expert_parallel): a MoE model on 8 fake CPU devices with its experts split
over the mesh's expert axis computes what it computes on one device.

A subprocess per case (tests/model/expert_parallel_worker.py) with the 8 devices and no excess precision (as
test_sharded_model.py), comparing a mesh against one device on a one-block MoE model: mesh.expert=4
mesh.data=2 in bf16 (dropless) and in NVFP4 (stochastic rounding on) with a capacity factor, and
mesh.expert=2 mesh.fsdp=2 mesh.tensor=2 in NVFP4, dropless (the devices of an expert shard split its
experts among themselves along fsdp and tensor), which also compares each expert's telemetry row. And the
telemetry where an expert shard's experts do not split evenly over its devices (UNEVEN_CASES).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.compile_flags import xla_flags

REPO = pathlib.Path(__file__).resolve().parents[2]
FLAGS = xla_flags("--xla_force_host_platform_device_count=8 --xla_allow_excess_precision=false")
CASES = ["expert4_data2_bf16", "expert4_data2_capacity_nvfp4", "expert2_fsdp2_tensor2_nvfp4"]
# The expert kernels' gradients, relative to their largest element. Each expert's tokens reach it in the same
# order as on one device, but the per-token gradients flowing into the experts come through dense dots of fewer
# rows (a device's share of the batch), and XLA:CPU does not always sum a row of a dot in the same order for
# every row count: on a 48 KiB-L1 Xeon, f32 [M, 64] x [64, 96] rows differ in the last bit for M < 64 against
# M = 128 (none for M >= 64). In bf16 the gradients are rounded to bf16 at every layer, so such a bit can flip
# a bf16 rounding: one ulp of the largest element (2**-8) bounds it. Under NVFP4 the same bit would have to
# cross an FP4 rounding boundary; it has not on any machine so far.
EXPERT_GRAD_TOLERANCE = {"bf16": 2.0**-8, "nvfp4": 1e-6}

pytestmark = pytest.mark.slow  # a subprocess per case, compiling two programs with their backward passes


UNEVEN_CASES = {"uneven_expert4_data2_capacity_nvfp4": 12, "uneven_expert2_fsdp2_tensor2_nvfp4": 6}
"""The worker's forward-only telemetry cases, with their numbers of experts."""


def _measure(case: str) -> dict:
    env = dict(os.environ, XLA_FLAGS=FLAGS, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "tests.model.expert_parallel_worker", case],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES)
def test_the_mesh_computes_what_one_device_computes(case):
    """One case per subprocess (so the xdist workers share the cases). Each expert runs once over all its
    tokens of the batch, quantized as one tensor: the logits agree within the dense model's tolerance
    (test_sharded_model.py), on all 8 devices; with top-2 the float32 sums of a token's two experts cannot
    even be reordered, and they are equal. The experts' kernel gradients are split over the expert axis and
    equal one device's (the same tokens in each expert's group, in the same order, the same stochastic-rounding
    bits from the global expert index, the same NVFP4 blocks), within EXPERT_GRAD_TOLERANCE. No array of the
    sharded program (per device: all the batch's tokens are gathered) is as large as tokens x experts x
    d_model of the whole batch."""
    results = _measure(case)
    assert results[f"{case}_logits_devices"] == 8
    assert results[f"{case}_logits_rel_diff"] <= 1e-5
    assert results[f"{case}_loss_diff"] <= 1e-5
    assert results[f"{case}_expert_grad_spec"][0] == "expert"
    tolerance = EXPERT_GRAD_TOLERANCE[case.rsplit("_", 1)[-1]]
    assert results[f"{case}_expert_grad_rel_diff"] <= tolerance
    assert results[f"{case}_largest_array"] < results["tokens_experts_d_model"]
    if f"{case}_expert_stats_rows" in results:  # each expert's telemetry row, from the device that ran it
        assert results[f"{case}_expert_stats_rows"] == [3 * 8, 3 * 8]
        assert results[f"{case}_expert_stats_max_diff"] <= 1e-5


@pytest.mark.parametrize("case", sorted(UNEVEN_CASES))
def test_each_experts_telemetry_comes_once_when_a_shards_experts_split_unevenly(case):
    """mesh.expert must divide the experts (config/combinations.py), but an expert shard's X / E experts need
    not split evenly over its R devices: 3 over 2 (the second device's kernel slice is clamped and repeats an
    expert the first runs; a capacity drops pairs) and 3 over 4 (a device runs none). Every expert's telemetry
    row still comes from the one device that ran it, once: equal to one device's rows (no row zeroed or
    counted twice; every expert got tokens), as are the logits and the routing stats (dropped pairs)."""
    experts = UNEVEN_CASES[case]
    results = _measure(case)
    want_rows = sorted(f"blocks.0.mlp.experts.{p}.{e}" for p in ("gate", "up", "down") for e in range(experts))
    assert results[f"{case}_rows"] == want_rows
    assert all(amax > 0 for amax in results[f"{case}_x_amax"].values())
    assert max(results[f"{case}_row_rel_diff"].values()) <= 1e-5
    assert sorted(results[f"{case}_row_rel_diff"]) == want_rows
    assert results[f"{case}_logits_rel_diff"] <= 1e-5
    routing, single = results[f"{case}_routing"], results[f"{case}_routing_single"]
    assert routing["tokens_per_expert"] == single["tokens_per_expert"]
    assert routing["dropped"] == single["dropped"]
    assert (routing["dropped"] > 0) == ("capacity" in case)
