"""The shape letters: what each capital letter in an array's name means, one table for the whole package.

An array's name ends in its axes, one letter each, in order: `x_BTD` is [batch rows, positions, model width],
`kernel_XDM` is [experts, model width, expert hidden width]. A letter means the same axis in every module;
tests/test_shape_letters.py checks that every name in fp4lm uses only these letters.
"""

from __future__ import annotations

SHAPE_LETTERS: dict[str, str] = {
    "B": "batch rows",
    "T": "positions of a row (the queries in attention)",
    "S": "key/value positions (a KV cache's length)",
    "D": "model width (model.d_model)",
    "V": "vocabulary (the model's, padded)",
    "H": "query heads",
    "K": "key/value heads",
    "G": "query heads per key/value head (H / K)",
    "E": "head width (model.head_dim)",
    "F": "rotary frequencies (E / 2)",
    "C": "positions of one attention chunk (a block of queries)",
    "N": "tokens of a step, the rows flattened (B * T)",
    "M": "MLP hidden width (one expert's, or the dense MLP's)",
    "X": "experts",
    "A": "experts chosen per token (model.experts_per_token, top-k)",
    "P": "(token, chosen expert) pairs (N * A)",
    "R": "rows of a grouped GEMM: the pairs in expert order, padded per group",
    "W": "devices along the expert mesh axis (mesh.expert)",
    "L": "layers of a scanned group, stacked",
}
