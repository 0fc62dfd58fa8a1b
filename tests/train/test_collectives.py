"""fp4lm.train.collectives: the bytes each device sends per step, counted from a compiled program, against
volumes counted by hand (a shard_map program on 8 fake devices, a data-parallel dry run) and on program text
written out here (loops, conditionals, GPU's async collectives and async wrappers, the spellings of a device
group)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from fp4lm.train.collectives import collective_volume, group_size, sent_bytes
from tests.compile_flags import xla_flags

REPO = pathlib.Path(__file__).resolve().parents[2]
EIGHT_DEVICES = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=8")}

PROGRAM = """HloModule step, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%body (p: (s32[], bf16[8,16])) -> (s32[], bf16[8,16]) {
  %p = (s32[], bf16[8,16]{1,0}) parameter(0)
  %x = bf16[2,16]{1,0} get-tuple-element(%p), index=1
  %g = bf16[8,16]{1,0} all-gather(%x), channel_id=1, replica_groups=[2,4]<=[8], dimensions={0}
  ROOT %t = (s32[], bf16[8,16]{1,0}) tuple(%i, %g)
}

%cond (p: (s32[], bf16[8,16])) -> pred[] {
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%small (q: f32[4]) -> f32[4] {
  %q = f32[4]{0} parameter(0)
  ROOT %r = f32[4]{0} all-reduce(%q), replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%add
}

%large (q: f32[4]) -> f32[4] {
  %q = f32[4]{0} parameter(0)
  ROOT %r = f32[1024]{0} all-reduce(%q), replica_groups={}, to_apply=%add
}

%wrapped (w: f32[8]) -> f32[8] {
  %w = f32[8]{0} parameter(0)
  ROOT %t = f32[8]{0} all-to-all(%w), replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
}

ENTRY %main (x: f32[4]) -> f32[4] {
  %w = (s32[], bf16[8,16]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %c = f32[4]{0} conditional(%k, %x, %x), branch_computations={%small, %large}
  %s = ((f32[2,4]{1,0}), f32[16,4]{1,0}) all-gather-start(%y), replica_groups=[1,8]<=[8], dimensions={0}
  %d = f32[16,4]{1,0} all-gather-done(%s)
  %a = ((f32[8]{0}), f32[8]{0}) async-start(%x), calls=%wrapped
  %b = f32[8]{0} async-done(%a), calls=%wrapped
  ROOT %o = (f32[4]{0}, s4[64]{0}) all-reduce(%x, %z), replica_groups=mesh['a'=4,'b'=2] {'b'}, to_apply=%add
}
"""


def test_the_formulas_are_the_ring_algorithms():
    assert sent_bytes("all-gather", 800, 8) == 700  # its 100-byte shard to 7 others
    assert sent_bytes("reduce-scatter", 100, 8) == 700  # 7 partial shards of 100 bytes
    assert sent_bytes("all-reduce", 800, 8) == 1400  # a reduce-scatter then an all-gather
    assert sent_bytes("all-to-all", 800, 8) == 700
    assert sent_bytes("collective-permute", 800, 2) == 800
    assert sent_bytes("all-reduce", 800, 1) == 0  # a group of one sends nothing


@pytest.mark.parametrize(
    ("attributes", "size"),
    [
        ("replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}", 4),
        ("replica_groups=[2,4]<=[4,2]T(1,0), dimensions={1}", 4),
        ("replica_groups=mesh['a'=4,'b'=2] {'a'}, dimensions={0}", 4),
        ("replica_groups=mesh['a'=4,'b'=2] {'a','b'}, dimensions={0}", 8),
        ("replica_groups=mesh['data'=1,'fsdp'=4,'tensor'=2] {'fsdp':(2)2,'tensor'}, dimensions={0}", 4),
        ("replica_groups={}, to_apply=%add", 8),
        ("to_apply=%add", 8),
    ],
)
def test_the_three_spellings_of_a_device_group(attributes, size):
    assert group_size(attributes, 8) == size


def test_an_unknown_spelling_is_refused_not_guessed():
    with pytest.raises(ValueError, match="unrecognised device group"):
        group_size("replica_groups=mesh['a'=4] {'z'}", 8)


def test_loops_conditionals_and_async_collectives_are_counted_as_they_run():
    volume = collective_volume(PROGRAM, 8).as_dict()
    # The loop's gather runs 3 times: 3 x 3/4 x 256 bytes. The async one (GPU) counts its output, f32[16,4].
    assert volume["all-gather"] == {"bytes": 3 * 192 + 224, "count": 4, "by_dtype": {"bf16": 576, "f32": 224}}
    # The conditional counts its larger branch (an upper bound): 2 x 7/8 x 4096; then the entry's tuple
    # all-reduce over the 2 of `b`: f32[4] and s4[64] (32 bytes), 2 x 1/2 of each.
    assert volume["all-reduce"] == {"bytes": 7168 + 16 + 32, "count": 2, "by_dtype": {"f32": 7184, "s4": 32}}
    # An op wrapped in an async pair (its start and its done both name it) runs once: 7/8 x 32 bytes.
    assert volume["all-to-all"] == {"bytes": 28, "count": 1, "by_dtype": {"f32": 28}}


ASYNC_PROGRAM = """HloModule step, num_partitions=8

%body (p: (s32[], f32[64])) -> (s32[], f32[64]) {
  %p = (s32[], f32[64]{0}) parameter(0)
  %x = f32[64]{0} get-tuple-element(%p), index=1
  %cp = (f32[64]{0}, f32[64]{0}, u32[]{:S(2)}, u32[]{:S(2)}) collective-permute-start(%x), source_target_pairs={{0,1}}
  %cpd = f32[64]{0} collective-permute-done(%cp)
  %ag = (bf16[16]{0}, bf16[64]{0}) all-gather-start(%h), channel_id=2, replica_groups=[2,4]<=[8], dimensions={0}
  %agd = bf16[64]{0} all-gather-done(%ag)
  %ar = f32[64]{0} all-reduce-start(%cpd), channel_id=3, replica_groups=[4,2]<=[8], to_apply=%add
  %ard = f32[64]{0} all-reduce-done(%ar)
  ROOT %t = (s32[], f32[64]{0}) tuple(%i, %ard)
}

ENTRY %main (x: f32[64]) -> f32[64] {
  %w = (s32[], f32[64]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  ROOT %o = f32[64]{0} get-tuple-element(%w), index=1
}
"""


def test_async_start_done_pairs_count_once_with_their_outputs_bytes():
    """GPU programs split collectives into -start/-done pairs: each pair runs once per trip of its loop (5 here)
    and sends its output's bytes by the ring formulas, never its operand's (the first half of a start's tuple)
    nor the u32 contexts of a collective-permute."""
    volume = collective_volume(ASYNC_PROGRAM, 8).as_dict()
    assert volume["collective-permute"] == {"bytes": 5 * 256, "count": 5, "by_dtype": {"f32": 5 * 256}}
    assert volume["all-gather"] == {"bytes": 5 * 96, "count": 5, "by_dtype": {"bf16": 5 * 96}}  # 3/4 x 128 bytes
    assert volume["all-reduce"] == {"bytes": 5 * 256, "count": 5, "by_dtype": {"f32": 5 * 256}}  # 2 x 1/2 x 256


def _eight_devices(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COORDINATOR")}
    env.update(EIGHT_DEVICES, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, env=env, cwd=cwd)


@pytest.mark.slow  # a subprocess compiling for 8 devices
def test_a_program_of_hand_written_collectives_on_8_devices(tmp_path):
    done = _eight_devices("-m", "tests.train.collectives_worker", cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    volume = json.loads(done.stdout.strip().splitlines()[-1])
    # collectives_worker.program's docstring, per device; XLA may merge the psums, never change their bytes.
    assert volume["all-reduce"]["bytes"] == 2 * 7 / 8 * 16 * 32 * 4 + 5 * (2 * 1 / 2 * 4 * 4)
    assert volume["all-gather"]["bytes"] == 3 / 4 * 32 * 16 * 4
    assert volume["reduce-scatter"]["bytes"] == 7 * 8 * 4
    assert volume["all-to-all"]["bytes"] == 7 / 8 * 8 * 4 * 4
    assert volume["collective-permute"]["bytes"] == 10 * 4


def _dry_run_on_8_devices(tmp_path: pathlib.Path, *overrides: str) -> dict:
    """`fp4lm train --dry-run --json` of a small byte-level model on 8 fake devices: the report."""
    model = ("model.d_model=64", "model.num_heads=2", "model.num_kv_heads=1", "model.mlp_dim=128")
    data = ("data.tokenizer=byte", "data.vocab_size=256")
    run_dir = tmp_path / "run"
    command = ("-m", "fp4lm", "train", *model, *data, *overrides, f"train.run_dir={run_dir}", "--dry-run", "--json")
    done = _eight_devices(*command, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not run_dir.exists()
    return json.loads(done.stdout)


@pytest.mark.slow  # a subprocess compiling for 8 devices
def test_the_data_parallel_dry_run_all_reduces_every_gradient_once(tmp_path):
    """mesh.data=8: the step's only communication is the gradients' all-reduce, 2 x 7/8 x 4 bytes per float32
    parameter, plus the loss's few scalars; --json prints it with the rest of the dry run."""
    report = _dry_run_on_8_devices(
        tmp_path, "model.num_layers=2", "data.seq_len=32", "train.batch_size=8", "precision.recipe=bf16", "mesh.data=8"
    )
    parameters = report["model"]["parameters"]
    assert set(report["collectives"]) == {"all-reduce"}
    per_parameter = 2 * 7 / 8 * 4
    assert 0 <= report["collectives"]["all-reduce"]["bytes"] - per_parameter * parameters <= per_parameter * 8
    for section in ("mesh", "memory_per_device", "flops_per_step", "parameter_shardings", "precision"):
        assert report[section], section
    assert report["precision"]["layers"]["blocks.0.attn.q"] == "bf16"


@pytest.mark.slow  # a subprocess compiling for 8 devices
def test_a_scanned_fsdp_model_gathers_its_weights_not_its_activations(tmp_path):
    """mesh.fsdp=8 on 4 scanned blocks: each device keeps its rows of the batch (fp4lm.sharding.batch_sharded),
    so the step all-reduces the float32 gradients once, 2 x 7/8 x 4 bytes per parameter, and all-gathers no more
    than every weight twice (forward and backward). Left to XLA, this program gathered 21x and reduced 59x that."""
    report = _dry_run_on_8_devices(
        tmp_path,
        "model.num_layers=4",
        "model.scan_layers=true",
        "data.seq_len=128",
        "train.batch_size=32",
        "mesh.fsdp=8",
    )
    once = 2 * 7 / 8 * 4 * report["model"]["parameters"]
    assert once <= report["collectives"]["all-reduce"]["bytes"] <= 1.01 * once
    assert report["collectives"]["all-gather"]["bytes"] <= once


def test_json_without_the_dry_run_is_refused(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "fp4lm", "train", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert done.returncode == 2 and "--json is the dry run's" in done.stderr
