"""Text generation from a trained model: greedy, temperature, top-k and top-p (nucleus) sampling.

`generate_cached` (what `fp4lm sample` runs) decodes with a KV cache (fp4lm.model.decode): the prompt is
prefilled once as a window of `seq_len` positions, then each new token is one jitted decode step that reads the
cached keys and values, so a token costs one position's work instead of a whole window's. Tokens are handed to
`on_token` as they are chosen (streaming), and generation stops after `max_tokens` or at the tokenizer's
end-of-sequence id (which is not returned). A prompt longer than the context (data.seq_len) is refused. When the
text fills the context, the cache is rebuilt from the text's last seq_len // 2 tokens (one prefill) and
decoding continues from there.

`generate` is the cache-free form (used for the end-of-run sample and as the reference in tests and the
benchmark): each new token runs one forward pass over a fixed window of `seq_len` positions (the prompt and
the tokens so far, right-padded; causal attention makes the padding after the last real position
irrelevant). When the text outgrows the window, the window holds its last `seq_len` tokens.

Both draw the index-th new token with the key fold_in(key(seed), index), so with the same logits they choose
the same tokens.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from fp4lm.errors import UserError
from fp4lm.model.decode import make_decoder

if TYPE_CHECKING:
    from fp4lm.train.saved_run import SavedRun


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


def make_next_token_fn(
    apply_fn: Callable, *, temperature: float, top_k: int, vocab_limit: int, seed: int, top_p: float = 1.0
):
    """jit(params, window_1T, position, index) -> the token following `position` in the window; the
    sampling key of the index-th new token is fold_in(key(seed), index)."""

    def next_token(params, window_1T, position, index):
        logits_1TV = apply_fn(params, window_1T)
        logits_V = jax.lax.dynamic_index_in_dim(logits_1TV[0], position, axis=0, keepdims=False)
        key = jax.random.fold_in(jax.random.key(seed), index)
        return choose_token(logits_V, key, temperature=temperature, top_k=top_k, top_p=top_p, vocab_limit=vocab_limit)

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
    top_p: float = 1.0,
    vocab_limit: int,
    seed: int = 0,
    to_device: Callable = jnp.asarray,
) -> list[int]:
    """The prompt's continuation: `max_tokens` new token ids.

    `to_device` places the host-side window and position (in a multi-process run: as replicated global
    arrays, since the parameters span processes).
    """
    check_sampling_options(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=max_tokens)
    tokens = _prompt_tokens(prompt_ids)
    next_token = make_next_token_fn(
        apply_fn, temperature=temperature, top_k=top_k, top_p=top_p, vocab_limit=vocab_limit, seed=seed
    )
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
    return make_decoder(graphdef)


@functools.cache
def _token_chooser(*, temperature: float, top_k: int, top_p: float, vocab_limit: int, seed: int):
    """jit(logits_V, index) -> the index-th new token (key fold_in(key(seed), index), as `generate`)."""

    def choose(logits_V, index):
        key = jax.random.fold_in(jax.random.key(seed), index)
        return choose_token(logits_V, key, temperature=temperature, top_k=top_k, top_p=top_p, vocab_limit=vocab_limit)

    return jax.jit(choose)


def generate_cached(
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
) -> list[int]:
    """The prompt's continuation with a KV cache (module doc): at most `max_tokens` new ids, ending before
    `eos_id`; each is passed to `on_token` as soon as it is chosen. `graphdef`: the model (with its precision
    policy) that `params` (pure dict) fill."""
    check_sampling_options(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=max_tokens)
    tokens = _prompt_tokens(prompt_ids)
    check_prompt_fits(len(tokens), seq_len)
    prefill, decode_step = _decoder(graphdef)
    choose = _token_chooser(temperature=temperature, top_k=top_k, top_p=top_p, vocab_limit=vocab_limit, seed=seed)

    def fill(context: list[int]):
        window = np.zeros((1, seq_len), np.int32)
        window[0, : len(context)] = context
        logits_1SV, cache = prefill(params, jnp.asarray(window))
        return logits_1SV[0, len(context) - 1], cache, len(context)

    new_tokens: list[int] = []
    if max_tokens == 0:
        return new_tokens
    logits_V, cache, position = fill(tokens)
    for index in range(max_tokens):
        token = int(choose(logits_V, np.int32(index)))
        if token == eos_id:
            break
        tokens.append(token)
        new_tokens.append(token)
        if on_token is not None:
            on_token(token)
        if index == max_tokens - 1:
            break
        if position == seq_len:  # the context is full: start again from its second half
            logits_V, cache, position = fill(tokens[-max(1, seq_len // 2) :])
            continue
        logits_1V, cache = decode_step(params, cache, jnp.asarray([[token]], jnp.int32), jnp.int32(position))
        logits_V = logits_1V[0]
        position += 1
    return new_tokens


class TextStream:
    """Writes generated text as tokens arrive: decodes all new tokens so far and writes what was not written yet,
    holding back a trailing U+FFFD (a character whose bytes have not all arrived)."""

    def __init__(self, decode: Callable[[list[int]], str], write: Callable[[str], object]):
        self.decode = decode
        self.write = write
        self.tokens: list[int] = []
        self.written = 0

    def __call__(self, token: int) -> None:
        self.tokens.append(token)
        text = self.decode(self.tokens).rstrip("\ufffd")
        if len(text) > self.written:
            self.write(text[self.written :])
            self.written = len(text)

    def finish(self) -> None:
        text = self.decode(self.tokens)
        self.write(text[self.written :])
        self.written = len(text)


def saved_run_graphdef(run: SavedRun) -> nnx.GraphDef:
    """The saved run's model graph (structure and the precision policy in force at its step) for its params."""
    from fp4lm.quant import Policy
    from fp4lm.train import model_setup

    policy = model_setup.policy_at(run.step, run.config, Policy.from_config(run.config))
    vocab_size = int(run.params["embed"]["table"].shape[0])
    return model_setup.graphdef_of(model_setup.abstract_model(run.config, vocab_size, policy))


def stream_sample(
    run: SavedRun,
    prompt: str,
    *,
    max_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int,
    write: Callable[[str], object],
) -> list[int]:
    """`fp4lm sample`: writes the prompt, then the continuation as it is generated (KV cache, stopping at the
    tokenizer's end-of-sequence token); returns the new token ids."""
    ids = run.tokenizer.encode(prompt)
    if len(ids) == 0:
        raise UserError("the prompt is empty; pass some text, e.g. --prompt 'ROMEO:'")
    check_prompt_fits(len(ids), run.config.data.seq_len)
    graphdef = saved_run_graphdef(run)
    write(prompt)
    stream = TextStream(run.tokenizer.decode, write)
    new = generate_cached(
        graphdef,
        run.params,
        ids,
        max_tokens=max_tokens,
        seq_len=run.config.data.seq_len,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        vocab_limit=run.tokenizer.vocab_size,
        eos_id=run.tokenizer.eos_id,
        seed=seed,
        on_token=stream,
    )
    stream.finish()
    return new
