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


# The longest tests (1-2 minutes of a worker each) start first, so that no worker is left running one of them
# alone at the end of the suite.
LONGEST_FIRST = (
    "tests/train/test_dry_run_qwen3_moe.py",
    "tests/model/test_expert_parallel.py",
    "tests/train/test_expert_parallel_training.py",
    "tests/bench/test_device_check.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {module: position for position, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(REPO).as_posix(), len(rank)))
