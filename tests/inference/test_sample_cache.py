"""Sampling that scales: on a trained run the KV-cache generator's greedy text equals the one a full window per
token chooses, past the context too; stopping at EOS, streaming, the prompt-length refusal, and temperature /
top-k / top-p judged by the distributions they draw."""

from __future__ import annotations

import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lm.errors import UserError
from fp4lm.inference.sample import saved_run_graphdef, stream_sample
from fp4lm.inference.saved_run import load_run
from fp4lm.model.generate import choose_token, generate
from fp4lm.train.step import model_apply
from tests.reliability.helpers_reliability import run_cli_in_process, tiny_overrides, train_tiny_run, write_corpus

pytestmark = pytest.mark.slow

DRAWS = 400


def _draws(logits, **options) -> np.ndarray:
    """DRAWS tokens drawn from `logits` with independent keys."""
    keys = jax.random.split(jax.random.key(0), DRAWS)
    choose = functools.partial(choose_token, vocab_limit=logits.shape[-1], **options)
    return np.asarray(jax.vmap(lambda key: choose(logits, key))(keys))  # op by op: one compile per primitive


LOGITS = jnp.log(jnp.array([0.40, 0.25, 0.15, 0.10, 0.06, 0.04]))


def check_temperature_effect(choose) -> None:
    """The most likely token is drawn more often as the temperature falls (and always at temperature 0)."""
    frequencies = [np.mean(choose(LOGITS, temperature=t, top_k=0) == 0) for t in (2.0, 1.0, 0.5, 0.25)]
    assert all(a < b for a, b in zip(frequencies[:-1], frequencies[1:], strict=True)), frequencies
    assert abs(frequencies[1] - 0.40) < 0.08, frequencies  # temperature 1 draws the model's own distribution
    assert np.all(choose(LOGITS, temperature=0.0, top_k=0) == 0)


def test_the_most_likely_token_gains_as_the_temperature_falls():
    check_temperature_effect(_draws)


def test_the_temperature_check_catches_an_inverted_temperature():
    def inverted(logits, temperature, **options):  # multiplies where it should divide
        return _draws(logits * temperature * temperature, temperature=temperature, **options)

    with pytest.raises(AssertionError):
        check_temperature_effect(inverted)


def test_top_k_never_draws_outside_the_k_most_likely():
    draws = _draws(LOGITS, temperature=3.0, top_k=3)
    assert set(draws.tolist()) == {0, 1, 2}


@pytest.mark.parametrize(("top_p", "kept"), [(0.3, {0}), (0.6, {0, 1}), (0.7, {0, 1, 2}), (0.85, {0, 1, 2, 3})])
def test_top_p_keeps_the_smallest_set_reaching_the_mass(top_p, kept):
    """Cumulative probabilities 0.40, 0.65, 0.80, 0.90, ...: the set grows until it holds top_p of the mass."""
    draws = _draws(LOGITS, temperature=1.0, top_k=0, top_p=top_p)
    assert set(draws.tolist()) == kept
    if len(kept) > 1:  # the kept tokens keep their relative odds
        assert np.mean(draws == 0) > np.mean(draws == 1)


def test_top_p_applies_after_the_temperature():
    """At a low temperature the top token alone holds 0.9 of the mass: top_p=0.9 keeps only it."""
    assert set(_draws(LOGITS, temperature=0.2, top_k=0, top_p=0.9).tolist()) == {0}


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> pathlib.Path:
    """A tiny byte-level run trained enough to prefer some continuations (2 blocks, the default recipe)."""
    root = tmp_path_factory.mktemp("sample_run")
    run_dir = root / "run"
    extra = ("model.num_layers=2", "train.steps=40", "checkpoint.async_save=false", "eval.batches=0")
    overrides = tiny_overrides(write_corpus(root / "corpus.txt"), root / "cache", run_dir, *extra)
    result = run_cli_in_process("train", *overrides)
    assert result.code == 0, result.stderr
    return run_dir


def _full_window_greedy(apply, params, prompt: list[int], count: int, seq_len: int) -> list[int]:
    """`count` greedy tokens, each from one forward pass over a window of the text (no cache): the window is
    rebuilt from the text's last seq_len // 2 tokens when it is full, as the generator rebuilds its cache."""
    forward = jax.jit(apply)
    tokens, context = list(prompt), list(prompt)
    for _ in range(count):
        if len(context) > seq_len:
            context = tokens[-max(1, seq_len // 2) :]
        window = np.zeros((1, seq_len), np.int32)
        window[0, : len(context)] = context
        token = int(jnp.argmax(forward(params, jnp.asarray(window))[0, len(context) - 1]))
        tokens.append(token)
        context.append(token)
    return tokens[len(prompt) :]


def test_cached_greedy_equals_the_full_window_greedy(trained_run):
    run = load_run(str(trained_run))
    graphdef = saved_run_graphdef(run)
    prompt = run.tokenizer.encode("the quick")
    seq_len = run.config.data.seq_len
    options = {"max_tokens": seq_len + 5, "seq_len": seq_len, "vocab_limit": run.tokenizer.vocab_size}
    streamed = []
    cached = generate(graphdef, run.params, prompt, on_token=streamed.append, **options)
    assert streamed == cached and len(cached) == seq_len + 5
    # past the context the cache is rebuilt from the text's second half and decoding goes on
    assert cached == _full_window_greedy(model_apply(graphdef), run.params, prompt, seq_len + 5, seq_len)
    # the end-of-sequence token ends the text (and is not part of it)
    stop = cached[3]
    first = cached.index(stop)
    assert generate(graphdef, run.params, prompt, eos_id=stop, **options) == cached[:first]


def test_a_prompt_longer_than_the_context_is_refused(trained_run):
    run = load_run(str(trained_run))
    written = []
    with pytest.raises(UserError, match="longer than the model's context of 32"):
        kwargs = {"max_tokens": 4, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0}
        stream_sample(run, "x" * 33, write=written.append, **kwargs)
    assert written == []


def test_fp4lm_sample_streams_top_p_samples(trained_run):
    result = run_cli_in_process("sample", str(trained_run), "--prompt", "the", "--max-tokens", "12", "--top-p", "0.9")
    assert result.code == 0, result.stderr
    assert result.stdout.startswith("the") and len(result.stdout) > len("the\n")


def test_the_end_of_run_sample_applies_eval_sample_top_p(tmp_path):
    """A hot temperature with a top-p so small that only the likeliest token survives is greedy decoding:
    the end-of-run sample equals the greedy continuation of the run's checkpoint (`fp4lm sample`'s generator)."""
    run_dir = train_tiny_run(
        tmp_path,
        "train.steps=6",
        "eval.batches=0",
        "eval.sample_prompt=the",
        "eval.sample_tokens=8",
        "eval.sample_temperature=5.0",
        "eval.sample_top_k=0",
        "eval.sample_top_p=1e-6",
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    run = load_run(str(run_dir))
    prompt = run.tokenizer.encode("the")
    greedy = generate(
        saved_run_graphdef(run),
        run.params,
        prompt,
        max_tokens=8,
        seq_len=32,
        temperature=0.0,
        vocab_limit=run.tokenizer.vocab_size,
    )
    assert summary["sample"] == "the" + run.tokenizer.decode(greedy)
