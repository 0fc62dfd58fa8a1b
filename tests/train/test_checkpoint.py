"""Checkpoints: round trip, keep-last-K, no non-finite saves, fallback past a corrupted latest checkpoint."""

import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from fp4lm.config import OptimizerConfig
from fp4lm.errors import UserError
from fp4lm.train.checkpoint import Checkpointer
from fp4lm.train.loss_scale import LossScaler, LossScaleState
from fp4lm.train.optimizer import build_optimizer
from fp4lm.train.state import init_train_state

pytestmark = pytest.mark.slow


def _state(step: int, fill: float = 1.0):
    params = {"blocks": {0: {"w": jnp.full((4, 16), fill)}}, "embed": {"table": jnp.arange(32.0).reshape(8, 4)}}
    state = init_train_state(params, build_optimizer(OptimizerConfig(), 10), LossScaler(enabled=True), seed=3)
    return state.replace(step=jnp.asarray(step, jnp.int32))


def _abstract(state):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def _save(checkpointer, step, fill=1.0):
    return checkpointer.save(
        step,
        _state(step, fill),
        data_iter={"position": step},
        config={"model": {"d_model": 4}},
        tokenizer_json='{"name": "byte"}',
        precision={"bf16_after_step": None},
    )


def _assert_same(a, b):
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, a), jax.tree.map(np.asarray, b))


def test_round_trip_keeps_everything(tmp_path):
    checkpointer = Checkpointer(tmp_path, keep=3)
    assert _save(checkpointer, 5)
    checkpointer.wait()
    restored = checkpointer.restore_latest(_abstract(_state(0)))
    checkpointer.close()
    assert restored.step == 5
    assert restored.data_iter == {"position": 5}
    assert restored.config == {"model": {"d_model": 4}}
    assert restored.tokenizer_json == '{"name": "byte"}'
    _assert_same(restored.state, _state(5))
    assert jax.tree.structure(restored.state) == jax.tree.structure(_state(5))


def test_keeps_the_last_k(tmp_path):
    checkpointer = Checkpointer(tmp_path, keep=2)
    for step in (1, 2, 3, 4):
        _save(checkpointer, step)
    checkpointer.wait()
    assert checkpointer.steps() == [3, 4]
    checkpointer.close()


def test_nonfinite_state_is_never_saved(tmp_path):
    messages = []
    checkpointer = Checkpointer(tmp_path, keep=3, log=messages.append)
    assert _save(checkpointer, 1)
    assert not _save(checkpointer, 2, fill=float("nan"))
    assert not _save(checkpointer, 3, fill=float("inf"))
    checkpointer.wait()
    assert checkpointer.steps() == [1]
    assert len(messages) == 2 and "non-finite" in messages[0] and "step 2" in messages[0]
    checkpointer.close()


def _damage(step_dir: pathlib.Path, how: str) -> None:
    """Damages every array data file of the checkpoint (which of them a restore reads is Orbax's business)."""
    data_files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    assert data_files
    for path in data_files:
        raw = path.read_bytes()
        middle = len(raw) // 2
        if how == "truncate":
            path.write_bytes(raw[:middle])
        elif how == "flip_header":
            path.write_bytes(raw[:16] + bytes(b ^ 0xA5 for b in raw[16:48]) + raw[48:])
        elif how == "flip_middle":  # same size, same framing
            path.write_bytes(raw[:middle] + bytes(b ^ 0xFF for b in raw[middle : middle + 64]) + raw[middle + 64 :])
    if how == "json_item":
        path = step_dir / "data_iter" / "metadata"
        path.write_text(path.read_text()[:5])
    elif how == "state_metadata":
        (step_dir / "state" / "_METADATA").unlink()


@pytest.mark.parametrize("how", ["truncate", "flip_header", "flip_middle", "json_item", "state_metadata"])
def test_damaged_latest_falls_back_to_previous_and_is_removed(tmp_path, how):
    checkpointer = Checkpointer(tmp_path, keep=3)
    _save(checkpointer, 1, fill=1.0)
    _save(checkpointer, 2, fill=2.0)
    checkpointer.close()
    _damage(tmp_path / "checkpoints" / "2", how)

    reader = Checkpointer(tmp_path, read_only=True, log=lambda _: None)  # eval / sample: never delete
    assert reader.restore_latest(_abstract(_state(0))).step == 1
    reader.close()
    assert (tmp_path / "checkpoints" / "2").is_dir()

    messages = []
    checkpointer = Checkpointer(tmp_path, keep=3, log=messages.append)
    restored = checkpointer.restore_latest(_abstract(_state(0)))
    assert restored.step == 1
    _assert_same(restored.state.params, _state(1, 1.0).params)
    assert len(messages) == 1
    assert "step 2" in messages[0] and "falling back to step 1" in messages[0] and "\n" not in messages[0]
    assert checkpointer.steps() == [1]  # the damaged one is gone, so step 2 can be saved again
    assert _save(checkpointer, 2, fill=2.0)
    checkpointer.close()


def test_values_that_differ_from_the_saved_fingerprint_are_rejected(tmp_path):
    """Bytes changed in place that still decode must not pass: the restore compares a fingerprint."""
    checkpointer = Checkpointer(tmp_path, keep=3)
    _save(checkpointer, 1)
    _save(checkpointer, 2)
    checkpointer.close()
    item = tmp_path / "checkpoints" / "2" / "fingerprint" / "metadata"
    recorded = json.loads(item.read_text())
    recorded["leaves"][0] = (recorded["leaves"][0] + 1) % 2**32
    item.write_text(json.dumps(recorded))
    messages = []
    checkpointer = Checkpointer(tmp_path, keep=3, log=messages.append)
    assert checkpointer.restore_latest(_abstract(_state(0))).step == 1
    checkpointer.close()
    assert "do not match the fingerprint" in messages[0]


def test_half_written_checkpoint_is_not_the_latest(tmp_path):
    """A temporary directory left by a killed save is ignored (and removed) by the next run."""
    checkpointer = Checkpointer(tmp_path, keep=3)
    _save(checkpointer, 1)
    checkpointer.close()
    leftover = tmp_path / "checkpoints" / "2.orbax-checkpoint-tmp-123"
    (leftover / "state").mkdir(parents=True)
    (leftover / "state" / "partial").write_bytes(b"\x00" * 10)
    checkpointer = Checkpointer(tmp_path, keep=3)
    assert checkpointer.latest_step() == 1
    assert checkpointer.restore_latest(_abstract(_state(0))).step == 1
    checkpointer.close()


def test_read_only_reader_and_config(tmp_path):
    checkpointer = Checkpointer(tmp_path, keep=3)
    _save(checkpointer, 7)
    checkpointer.close()
    reader = Checkpointer(tmp_path, read_only=True)
    assert reader.read_config() == {"model": {"d_model": 4}}
    assert reader.latest_step() == 7
    reader.close()
    empty = Checkpointer(tmp_path / "empty", keep=1)
    assert empty.read_config() is None
    empty.close()


def test_the_orbax_noise_filters_last_only_as_long_as_the_checkpointer(tmp_path):
    """The unraisable-hook and absl-log filters are installed by a Checkpointer and restored by close()."""
    import logging
    import sys
    import types

    hook_before, filters_before = sys.unraisablehook, list(logging.getLogger("absl").filters)
    checkpointer = Checkpointer(tmp_path, keep=1)
    assert sys.unraisablehook != hook_before
    seen = []
    sys.unraisablehook.__self__._previous_hook = seen.append  # what the filter passes on lands here
    loop_closed = types.SimpleNamespace(exc_value=RuntimeError("Event loop is closed"), object=None, exc_traceback=None)
    unrelated = types.SimpleNamespace(exc_value=KeyError("ours"), object=None, exc_traceback=None)
    sys.unraisablehook(loop_closed)
    sys.unraisablehook(unrelated)
    assert seen == [unrelated]
    sys.unraisablehook.__self__._previous_hook = hook_before
    checkpointer.close()
    assert sys.unraisablehook == hook_before
    assert logging.getLogger("absl").filters == filters_before


def test_an_abandoned_orbax_read_logged_by_asyncio_is_dropped_and_other_asyncio_errors_pass(tmp_path):
    """asyncio logs a gathered read's unretrieved error as "_GatheringFuture exception was never retrieved",
    with no Orbax path in its text: the exception's own traceback says where it came from (seen in CI)."""
    import logging

    def raised_in(filename: str) -> BaseException:
        scope = {}
        exec(
            compile(
                "def read():\n    raise Exception('Encountered error while reading array index')", filename, "exec"
            ),
            scope,
        )
        try:
            try:
                scope["read"]()
            except Exception as inner:
                raise Exception("the gathered read failed") from inner
        except Exception as outer:
            return outer

    def record(error: BaseException) -> logging.LogRecord:
        return logging.LogRecord(
            "asyncio",
            logging.ERROR,
            "asyncio/base_events.py",
            1,
            "_GatheringFuture exception was never retrieved",
            None,
            (type(error), error, error.__traceback__),
        )

    checkpointer = Checkpointer(tmp_path, keep=1)
    try:
        echoes = checkpointer._echoes
        assert not echoes.filter(record(raised_in("/site-packages/orbax/checkpoint/serialization.py")))
        assert echoes.filter(record(raised_in("/home/user/my_training_loop.py")))
    finally:
        checkpointer.close()


def test_an_unreadable_config_is_skipped_and_logged(tmp_path, caplog):
    import logging

    checkpointer = Checkpointer(tmp_path, keep=3, async_save=False)
    _save(checkpointer, 1)
    _save(checkpointer, 2)
    checkpointer.wait()
    (tmp_path / "checkpoints" / "2" / "config" / "metadata").write_text("{not json")
    with caplog.at_level(logging.INFO, logger="fp4lm.train.checkpoint"):
        assert checkpointer.read_config() == {"model": {"d_model": 4}}
    checkpointer.close()
    assert any("step 2 cannot be read" in record.getMessage() for record in caplog.records), caplog.text


def test_close_waits_for_orbaxs_temporary_directory_cleanup(tmp_path):
    """Orbax starts removing leftover temporary directories in a thread when a manager opens; close() must wait
    for it, or a process ending right after logs that thread's failure at interpreter shutdown."""
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "7.orbax-checkpoint-tmp-1").mkdir()  # a save killed half-way
    checkpointer = Checkpointer(tmp_path, keep=1)
    checkpointer.close()
    assert checkpointer.manager._cleanup_tmp_directory_future is None
    assert not (tmp_path / "checkpoints" / "7.orbax-checkpoint-tmp-1").exists()


@struct.dataclass
class _StateBeforeRouterBiases:
    """The train state as fp4lm saved it before the MoE routers' biases were a field of their own."""

    step: jax.Array
    params: dict
    opt_state: Any
    loss_scale: LossScaleState
    rng: jax.Array


def _save_before_router_biases(checkpointer, params: dict) -> None:
    state = init_train_state(params, build_optimizer(OptimizerConfig(), 10), LossScaler(enabled=True), seed=3)
    fields = {name: getattr(state, name) for name in ("params", "opt_state", "loss_scale", "rng")}
    old = _StateBeforeRouterBiases(step=jnp.asarray(5, jnp.int32), **fields)
    args = {"data_iter": {}, "config": {}, "tokenizer_json": "{}", "precision": {"bf16_after_step": None}}
    assert checkpointer.save(5, old, **args)  # pyright: ignore[reportArgumentType]
    checkpointer.wait()


def test_a_checkpoint_from_before_the_router_biases_field_resumes_without_biases(tmp_path):
    checkpointer = Checkpointer(tmp_path, keep=3)
    _save_before_router_biases(checkpointer, _state(0).params)
    restored = checkpointer.restore_latest(_abstract(_state(0)))
    checkpointer.close()
    assert restored is not None and restored.step == 5 and restored.state.router_biases == {}
    _assert_same(restored.state, _state(5))
    assert jax.tree.structure(restored.state) == jax.tree.structure(_state(5))


def test_a_checkpoint_holding_router_biases_among_the_parameters_is_refused_in_one_line(tmp_path):
    checkpointer = Checkpointer(tmp_path, keep=3)
    params = _state(0).params
    _save_before_router_biases(
        checkpointer, {**params, "blocks": {0: {**params["blocks"][0], "router_bias": jnp.zeros(4)}}}
    )
    with pytest.raises(UserError, match=r"holds model.router_bias_update's selection biases among the parameters"):
        checkpointer.restore_latest(_abstract(_state(0)))
    checkpointer.close()
