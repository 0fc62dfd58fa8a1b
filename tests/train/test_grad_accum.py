"""Gradient accumulation (train.grad_accum_steps): N micro-batches in one jitted step.

Tolerance of "N micro-batches equal the full batch" in bf16: the micro-batches hold the same rows under the
same weights, so the loss differs only by the order of float32 sums (a mean of N means): within 1e-5
relative (measured 3e-7). The gradients differ by more, for a reason that is not accumulation's: the bf16
recipe's weight-gradient GEMM returns bfloat16, so the full batch's gradient is rounded to bfloat16 once
(error up to half a bfloat16 ulp, 2^-9 relative) and each micro-batch's gradient is rounded before the
float32 sum (the same, relative to the micro-batch's own, possibly larger, gradient, when the micro-batches
partly cancel). So each element may differ by one bfloat16 ulp of its value (2^-7 relative) plus 2^-8 of
the largest gradient for that cancellation; measured: at most 0.0015 of the largest beyond one ulp (N=4).
Leaving one micro-batch out lands 1x-2x the largest gradient away (measured), far outside the tolerance.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fp4lm.config import check_micro_batches_per_host, load_config
from fp4lm.errors import UserError
from fp4lm.quant import Policy, dot_general
from fp4lm.sharding import make_mesh
from fp4lm.train import model_setup
from fp4lm.train.loss_scale import LossScaler
from fp4lm.train.setup import build_run
from fp4lm.train.state import init_train_state
from fp4lm.train.step import (
    cross_entropy,
    make_train_step,
    model_apply,
    split_micro_batches,
)
from tests.train.conftest import TINY

pytestmark = pytest.mark.slow

LOSS_RTOL = 1e-5
GRAD_RTOL = 2.0**-7  # one bfloat16 ulp of the element
GRAD_ATOL = 2.0**-8  # of the largest gradient magnitude: micro-batch gradients that partly cancel
BATCH, SEQ = 8, 16


def _setup(recipe: str):
    config = load_config(None, [*TINY, f"precision.recipe={recipe}", f"train.batch_size={BATCH}"])
    policy = Policy.from_config(config)
    run = build_run(config, make_mesh(config.mesh), policy)
    apply_fn = model_apply(model_setup.graphdef_with_policy(run.model, policy))
    return run, apply_fn


def _batch(seed: int = 0, vocab: int = 200) -> dict:
    tokens = np.random.default_rng(seed).integers(0, vocab, size=(BATCH, SEQ + 1), dtype=np.int32)
    return {"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:])}


def _sgd_step(apply_fn, count: int, scaler: LossScaler | None = None):
    """A step whose update is -gradient (SGD, rate 1): old params - new params are the gradients.
    `apply_fn` returns logits; these models have no routers."""
    routed = lambda *args, **kwargs: (apply_fn(*args, **kwargs), {})  # noqa: E731
    return jax.jit(make_train_step(routed, optax.sgd(1.0), scaler or LossScaler(enabled=False), lambda _: 1.0, count))


def _fresh(run, scaler: LossScaler | None = None):
    state = run.fresh_state()
    return dataclasses.replace(
        state, opt_state=optax.sgd(1.0).init(state.params), loss_scale=(scaler or LossScaler(enabled=False)).init()
    )


def _grads(before, after) -> list[np.ndarray]:
    return [np.asarray(b) - np.asarray(a) for b, a in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True)]


TOY_VOCAB, TOY_WIDTH = 64, 32


def _toy(recipe: str):
    """A one-matmul language model whose matmul `recipe` quantizes (cheap to compile): embed, then project."""
    keys = jax.random.split(jax.random.key(0))
    params = {
        "embed": jax.random.normal(keys[0], (TOY_VOCAB, TOY_WIDTH)),
        "w": 0.1 * jax.random.normal(keys[1], (TOY_WIDTH, TOY_VOCAB)),
    }
    dot = dot_general(recipe)

    def apply_fn(params, tokens, *, quant_key=None, step_number=0):
        del step_number
        x = params["embed"][tokens].astype(jnp.bfloat16)
        key_arg = {} if quant_key is None else {"key": quant_key}
        dims = (((2,), (0,)), ((), ()))
        return dot(x, params["w"].astype(jnp.bfloat16), dims, preferred_element_type=jnp.float32, **key_arg)

    return params, apply_fn


def _toy_state(params, scaler: LossScaler | None = None):
    return init_train_state(params, optax.sgd(1.0), scaler or LossScaler(enabled=False), seed=0)


@pytest.fixture(scope="module")
def bf16_full_batch():
    """The tiny bf16 Llama, a batch, and the gradients of one step on the whole batch."""
    run, apply_fn = _setup("bf16")
    batch = _batch()
    state, metrics = _sgd_step(apply_fn, 1)(_fresh(run), batch)
    return run, apply_fn, batch, float(metrics["loss"]), _grads(_fresh(run).params, state.params)


def test_split_takes_every_nth_row_of_every_array():
    rows = np.arange(8)
    batch = {
        "inputs": jnp.asarray(np.stack([rows * 10 + t for t in range(3)], axis=1)),  # [8, 3]
        "targets": jnp.asarray(rows),
        "segment_ids": jnp.asarray(rows[:, None] * np.ones((1, 3), np.int32)),
        "positions": jnp.asarray(np.tile(np.arange(3), (8, 1)) + rows[:, None] * 100),
    }
    micro = split_micro_batches(batch, 4)
    for name, array in batch.items():
        assert micro[name].shape == (4, 2, *array.shape[1:]), name
        for i in range(4):
            np.testing.assert_array_equal(micro[name][i], np.asarray(array)[i::4], err_msg=name)


@pytest.mark.parametrize("count", [2, 4])
def test_bf16_micro_batches_equal_the_full_batch(count, bf16_full_batch):
    run, apply_fn, batch, full_loss, full_grads = bf16_full_batch
    state, metrics = _sgd_step(apply_fn, count)(_fresh(run), batch)
    assert float(metrics["loss"]) == pytest.approx(full_loss, rel=LOSS_RTOL)
    largest = max(float(np.max(np.abs(g))) for g in full_grads)
    for want, got in zip(full_grads, _grads(_fresh(run).params, state.params), strict=True):
        np.testing.assert_allclose(got, want, rtol=GRAD_RTOL, atol=GRAD_ATOL * largest)


def test_nvfp4_micro_batches_get_their_own_rounding_keys():
    """Two identical micro-batches: their stochastic rounding differs, so their gradients differ, and the
    step's gradient is the mean of the two with keys fold_in(step key, 0) and fold_in(step key, 1)."""
    params, apply_fn = _toy("nvfp4")
    # Micro-batch i takes rows i, i + 2, ...: rows [a, a, b, b, ...] give two identical micro-batches.
    batch = jax.tree.map(lambda x: jnp.repeat(x[: BATCH // 2], 2, axis=0), _batch(vocab=TOY_VOCAB))
    state = _toy_state(params)
    after, _ = _sgd_step(apply_fn, 2)(state, batch)
    micro = jax.tree.map(lambda x: x[::2], batch)

    @jax.jit
    def grads_with(key):
        loss = lambda p: cross_entropy(apply_fn(p, micro["inputs"], quant_key=key), micro["targets"])  # noqa: E731
        return jax.grad(loss)(params)

    step_key = state.quant_key()
    g0 = jax.tree.leaves(grads_with(jax.random.fold_in(step_key, 0)))
    g1 = jax.tree.leaves(grads_with(jax.random.fold_in(step_key, 1)))
    assert any(not np.array_equal(a, b) for a, b in zip(g0, g1, strict=True)), "same rounding in both micro-batches"
    for got, a, b in zip(_grads(params, after.params), g0, g1, strict=True):
        expected = (np.asarray(a) + np.asarray(b)) / 2
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6 * max(1.0, float(np.max(np.abs(expected)))))


def test_a_nonfinite_micro_batch_skips_the_whole_step():
    params, toy_apply = _toy("bf16")
    poison = TOY_VOCAB - 1  # a token id that only the poisoned micro-batch holds

    def poisoned(params, tokens, **kwargs):
        logits = toy_apply(params, tokens, **kwargs)
        return jnp.where(jnp.any(tokens == poison), jnp.nan, 1.0) * logits

    scaler = LossScaler(enabled=True, initial_scale=2.0**8)
    step = _sgd_step(poisoned, 2, scaler)
    clean = _batch(vocab=poison)
    state, metrics = step(_toy_state(params, scaler), clean)
    assert not bool(metrics["skipped"])
    bad = dict(clean, inputs=clean["inputs"].at[3, 5].set(poison))  # row 3: micro-batch 1 only
    before = jax.tree.map(np.asarray, state.params)
    state, metrics = step(state, bad)
    assert bool(metrics["skipped"]) and int(metrics["skipped_steps"]) == 1
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, state.params), before)
    assert float(state.loss_scale.scale) == 2.0**7  # backed off


def test_grad_accum_steps_must_divide_the_batch():
    with pytest.raises(UserError, match="train.grad_accum_steps=3 does not divide train.batch_size=4"):
        load_config(None, [*TINY, "train.grad_accum_steps=3"])
    with pytest.raises(UserError, match="train.grad_accum_steps"):
        load_config(None, [*TINY, "train.grad_accum_steps=0"])
    check_micro_batches_per_host(16, 4, 2)  # 8 rows per host, 2 per micro-batch
    with pytest.raises(UserError, match="per-host batch of 4 sequences"):
        check_micro_batches_per_host(8, 8, 2)  # divides the global batch, not a host's 4 rows


def test_a_run_with_micro_batches_counts_all_their_tokens(tmp_path, tiny, monkeypatch):
    """End to end: the loop builds the step with train.grad_accum_steps, and tokens/s counts the whole batch."""
    import fp4lm.train.run_functions as run_functions
    from fp4lm.train import train

    built = []

    def spy(*args, **kwargs):
        built.append(args[4] if len(args) > 4 else kwargs.get("grad_accum_steps", 1))
        return make_train_step(*args, **kwargs)

    monkeypatch.setattr(run_functions, "make_train_step", spy)
    overrides = [*tiny, "train.steps=3", "train.grad_accum_steps=2", "eval.batches=0", "eval.sample_tokens=0"]
    config = load_config(None, [*overrides, "precision.recipe=bf16", f"train.run_dir={tmp_path / 'run'}"])
    train(config)
    assert built == [2]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if "tokens_per_sec" in r]
    assert logged and all(np.isfinite(r["loss"]) for r in logged)
    tokens_per_step = 4 * 16  # train.batch_size x data.seq_len: both micro-batches
    for r in logged:
        assert r["tokens_per_sec"] == pytest.approx(tokens_per_step / r["step_time_s"], rel=1e-6)


def test_the_memory_estimate_counts_one_micro_batch_of_activations():
    from fp4lm.model.memory_estimate import estimate_training_memory, parameter_count

    base = [*TINY, "train.batch_size=16", "data.seq_len=64"]
    whole = estimate_training_memory(load_config(None, base), (1, 1, 1))
    split = estimate_training_memory(load_config(None, [*base, "train.grad_accum_steps=4"]), (1, 1, 1))
    quarter = estimate_training_memory(load_config(None, [*TINY, "train.batch_size=4", "data.seq_len=64"]), (1, 1, 1))
    assert split.activations == quarter.activations < whole.activations
    assert split.logits == quarter.logits
    assert split.state == whole.state + 4 * parameter_count(load_config(None, base))  # the float32 gradient sum
