"""Where each group's rows sit in a segment-aware (per-group) quantizer: groups padded to whole blocks.

Rows arrive sorted by group (the pairs of a mixture-of-experts layer in expert order), ``group_sizes[x]`` of
them for group ``x`` (traced: routing decides them). Every group is quantized as its own tensor, so the
groups are moved into a buffer of R rows in which group ``x`` starts at a multiple of ``multiple`` (16 for
NVFP4, 32 for MX) and is followed by zero rows up to the next multiple, as TransformerEngine's grouped
quantize pads: no block of 16 (or 32) rows straddles two groups, and the zero rows change no amax and no
product. R is the static bound ``sum(round_up(g, multiple)) <= rows + groups · (multiple - 1)``.

The index arithmetic has no loops (``searchsorted`` compares every row with every group end), so a grouped
GEMM built on it lowers to straight-line code.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp


def padded_capacity(rows: int, groups: int, multiple: int) -> int:
    """R, the rows of the padded buffer: enough for any split of ``rows`` into ``groups`` padded groups."""
    return (rows + groups * (multiple - 1)) // multiple * multiple


def _group_of(ends_X: jax.Array, index: jax.Array) -> jax.Array:
    """The group holding each ``index`` (``len(ends_X)`` past the last), given the groups' exclusive ends."""
    return jnp.searchsorted(ends_X, index, side="right", method="compare_all").astype(jnp.int32)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class GroupLayout:
    """Index arrays of one split of P rows into padded groups (all int32; X groups, R padded rows).

    ``row_group_R[r]`` is the group of padded row r, X for the unused rows at the end; ``row_index_R[r]`` its
    row within its group's padded tensor; ``row_token_R[r]`` the input row at padded row r (P for a padding
    row); ``token_row_P[p]`` the padded row of input row p (R for a row past ``sum(group_sizes)``: dropped on
    the way in, zero on the way out); ``padded_sizes_X`` and ``padded_starts_X`` each group's padded length
    and first row.
    """

    row_group_R: jax.Array
    row_index_R: jax.Array
    row_token_R: jax.Array
    token_row_P: jax.Array
    padded_sizes_X: jax.Array
    padded_starts_X: jax.Array

    @classmethod
    def of(cls, group_sizes_X: jax.Array, rows: int, multiple: int) -> GroupLayout:
        groups = group_sizes_X.shape[0]
        capacity = padded_capacity(rows, groups, multiple)
        sizes_X = group_sizes_X.astype(jnp.int32)
        padded_X = (sizes_X + multiple - 1) // multiple * multiple
        padded_ends_X = jnp.cumsum(padded_X)
        padded_starts_X = padded_ends_X - padded_X
        ends_X = jnp.cumsum(sizes_X)
        token_P = jnp.arange(rows, dtype=jnp.int32)
        token_group_P = _group_of(ends_X, token_P)
        in_range_P = token_group_P < groups
        safe_P = jnp.minimum(token_group_P, groups - 1)
        token_row_P = jnp.where(
            in_range_P, padded_starts_X[safe_P] + token_P - (ends_X[safe_P] - sizes_X[safe_P]), capacity
        )
        row_R = jnp.arange(capacity, dtype=jnp.int32)
        row_group_R = _group_of(padded_ends_X, row_R)
        row_expert_R = jnp.minimum(row_group_R, groups - 1)
        row_index_R = jnp.where(row_group_R < groups, row_R - padded_starts_X[row_expert_R], 0)
        holds_token_R = (row_group_R < groups) & (row_index_R < sizes_X[row_expert_R])
        row_token_R = jnp.where(holds_token_R, ends_X[row_expert_R] - sizes_X[row_expert_R] + row_index_R, rows)
        return cls(row_group_R, row_index_R, row_token_R, token_row_P, padded_X, padded_starts_X)

    @property
    def capacity(self) -> int:
        """R, the padded buffer's rows."""
        return self.row_group_R.shape[0]

    @property
    def groups(self) -> int:
        """X, the number of groups."""
        return self.padded_sizes_X.shape[0]

    def pad(self, rows_first: jax.Array) -> jax.Array:
        """``[P, ...]`` -> ``[R, ...]``: each input row at its padded row, zeros elsewhere (a gather of rows: on
        a CPU five times as fast as scattering the rows into a zero buffer). The barrier keeps XLA from fusing
        the gather into a consumer that reads the buffer transposed (wgrad's), one row per element."""
        return jax.lax.optimization_barrier(rows_first.at[self.row_token_R].get(mode="fill", fill_value=0))

    def unpad(self, padded_first: jax.Array) -> jax.Array:
        """``[R, ...]`` -> ``[P, ...]`` (zero for an input row past the groups)."""
        return padded_first.at[self.token_row_P].get(mode="fill", fill_value=0)
