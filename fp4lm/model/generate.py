"""Text generation from a trained model: greedy, temperature, top-k and top-p (nucleus) sampling.

`generate` (`fp4lm sample`, the end-of-run sample, the benchmark) decodes with a KV cache: the prompt is
prefilled once as a window of `seq_len` positions, then each new token is one jitted decode step that reads the
cached keys and values, so a token costs one position's work instead of a whole window's. Both are the model's
own call (Llama.__call__ with `cache`, fp4lm.model.decode): the blocks, precision and LM head of training.
Tokens are handed to `on_token` as they are chosen (streaming), and generation stops after `max_tokens` or at
the tokenizer's end-of-sequence id (which is not returned). A prompt longer than the context (data.seq_len) is
refused. When the text fills the context, the cache is rebuilt from the text's last seq_len // 2 tokens (one
prefill) and decoding continues from there.

The index-th new token is drawn with the key fold_in(key(seed), index): the same seed gives the same text.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from fp4lm.errors import UserError


def check_sampling_options(*, temperature: float, top_k: int, max_tokens: int, top_p: float = 1.0) -> None:
    """A finite temperature >= 0 (nan or inf would sample from NaN logits: NUL bytes or noise), top-k >= 0,
    0 < top-p <= 1 and max-tokens >= 0; the messages name the `fp4lm sample` options."""
    if not math.isfinite(temperature) or temperature < 0:
        raise UserError(f"--temperature {temperature} must be a finite number >= 0; e.g. 0.8 (0: greedy)")
    if top_k < 0:
        raise UserError(f"--top-k {top_k} must be >= 0 (0: no filter)")
    if not 0.0 < top_p <= 1.0:  # also false for nan
        raise UserError(f"--top-p {top_p} must be in (0, 1]; e.g. 0.9 (1: no filter)")
    if max_tokens < 0:
        raise UserError(f"--max-tokens {max_tokens} must be >= 0")


def choose_token(
    logits_V: jax.Array, key: jax.Array, *, temperature: float, top_k: int, vocab_limit: int, top_p: float = 1.0
) -> jax.Array:
    """The next token id from float32 logits. temperature 0: greedy. top_k 0, top_p 1: no filter.

    After dividing by the temperature, top-k keeps the k largest logits and top-p then keeps the smallest set of
    most likely tokens whose probabilities (renormalised over what top-k kept) add up to at least top_p; the
    most likely token is always kept, and a token tied with the last one kept is kept too.
    Ids at or above `vocab_limit` (model vocabulary padding the tokenizer cannot decode) are never chosen.
    """
    logits_V = jnp.where(jnp.arange(logits_V.shape[-1]) < vocab_limit, logits_V.astype(jnp.float32), -jnp.inf)
    if temperature == 0.0:
        return jnp.argmax(logits_V, axis=-1)
    logits_V = logits_V / temperature
    if top_k and top_k < vocab_limit:
        kth_largest = jax.lax.top_k(logits_V, top_k)[0][..., -1:]
        logits_V = jnp.where(logits_V < kth_largest, -jnp.inf, logits_V)
    if top_p < 1.0:
        sorted_V = jnp.sort(logits_V, axis=-1)[..., ::-1]  # largest first
        probs_V = jax.nn.softmax(sorted_V, axis=-1)
        mass_before_V = jnp.cumsum(probs_V, axis=-1) - probs_V  # probability of the tokens more likely than each
        kept_V = mass_before_V < top_p  # the first token (mass before it 0) always
        smallest_kept = jnp.min(jnp.where(kept_V, sorted_V, jnp.inf), axis=-1, keepdims=True)
        logits_V = jnp.where(logits_V < smallest_kept, -jnp.inf, logits_V)
    return jax.random.categorical(key, logits_V, axis=-1)


def _prompt_tokens(prompt_ids) -> list[int]:
    tokens = [int(t) for t in np.asarray(prompt_ids).reshape(-1)]
    if not tokens:
        raise UserError("the prompt is empty; pass some text, e.g. --prompt 'ROMEO:'")
    return tokens


def check_prompt_fits(prompt_length: int, seq_len: int) -> None:
    """A prompt must fit the model's context: the cache holds seq_len positions."""
    if prompt_length > seq_len:
        raise UserError(
            f"the prompt is {prompt_length} tokens, longer than the model's context of {seq_len} (data.seq_len "
            f"it was trained with); shorten the prompt to at most {seq_len} tokens"
        )


@functools.cache
def _decoder(graphdef: nnx.GraphDef):
    """(prefill(params, window_BS, last), decode(params, cache, tokens_B1, position)) jitted, on the pure-dict
    params that `graphdef` (the model with its precision policy) takes. Both return the next token's logits
    [B, V] (after the window's position `last`, or after `tokens_B1`) and the cache; the decode step takes its
    cache donated, so it is updated in place."""

    def prefill(params, window_BS, last):
        model = nnx.merge(graphdef, params)
        batch, length = window_BS.shape
        cache = model.init_cache(batch, length)
        logits_BSV, cache = model(window_BS, cache=cache, cache_position=jnp.int32(0))
        return jax.lax.dynamic_index_in_dim(logits_BSV, last, axis=1, keepdims=False), cache

    def decode(params, cache, tokens_B1, position):
        logits_B1V, cache = nnx.merge(graphdef, params)(tokens_B1, cache=cache, cache_position=position)
        return logits_B1V[:, 0], cache

    return jax.jit(prefill), jax.jit(decode, donate_argnums=1)


@functools.cache
def _token_chooser(*, temperature: float, top_k: int, top_p: float, vocab_limit: int, seed: int):
    """jit(logits_1V, index) -> the index-th new token (key fold_in(key(seed), index)) after the one row's logits."""

    def choose(logits_1V, index):
        key = jax.random.fold_in(jax.random.key(seed), index)
        return choose_token(
            logits_1V[0], key, temperature=temperature, top_k=top_k, top_p=top_p, vocab_limit=vocab_limit
        )

    return jax.jit(choose)


def generate(
    graphdef: nnx.GraphDef,
    params,
    prompt_ids,
    *,
    max_tokens: int,
    seq_len: int,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    vocab_limit: int,
    eos_id: int | None = None,
    seed: int = 0,
    on_token: Callable[[int], None] | None = None,
    to_device: Callable = jnp.asarray,
) -> list[int]:
    """The prompt's continuation (module doc): at most `max_tokens` new ids, ending before `eos_id`; each is
    passed to `on_token` as soon as it is chosen. `graphdef`: the model (with its precision policy) that `params`
    (pure dict) fill. `to_device` places the host-side inputs (in a multi-process run: as replicated global
    arrays, since the parameters span processes)."""
    check_sampling_options(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=max_tokens)
    tokens = _prompt_tokens(prompt_ids)
    check_prompt_fits(len(tokens), seq_len)
    prefill, decode_step = _decoder(graphdef)
    choose = _token_chooser(temperature=temperature, top_k=top_k, top_p=top_p, vocab_limit=vocab_limit, seed=seed)

    def fill(context: list[int]):
        window = np.zeros((1, seq_len), np.int32)
        window[0, : len(context)] = context
        logits_1V, cache = prefill(params, to_device(window), to_device(np.int32(len(context) - 1)))
        return logits_1V, cache, len(context)

    new_tokens: list[int] = []
    if max_tokens == 0:
        return new_tokens
    logits_1V, cache, position = fill(tokens)
    for index in range(max_tokens):
        token = int(choose(logits_1V, to_device(np.int32(index))))
        if token == eos_id:
            break
        tokens.append(token)
        new_tokens.append(token)
        if on_token is not None:
            on_token(token)
        if index == max_tokens - 1:
            break
        if position == seq_len:  # the context is full: start again from its second half
            logits_1V, cache, position = fill(tokens[-max(1, seq_len // 2) :])
            continue
        tokens_11 = to_device(np.asarray([[token]], np.int32))
        logits_1V, cache = decode_step(params, cache, tokens_11, to_device(np.int32(position)))
        position += 1
    return new_tokens
