"""`fp4lm sample`: a saved run's continuation of a prompt, written to the terminal as it is generated."""

from __future__ import annotations

from collections.abc import Callable

from flax import nnx

from fp4lm.errors import UserError
from fp4lm.inference.saved_run import SavedRun
from fp4lm.model.generate import check_prompt_fits, generate
from fp4lm.train import model_setup


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
    vocab_size = int(run.params["embed"]["table"].shape[0])
    return model_setup.graphdef_of(model_setup.abstract_model(run.config, vocab_size, run.policy))


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
    new = generate(
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
