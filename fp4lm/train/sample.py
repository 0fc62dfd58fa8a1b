"""Text generation from a trained model: greedy, temperature and top-k sampling.

The model has no KV cache, so each new token runs one forward pass over a fixed window of `seq_len`
positions (the prompt and the tokens so far, right-padded; causal attention makes the padding after the
last real position irrelevant). One shape means one compilation, whatever the prompt length. When the
text outgrows the window, the window holds its last `seq_len` tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fp4lm.errors import UserError


def check_sampling_options(*, temperature: float, top_k: int, max_tokens: int) -> None:
    """A finite temperature >= 0 (nan or inf would sample from NaN logits: NUL bytes or noise), top-k >= 0 and
    max-tokens >= 0; the messages name the `fp4lm sample` options."""
    if not math.isfinite(temperature) or temperature < 0:
        raise UserError(f"--temperature {temperature} must be a finite number >= 0; e.g. 0.8 (0: greedy)")
    if top_k < 0:
        raise UserError(f"--top-k {top_k} must be >= 0 (0: no filter)")
    if max_tokens < 0:
        raise UserError(f"--max-tokens {max_tokens} must be >= 0")


def choose_token(logits_V: jax.Array, key: jax.Array, *, temperature: float, top_k: int, vocab_limit: int) -> jax.Array:
    """The next token id from float32 logits. temperature 0: greedy. top_k 0: no filter.

    Ids at or above `vocab_limit` (model vocabulary padding the tokenizer cannot decode) are never chosen.
    """
    logits_V = jnp.where(jnp.arange(logits_V.shape[-1]) < vocab_limit, logits_V.astype(jnp.float32), -jnp.inf)
    if temperature == 0.0:
        return jnp.argmax(logits_V, axis=-1)
    logits_V = logits_V / temperature
    if top_k and top_k < vocab_limit:
        kth_largest = jax.lax.top_k(logits_V, top_k)[0][..., -1:]
        logits_V = jnp.where(logits_V < kth_largest, -jnp.inf, logits_V)
    return jax.random.categorical(key, logits_V, axis=-1)


def make_next_token_fn(apply_fn: Callable, *, temperature: float, top_k: int, vocab_limit: int, seed: int):
    """jit(params, window_1T, position, index) -> the token following `position` in the window; the
    sampling key of the index-th new token is fold_in(key(seed), index)."""

    def next_token(params, window_1T, position, index):
        logits_1TV = apply_fn(params, window_1T)
        logits_V = jax.lax.dynamic_index_in_dim(logits_1TV[0], position, axis=0, keepdims=False)
        key = jax.random.fold_in(jax.random.key(seed), index)
        return choose_token(logits_V, key, temperature=temperature, top_k=top_k, vocab_limit=vocab_limit)

    return jax.jit(next_token)


def generate(
    apply_fn: Callable,
    params,
    prompt_ids: np.ndarray,
    *,
    max_tokens: int,
    seq_len: int,
    temperature: float = 0.0,
    top_k: int = 0,
    vocab_limit: int,
    seed: int = 0,
    to_device: Callable = jnp.asarray,
) -> list[int]:
    """The prompt's continuation: `max_tokens` new token ids.

    `to_device` places the host-side window and position (in a multi-process run: as replicated global
    arrays, since the parameters span processes).
    """
    check_sampling_options(temperature=temperature, top_k=top_k, max_tokens=max_tokens)
    tokens = [int(t) for t in np.asarray(prompt_ids).reshape(-1)]
    if not tokens:
        raise UserError("the prompt is empty; pass some text, e.g. --prompt 'ROMEO:'")
    next_token = make_next_token_fn(apply_fn, temperature=temperature, top_k=top_k, vocab_limit=vocab_limit, seed=seed)
    new_tokens = []
    for index in range(max_tokens):
        context = tokens[-seq_len:]
        window = np.zeros((1, seq_len), np.int32)
        window[0, : len(context)] = context
        position = to_device(np.asarray(len(context) - 1, np.int32))
        step_index = to_device(np.asarray(index, np.int32))
        token = int(next_token(params, to_device(window), position, step_index))
        tokens.append(token)
        new_tokens.append(token)
    return new_tokens
