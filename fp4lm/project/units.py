"""How the projection and the planner print their figures: each with the unit that shows it (12.3 us, not
"0.0 ms"; 1.50M tokens, not "0.00T"), three significant digits, so a small run reads as clearly as a large one."""

from __future__ import annotations


def _significant(value: float) -> str:
    """Three significant digits, without an exponent for the values the units below leave (0.001..999)."""
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _scaled(value: float, units: tuple[tuple[float, str], ...], space: str = " ") -> str:
    """`value` in the largest unit of `units` ((size, name), largest first) it reaches, else the smallest."""
    if value == 0:
        return f"0{space}{units[-1][1]}"
    for size, name in units:
        if abs(value) >= size:
            return f"{_significant(value / size)}{space}{name}"
    size, name = units[-1]
    return f"{value / size:.2g}{space}{name}"


def figure(value: float) -> str:
    """A plain figure (TFLOP/s, tokens/s per GPU) that stays readable small: 1,234, 45.6, 0.0012, 0."""
    if value == 0:
        return "0"
    return _significant(value) if value >= 1 else f"{value:.2g}"


def seconds(value: float) -> str:
    """A step or a transfer: 1.23 s, 45.6 ms, 7.89 us, 120 ns; none at all: 0 s."""
    if value == 0:
        return "0 s"
    return _scaled(value, ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")))


def duration(value: float) -> str:
    """A whole run's wall time: 27.2 days, 5.30 h, 12.0 min, 40.0 s."""
    if value >= 86400:
        return f"{_significant(value / 86400)} days"
    return _scaled(value, ((3600.0, "h"), (60.0, "min"), (1.0, "s"), (1e-3, "ms")))


def count(value: float) -> str:
    """Tokens, GPU-hours, tokens/s: 15.0T, 300B, 1.50M, 12.0k, 512 (no space: "15T tokens")."""
    if abs(value) < 1000:
        return figure(value)
    return _scaled(value, ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")), space="")


def dollars(value: float) -> str:
    """$26.6M, $450k, $12.3, $0.05."""
    return "$" + count(value)


def energy(watt_hours: float) -> str:
    """10,655 MWh, 3.20 MWh, 45.0 kWh, 12.0 Wh."""
    return _scaled(watt_hours, ((1e6, "MWh"), (1e3, "kWh"), (1.0, "Wh"), (1e-3, "mWh")))


def data_bytes(value: float) -> str:
    """Bytes in decimal units: 42.2 GB, 3.10 MB, 512 B."""
    return _scaled(value, ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1.0, "B")))


def binary_bytes(value: float) -> str:
    """Memory in binary units, as the trainer's memory estimate prints it: 6.63 TiB, 80.0 GiB."""
    return _scaled(value, ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B")))
