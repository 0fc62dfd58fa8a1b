"""Scanning token ids in chunks, so a memory-mapped array is read once and never loaded whole: the one scan
behind a pre-tokenized source's check (fp4lm/data/token_files.py) and a prepared corpus's (`fp4lm prepare
--verify`, and opening a corpus whose manifest predates the recorded largest id; fp4lm/data/prepared.py)."""

from __future__ import annotations

import numpy as np

CHUNK_TOKENS = 1 << 24


def id_extremes(tokens: np.ndarray) -> tuple[int | None, int | None]:
    """(the smallest id if it is negative, else None; the largest id, None when empty) of a 1-D array of token
    ids, in one pass. An unsigned array holds no negative id, so only its largest is computed (half the work)."""
    negative = largest = None
    signed = tokens.dtype.kind != "u"
    for start in range(0, tokens.size, CHUNK_TOKENS):
        part = np.asarray(tokens[start : start + CHUNK_TOKENS])
        high = int(part.max())
        largest = high if largest is None else max(largest, high)
        low = int(part.min()) if signed else 0
        if low < 0:
            negative = low if negative is None else min(negative, low)
    return negative, largest


def first_position(tokens: np.ndarray, token_id: int) -> int:
    """Where `token_id` first occurs in `tokens` (-1 when nowhere): to name the place of a bad id."""
    for start in range(0, tokens.size, CHUNK_TOKENS):
        found = np.flatnonzero(np.asarray(tokens[start : start + CHUNK_TOKENS]) == token_id)
        if found.size:
            return start + int(found[0])
    return -1
