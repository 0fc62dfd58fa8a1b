"""The `--recipes` argument: a comma list of recipe names, each optionally with `@section.key=value` overrides.

    bf16,nvfp4,nvfp4@precision.bf16_after=0.8,nvfp4_naive@precision.bf16_last_layers=0@precision.bf16_first_layers=0

Each entry becomes a `RecipeSpec` with a label that is safe as a file name (`nvfp4_bf16_after-0.8`) and a
display name for tables and legends (`nvfp4 + bf16_after=0.8`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re

from fp4lm.config import Config, parse_override
from fp4lm.errors import UserError

# Set by `fp4lm compare` itself for every recipe; a user override of them would break the comparison.
RESERVED_KEYS = ("precision.recipe", "train.run_dir")

_UNSAFE_FILE_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


@dataclasses.dataclass(frozen=True)
class RecipeSpec:
    """One entry of `--recipes`: a registered recipe name plus config overrides for that run only."""

    entry: str  # the text the user wrote
    recipe: str
    overrides: tuple[str, ...]  # "section.key=value"
    label: str  # file-name safe, unique within one comparison
    display: str  # for tables and plot legends

    @property
    def is_baseline(self) -> bool:
        """The plain bf16 run that every other recipe's gap is measured against."""
        return self.recipe == "bf16" and not self.overrides


def sanitise(text: str) -> str:
    """Turns arbitrary text into a file-name safe token (letters, digits, '.', '_', '-')."""
    return _UNSAFE_FILE_CHARS.sub("_", text).strip("._-") or "run"


@functools.cache
def _shared_field_names() -> frozenset[str]:
    """Field names that more than one config section has (`enabled`, `every`, ...)."""
    config = Config()
    counts = collections.Counter(
        field.name
        for section in dataclasses.fields(config)
        for field in dataclasses.fields(getattr(config, section.name))
    )
    return frozenset(name for name, count in counts.items() if count > 1)


def short_key(section: str, key: str) -> str:
    """The key as labels and legends name it: alone (`bf16_after`) where no other section has a field of that
    name, else with its section (`loss_scale.enabled`, not an `enabled` that could be checkpoint's)."""
    return f"{section}.{key}" if key in _shared_field_names() else key


def parse_entry(entry: str) -> RecipeSpec:
    parts = [part.strip() for part in entry.split("@")]
    recipe, override_texts = parts[0], parts[1:]
    if not recipe:
        raise UserError(f"--recipes entry {entry!r} has no recipe name; write e.g. nvfp4@precision.bf16_after=0.8")
    label_parts, display_parts, overrides = [recipe], [], []
    for text in override_texts:
        section, key, value = parse_override(text)
        dotted = f"{section}.{key}"
        if dotted in RESERVED_KEYS:
            raise UserError(f"--recipes entry {entry!r} sets {dotted}, which compare sets itself; remove it")
        overrides.append(f"{dotted}={value}")
        name = short_key(section, key)
        label_parts.append(f"{name}-{value}")
        display_parts.append(f"{name}={value}")
    display = " + ".join([recipe, *display_parts]) if display_parts else recipe
    return RecipeSpec(
        entry=entry,
        recipe=recipe,
        overrides=tuple(overrides),
        label=sanitise("_".join(label_parts)),
        display=display,
    )


def parse_recipes(text: str) -> list[RecipeSpec]:
    """Parses the whole `--recipes` value; duplicate labels are an error (two runs would share a directory)."""
    entries = [entry.strip() for entry in text.split(",") if entry.strip()]
    if not entries:
        raise UserError("--recipes is empty; pass a comma list, e.g. --recipes bf16,nvfp4")
    specs = [parse_entry(entry) for entry in entries]
    check_unique_labels(specs)
    return specs


def check_unique_labels(specs: list[RecipeSpec]) -> None:
    """Two entries with one label would share a run directory and a record."""
    seen: dict[str, str] = {}
    for spec in specs:
        if spec.label in seen:
            raise UserError(
                f"--recipes entries {seen[spec.label]!r} and {spec.entry!r} name the same run ({spec.label}); "
                "list each recipe once"
            )
        seen[spec.label] = spec.entry


MAX_SWEEP_KEYS = 2
MAX_SWEEP_VALUES = 20


@dataclasses.dataclass(frozen=True)
class Sweep:
    """One `--sweep section.key=A,B,C`: every recipe runs at every value."""

    key: str  # "section.key"
    values: tuple[str, ...]


def parse_sweeps(texts: list[str]) -> list[Sweep]:
    """`--sweep` values (repeatable, one or two keys): each ``section.key=A,B,...`` with distinct values."""
    if len(texts) > MAX_SWEEP_KEYS:
        raise UserError(f"--sweep is given {len(texts)} times; sweep one or two keys (a grid of two at most)")
    sweeps = []
    for text in texts:
        section, key, value = parse_override(text)
        dotted = f"{section}.{key}"
        values = tuple(v.strip() for v in value.split(",") if v.strip())
        if dotted in (*RESERVED_KEYS, "train.seed"):
            fix = "use --seeds" if dotted == "train.seed" else "sweep another key"
            raise UserError(f"--sweep {dotted}: fp4lm compare sets this key itself; {fix}")
        if not values:
            raise UserError(f"--sweep {text!r} has no values; write e.g. --sweep optimizer.lr=1e-3,3e-3,1e-2")
        if len(set(values)) != len(values):
            raise UserError(f"--sweep {text!r} lists a value twice; list each once")
        if len(values) > MAX_SWEEP_VALUES:
            raise UserError(f"--sweep {dotted} has {len(values)} values; at most {MAX_SWEEP_VALUES} per key")
        if any(sweep.key == dotted for sweep in sweeps):
            raise UserError(f"--sweep {dotted} is given twice; give each key once, its values as a comma list")
        sweeps.append(Sweep(dotted, values))
    return sweeps


def sweep_points(sweeps: list[Sweep]) -> list[tuple[tuple[str, str], ...]]:
    """Every combination of the swept values, the first key varying slowest; [()] without a sweep."""
    points: list[tuple[tuple[str, str], ...]] = [()]
    for sweep in sweeps:
        points = [(*point, (sweep.key, value)) for point in points for value in sweep.values]
    return points


def at_point(spec: RecipeSpec, point: tuple[tuple[str, str], ...]) -> RecipeSpec:
    """The recipe entry with the sweep point's settings as its own overrides (so its label names the point)."""
    if not point:
        return spec
    for key, _ in point:
        if any(text.startswith(f"{key}=") for text in spec.overrides):
            raise UserError(f"--recipes entry {spec.entry!r} sets {key}, which --sweep sets; remove one of them")
    return parse_entry("@".join([spec.entry, *(f"{key}={value}" for key, value in point)]))


def check_recipe_names(specs: list[RecipeSpec]) -> None:
    """Unknown recipe names are a UserError listing the registered ones (from fp4lm.quant.recipes)."""
    from fp4lm.quant.recipes import get_recipe  # noqa: PLC0415  (heavy: jax)

    for spec in specs:
        get_recipe(spec.recipe)
