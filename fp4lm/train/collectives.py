"""What one training step sends between devices, read from the compiled program (`fp4lm train --dry-run`).

The compiled program is SPMD: every device runs the same HLO on its shards, so its collectives are each
device's communication. Each collective instruction is found in the program's text with its result shape, its
dtype and its group (the devices it spans, n), and counted as often as it runs: the body of a while loop (a
scanned layer stack, the gradient-accumulation loop) once per iteration from XLA's `known_trip_count`, the
larger branch of a conditional, the callees of calls and fusions once per call.

The bytes a device *sends* are those of the bandwidth-optimal (ring) algorithm, the figure a link's bandwidth
divides, for a result of B bytes over a group of n devices:

    all-gather          (n-1)/n · B   (B: the gathered array; the device sends its shard to n-1 others)
    reduce-scatter      (n-1) · B     (B: the device's shard of the reduced array)
    all-reduce          2(n-1)/n · B  (a reduce-scatter then an all-gather)
    all-to-all          (n-1)/n · B   (it keeps its own 1/n)
    collective-permute  B             (to one peer)

The figures are the compiled program's, and XLA's backends differ: the CPU's widens bf16 collectives to f32
and all-reduces the gradients that a GPU's reduce-scatters (an all-reduce followed by a slice), so on a CPU
the bytes are an upper bound of a GPU's for the same mesh.
"""

from __future__ import annotations

import dataclasses
import math
import re

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")

_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s+([a-z][a-z0-9\-]*)\((.*)$")
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([\d,]*)\]")
_CALLEES = re.compile(r"\b(?:calls|to_apply)=%?([\w.\-]+)")  # a while loop's body is read with its trip count
_BRANCHES = re.compile(
    r"\b(?:branch_computations=\{([^}]*)\}|true_computation=%?([\w.\-]+), false_computation=%?([\w.\-]+))"
)
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def dtype_bits(name: str) -> int:
    """Bits per element of an HLO element type (f32, bf16, f8e4m3fn, f4e2m1fn, s4, pred, ...)."""
    if name == "pred":
        return 8
    if name.startswith("c"):  # complex: two floats
        return 2 * int(name[1:])
    digits = re.match(r"[a-z]+(\d+)", name)
    if digits is None:
        raise ValueError(f"unknown HLO element type {name!r}")
    return int(digits.group(1))


def array_bytes(dtype: str, dims: str) -> int:
    elements = math.prod(int(d) for d in dims.split(",") if d)
    return math.ceil(elements * dtype_bits(dtype) / 8)


def group_size(attributes: str, num_devices: int) -> int:
    """How many devices one group of a collective spans, from its replica_groups (any of XLA's three spellings:
    explicit lists, iota `[groups,size]<=[...]`, named mesh axes); no groups: all of them."""
    explicit = re.search(r"replica_groups=\{\{([\d,]*)\}", attributes)
    if explicit:
        return len([d for d in explicit.group(1).split(",") if d])
    iota = re.search(r"replica_groups=\[([\d,]+)\]<=", attributes)
    if iota:
        return int(iota.group(1).split(",")[-1])
    named = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attributes)
    if named:  # {'a','b'}, or a sub-axis 'a':(pre)size: `size` of the axis's devices
        sizes = {k: int(v) for k, v in re.findall(r"'?([\w.\-]+)'?=(\d+)", named.group(1))}
        n = 1
        for axis in filter(None, (a.strip() for a in named.group(2).split(","))):
            part = re.fullmatch(r"'?([\w.\-]+)'?(?::\((\d+)\)(\d+))?", axis)
            if part is None or part.group(1) not in sizes:
                raise ValueError(f"unrecognised device group {axis!r} in {named.group(0)!r}")
            n *= int(part.group(3)) if part.group(3) else sizes[part.group(1)]
        return n
    if re.search(r"replica_groups=(\{\}|,|$)", attributes) or "replica_groups" not in attributes:
        return num_devices
    raise ValueError(f"unrecognised replica_groups in {attributes[:200]!r}")


def sent_bytes(kind: str, result_bytes: int, n: int) -> float:
    """Bytes one device sends for one collective (the module docstring's table)."""
    if n <= 1:
        return 0.0
    if kind == "collective-permute":
        return float(result_bytes)
    if kind == "reduce-scatter":
        return float((n - 1) * result_bytes)
    share = (n - 1) / n * result_bytes
    return 2 * share if kind == "all-reduce" else share


@dataclasses.dataclass
class Volume:
    """Per kind: how many collectives run in a step and the bytes a device sends, in all and by dtype."""

    count: dict[str, int] = dataclasses.field(default_factory=dict)
    bytes: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)  # kind -> dtype -> bytes

    def add(self, other: Volume, times: int = 1) -> None:
        for kind, count in other.count.items():
            self.count[kind] = self.count.get(kind, 0) + times * count
        for kind, by_dtype in other.bytes.items():
            mine = self.bytes.setdefault(kind, {})
            for dtype, n in by_dtype.items():
                mine[dtype] = mine.get(dtype, 0.0) + times * n

    @property
    def total(self) -> float:
        return sum(sum(by_dtype.values()) for by_dtype in self.bytes.values())

    def as_dict(self) -> dict[str, dict]:
        """{"all-gather": {"bytes": N, "count": c, "by_dtype": {"bf16": N}}, ...}, kinds in KINDS order."""
        return {
            kind: {
                "bytes": round(sum(self.bytes[kind].values())),
                "count": self.count[kind],
                "by_dtype": {dtype: round(n) for dtype, n in sorted(self.bytes[kind].items())},
            }
            for kind in KINDS
            if kind in self.count
        }


def _collective(kind: str, shape: str, attributes: str, num_devices: int) -> Volume:
    arrays = _ARRAY.findall(shape)
    if kind.endswith("-start"):  # async form (GPU): the result tuple holds the operands before the outputs
        kind = kind.removesuffix("-start")
        arrays = [a for a in arrays if a[1]]  # drop the scalar contexts of a collective-permute
        if kind in ("all-gather", "collective-permute", "all-to-all"):
            arrays = arrays[len(arrays) // 2 :]
    n = 2 if kind == "collective-permute" else group_size(attributes, num_devices)
    volume = Volume(count={kind: 1}, bytes={kind: {}})
    for dtype, dims in arrays:
        sent = sent_bytes(kind, array_bytes(dtype, dims), n)
        volume.bytes[kind][dtype] = volume.bytes[kind].get(dtype, 0.0) + sent
    return volume


def _computations(hlo_text: str) -> tuple[dict[str, list[str]], str]:
    """The program's computations by name (their instruction lines) and the entry computation's name."""
    computations: dict[str, list[str]] = {}
    entry, current = "", None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = computations.setdefault(header.group(1), [])
            if line.startswith("ENTRY"):
                entry = header.group(1)
        elif current is not None and line.strip() == "}":
            current = None
        elif current is not None:
            current.append(line)
    if not entry:
        raise ValueError("no ENTRY computation in the program text")
    return computations, entry


def collective_volume(hlo_text: str, num_devices: int) -> Volume:
    """The collectives of one step of a compiled SPMD program (`compiled.as_text()`), counted as they run."""
    computations, entry = _computations(hlo_text)
    done: dict[str, Volume] = {}

    def volume_of(name: str) -> Volume:
        if name in done:
            return done[name]
        total = Volume()
        done[name] = total  # a cycle (none in HLO) would count nothing rather than recurse forever
        for line in computations.get(name, []):
            match = _INSTRUCTION.match(line)
            if match is None:
                continue
            shape, opcode, rest = match.groups()
            if opcode.endswith(("-done", "-update")):  # the end of an async op counted at its start
                continue
            if opcode.removesuffix("-start") in KINDS:
                total.add(_collective(opcode, shape, rest, num_devices))
            elif opcode == "while":
                trips = _TRIP_COUNT.search(rest)
                body = re.search(r"\bbody=%?([\w.\-]+)", rest)
                if body is not None:
                    total.add(volume_of(body.group(1)), int(trips.group(1)) if trips else 1)
            elif opcode == "conditional":
                branches = _BRANCHES.search(rest)
                if branches is not None:
                    names = branches.group(1).split(",") if branches.group(1) else branches.group(2, 3)
                    volumes = [volume_of(b.strip().lstrip("%")) for b in names]
                    total.add(max(volumes, key=lambda v: v.total))
            else:
                for callee in _CALLEES.findall(rest):
                    total.add(volume_of(callee))
        return total

    return volume_of(entry)
