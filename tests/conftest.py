"""Tests run on the CPU. Multi-device tests start their own subprocess with 8 fake CPU devices."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import logging  # noqa: E402
import pathlib  # noqa: E402

import pytest  # noqa: E402

from tests.compile_flags import xla_flags  # noqa: E402

os.environ["XLA_FLAGS"] = xla_flags(os.environ.get("XLA_FLAGS", "")).strip()  # before any test imports jax

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
    """../shared beside the checkout (test vectors); tests needing it skip cleanly when it is absent."""
    if not SHARED.is_dir():
        pytest.skip("../shared is not beside this checkout")
    return SHARED


@pytest.fixture(autouse=True)
def _no_log_filter_left_behind():
    """A Checkpointer left open keeps its Orbax echo filter on absl's logger, where it swallows records that
    later tests in the same worker look for: the test that leaks one fails, and the filter is removed."""
    absl = logging.getLogger("absl")
    before = list(absl.filters)
    yield
    leaked = [f for f in absl.filters if f not in before]
    for f in leaked:
        absl.removeFilter(f)
    if leaked:
        pytest.fail(f"left {leaked} on the absl logger: close the Checkpointer it belongs to")


# `make check` (lint and the fast tests, for the edit loop) runs what is not marked slow. These modules train
# runs, start processes or sweep many shapes: each took 19 s or more of a worker's time in the full suite on the
# 2-core machine (`--durations=0`). `make test` (CI) runs everything.
SLOW_MODULES = frozenset(
    {
        "tests/bench/test_device_check.py",
        "tests/data/test_pipeline_documents_resume.py",
        "tests/data/test_prepared_training.py",
        "tests/data/test_raw_equals_prepared.py",
        "tests/export/test_dry_run_init_from.py",
        "tests/export/test_hf_export.py",
        "tests/export/test_hf_moe.py",
        "tests/export/test_nvfp4_of_bf16_run.py",
        "tests/export/test_nvfp4_provenance.py",
        "tests/export/test_nvfp4_recipes.py",
        "tests/export/test_nvfp4_export.py",
        "tests/export/test_nvfp4_moe.py",
        "tests/export/test_shared_weight_scale.py",
        "tests/inference/test_sample_cache.py",
        "tests/interop/test_compressed_tensors.py",  # these three run only where the interop environment is
        "tests/interop/test_moe.py",
        "tests/interop/test_transformers.py",
        "tests/model/test_attention.py",
        "tests/model/test_expert_parallel.py",
        "tests/model/test_layer_stats.py",
        "tests/model/test_llama_model.py",
        "tests/model/test_moe.py",
        "tests/model/test_scan_layers.py",
        "tests/model/test_sharded_model.py",
        "tests/numerics/test_numerics_nvfp4_options.py",
        "tests/numerics/test_numerics_perturbed_division.py",
        "tests/quant/test_dot_reference.py",
        "tests/quant/test_dot_transforms.py",
        "tests/quant/test_gemm_fused_operand.py",
        "tests/reliability/test_checkpoint_faults.py",
        "tests/reliability/test_config_paths.py",
        "tests/reliability/test_damaged_runs.py",
        "tests/reliability/test_determinism.py",
        "tests/reliability/test_disk_full.py",
        "tests/reliability/test_kill9_resume.py",
        "tests/reliability/test_nonfinite_steps.py",
        "tests/reliability/test_refused_early.py",
        "tests/reliability/test_run_dir_safety.py",
        "tests/reliability/test_run_talks_to_user.py",
        "tests/report/test_report_compare.py",
        "tests/report/test_report_e2e.py",
        "tests/train/test_checkpoint.py",
        "tests/train/test_dry_run.py",
        "tests/train/test_dry_run_qwen3_moe.py",
        "tests/train/test_expert_parallel_training.py",
        "tests/train/test_fault_injection.py",
        "tests/train/test_fp4_param_gather.py",
        "tests/train/test_grad_accum.py",
        "tests/train/test_moe_run.py",
        "tests/train/test_moe_step.py",
        "tests/train/test_scale_out.py",
        "tests/train/test_step_timing.py",
        "tests/train/test_train_smoke.py",
    }
)


# The longest tests (1-2 minutes of a worker each) start first, so that no worker is left running one of them
# alone at the end of the suite.
LONGEST_FIRST = (
    "tests/train/test_dry_run_qwen3_moe.py",
    "tests/model/test_expert_parallel.py",
    "tests/train/test_expert_parallel_training.py",
    "tests/bench/test_device_check.py",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.relative_to(REPO).as_posix() in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
    rank = {module: position for position, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(REPO).as_posix(), len(rank)))
