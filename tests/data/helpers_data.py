"""Shared bits of the data tests: a stand-in for the config's data section and a UserError checker."""

from __future__ import annotations

import dataclasses

import pytest

from fp4lm.config import describe_error
from fp4lm.errors import UserError


@dataclasses.dataclass(frozen=True)
class DataCfg:
    """The attributes fp4lm.data reads from config.data (the data code takes any object with them)."""

    path: str = "bundled:shakespeare"
    format: str = "auto"
    jsonl_field: str = "text"
    tokenizer: str = "byte"
    vocab_size: int = 256
    seq_len: int = 16
    val_fraction: float = 0.1


def user_error(fn, *fragments: str) -> str:
    """Runs fn, expects a one-line UserError of the form "problem; fix" holding every fragment, as the
    user reads it: with the settings it names spelled as config keys (`describe_error`)."""
    with pytest.raises(UserError) as info:
        fn()
    message = describe_error(info.value)
    assert "\n" not in message, message
    assert "; " in message, f"no fix given: {message}"
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def sample_text(lines: int = 200) -> str:
    """A small deterministic multi-line text with some repetition (so BPE finds merges)."""
    words = ["to", "be", "or", "not", "that", "is", "the", "question", "whether", "tis", "nobler"]
    return "".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(i % 9 + 3)) + "\n" for i in range(lines))
