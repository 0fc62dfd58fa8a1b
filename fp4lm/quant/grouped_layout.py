"""Where each expert's tokens sit in a grouped GEMM: groups padded to whole blocks, and the per-group tensors.

Tokens arrive sorted by expert, ``group_sizes[e]`` of them for expert ``e`` (traced: routing decides them).
Every token operand of the three GEMMs is quantized per group, so the groups are moved into a buffer of
``capacity`` rows in which group ``e`` starts at a multiple of ``multiple`` (16 for NVFP4, 32 for MX) and
is followed by zero rows up to the next multiple, as TransformerEngine's grouped quantize pads: no block
of 16 (or 32) tokens straddles two experts, and the zero rows change no amax and no product.
``capacity`` is the static bound ``sum(round_up(g, multiple)) <= tokens + experts · (multiple - 1)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from fp4lm.quant.recipes import Recipe

BLOCK_ALIGNMENT = 16
"""Groups are padded to at least this many rows: the RHT's runs and NVFP4's blocks, and the row tile of the
grouped GEMM (grouped.py), even for a recipe with no blocks along the tokens (fp8)."""


def token_multiple(recipe: Recipe) -> int:
    """The multiple each group of tokens is padded to: every block along the token axis M of any operand
    of the recipe (wgrad's contraction, a 16x16 tile's rows), and at least `BLOCK_ALIGNMENT`."""
    multiples = [BLOCK_ALIGNMENT]
    for slot in ("fprop_x", "dgrad_g"):  # tokens are their rows
        spec = getattr(recipe, slot)
        multiples.append(1 if spec is None else spec.row_multiple)
    for slot in ("wgrad_g", "wgrad_x"):  # tokens are their contraction
        spec = getattr(recipe, slot)
        multiples.append(1 if spec is None else spec.contraction_multiple)
    return math.lcm(*multiples)


def padded_capacity(tokens: int, experts: int, multiple: int) -> int:
    """Rows of the padded buffer: enough for any split of ``tokens`` into ``experts`` padded groups."""
    return (tokens + experts * (multiple - 1)) // multiple * multiple


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class GroupLayout:
    """Index arrays of one split of tokens into padded groups (all int32).

    ``row_group[r]`` is the expert of padded row r, ``experts`` for the unused rows at the end; ``row_index[r]``
    its row within its group's padded tensor; ``row_token[r]`` the token at padded row r (``tokens`` for a
    padding row); ``token_row[t]`` the padded row of token t (``capacity`` for a token past
    ``sum(group_sizes)``: dropped on the way in, zero on the way out); ``padded_sizes`` and ``padded_starts``
    each group's padded length and first row.
    """

    row_group: jax.Array
    row_index: jax.Array
    row_token: jax.Array
    token_row: jax.Array
    padded_sizes: jax.Array
    padded_starts: jax.Array

    @classmethod
    def of(cls, group_sizes: jax.Array, tokens: int, multiple: int) -> GroupLayout:
        experts = group_sizes.shape[0]
        capacity = padded_capacity(tokens, experts, multiple)
        sizes = group_sizes.astype(jnp.int32)
        padded = (sizes + multiple - 1) // multiple * multiple
        padded_ends = jnp.cumsum(padded)
        padded_starts = padded_ends - padded
        ends = jnp.cumsum(sizes)
        token = jnp.arange(tokens, dtype=jnp.int32)
        token_group = jnp.searchsorted(ends, token, side="right").astype(jnp.int32)
        in_range = token_group < experts
        safe = jnp.minimum(token_group, experts - 1)
        token_row = jnp.where(in_range, padded_starts[safe] + token - (ends[safe] - sizes[safe]), capacity)
        row = jnp.arange(capacity, dtype=jnp.int32)
        row_group = jnp.searchsorted(padded_ends, row, side="right").astype(jnp.int32)
        row_expert = jnp.minimum(row_group, experts - 1)
        row_index = jnp.where(row_group < experts, row - padded_starts[row_expert], 0)
        holds_token = (row_group < experts) & (row_index < sizes[row_expert])
        row_token = jnp.where(holds_token, ends[row_expert] - sizes[row_expert] + row_index, tokens)
        return cls(row_group, row_index, row_token, token_row, padded, padded_starts)

    @property
    def capacity(self) -> int:
        return self.row_group.shape[0]

    @property
    def experts(self) -> int:
        return self.padded_sizes.shape[0]

    def pad(self, tokens_first: jax.Array) -> jax.Array:
        """``[tokens, ...]`` -> ``[capacity, ...]``: each token at its padded row, zeros elsewhere (a gather of
        rows: on a CPU five times as fast as scattering the tokens into a zero buffer). The barrier keeps XLA
        from fusing the gather into a consumer that reads the buffer transposed (wgrad's), one row per element."""
        return jax.lax.optimization_barrier(tokens_first.at[self.row_token].get(mode="fill", fill_value=0))

    def unpad(self, rows_first: jax.Array) -> jax.Array:
        """``[capacity, ...]`` -> ``[tokens, ...]`` (zero for a token past the groups)."""
        return rows_first.at[self.token_row].get(mode="fill", fill_value=0)
