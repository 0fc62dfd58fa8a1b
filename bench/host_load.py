"""The host's load, recorded with every benchmark figure: a ratio measured on a busy machine is compressed
(the baseline slows too), so figures meant for BENCHMARKS.md are taken only on an idle host."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from fp4lm.host_load import IDLE_LOAD, load_average  # noqa: E402  (one home, shared with fp4lm compare)

__all__ = ["IDLE_LOAD", "load_average"]


def describe(before: float | None, after: float | None) -> str:
    if before is None or after is None:
        return "load average unknown"
    state = "idle" if max(before, after) <= IDLE_LOAD else "LOADED"
    return f"load average {before:.2f} before, {after:.2f} after ({state}; idle means <= {IDLE_LOAD})"


def is_idle(before: float | None, after: float | None) -> bool:
    return before is not None and after is not None and max(before, after) <= IDLE_LOAD


def add_allow_load_flag(parser) -> None:
    parser.add_argument("--allow-load", action="store_true", help="report figures from a busy host, marked loaded")


def refuse_unless_idle(loads: list[float | None], *, allow_load: bool) -> bool:
    """Whether every load in `loads` was idle. When one was not and `allow_load` is False, prints the one-line
    refusal and exits with code 3 (a report from a busy host then prints LOADED_MARK above its table)."""
    idle = all(load is not None for load in loads) and max(loads) <= IDLE_LOAD  # type: ignore[type-var]
    if idle:
        return True
    described = describe(loads[0], loads[-1])
    if not allow_load:
        print(
            f"error: the host is busy ({described}), so these ratios would be compressed; rerun on an idle "
            "machine, or pass --allow-load to report them marked as loaded",
            file=sys.stderr,
        )
        raise SystemExit(3)
    return False


LOADED_MARK = "**loaded**: measured on a busy host; the ratios are compressed and are not the published figures."
