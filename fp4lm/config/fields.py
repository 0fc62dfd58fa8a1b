"""A config key's rule and help text, declared with its field.

`setting(default, help, rule)` is a dataclass field whose metadata carries the key's help text (shown by
`fp4lm train --help`) and its rule: a callable `rule(key, value)` that raises a one-line `UserError` naming the
key and the fix. `check_fields` applies each field's rule, and the choices of a `Literal` type, to a section.
Rules that tie several keys together live in fp4lm.config.combinations.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable
from typing import Any, Literal

from fp4lm import resources
from fp4lm.errors import UserError

Rule = Callable[[str, Any], None]


def setting(default: Any, help: str = "", rule: Rule | None = None) -> Any:
    """A section field with its default, its help text and its rule (None: any value of the field's type)."""
    return dataclasses.field(default=default, metadata={"help": help, "rule": rule})


def help_of(field: dataclasses.Field) -> str:
    return field.metadata.get("help", "")


def check_fields(section: str, values: Any) -> None:
    """Every field of the section `values` (named `section` in messages) obeys its type's choices and its rule."""
    hints = typing.get_type_hints(type(values))
    for field in dataclasses.fields(values):
        key, value = f"{section}.{field.name}", getattr(values, field.name)
        if typing.get_origin(hints[field.name]) is Literal:
            check_choice(key, value, hints[field.name])
        rule = field.metadata.get("rule")
        if rule is not None:
            rule(key, value)


def check_field(section_cls: type, name: str, key: str, value: Any) -> None:
    """The rule of `section_cls`'s field `name` applied to `value`, spelled `key`: for a value built in code
    (a precision Policy's bf16 layer counts) that must obey the key it stands for."""
    rule = next(field for field in dataclasses.fields(section_cls) if field.name == name).metadata.get("rule")
    if rule is not None:
        rule(key, value)


def check_section_rules(section_cls: type, values: Any) -> None:
    """The rules of `section_cls`'s fields, applied to `values`: any object with those attributes, as library
    callers of fp4lm.data pass. Errors name the bare field and list it in `UserError.settings`, which
    `describe_error` spells as the config key."""
    for field in dataclasses.fields(section_cls):
        rule = field.metadata.get("rule")
        if rule is None or not hasattr(values, field.name):
            continue
        try:
            rule(field.name, getattr(values, field.name))
        except UserError as error:
            raise UserError(str(error), settings=(field.name,)) from None


def check_choice(key: str, value: Any, annotation: Any) -> None:
    """`value` must be one of the field's `Literal[...]` choices."""
    choices = typing.get_args(annotation)
    if value not in choices:
        raise UserError(f"{key}={value!r} is not one of: {', '.join(choices)}; pick one, e.g. {key}={choices[0]}")


def positive(key: str, value: Any) -> None:
    """A size, count or scale above zero (None, the key's "unset", passes)."""
    if value is not None and value <= 0:
        raise UserError(f"{key} must be positive, got {value}; set {key}=<a positive number>")


MAX_STEPS = 2**31 - 1  # the train state's step counter is an int32 (fp4lm.train.state)


def step_count(key: str, value: int) -> None:
    """A number of optimizer steps: positive, and within the train state's int32 step counter."""
    positive(key, value)
    if value > MAX_STEPS:
        raise UserError(
            f"{key}={value:,} is more than the step counter holds ({MAX_STEPS:,}, an int32); "
            f"set {key}=<at most {MAX_STEPS}>"
        )


@dataclasses.dataclass(frozen=True)
class InRange:
    """A number in [low, high] (an end marked open is excluded; None passes). `fix` ends the message."""

    low: float
    high: float = math.inf
    fix: str = ""
    low_open: bool = False
    high_open: bool = False

    def __call__(self, key: str, value: Any) -> None:
        if value is None:
            return
        above_low = value > self.low if self.low_open else value >= self.low
        below_high = value < self.high if self.high_open else value <= self.high
        if not (above_low and below_high):
            raise UserError(f"{key}={value} must be {self.describe()}; {self.fix or f'set {key} within it'}")

    def describe(self) -> str:
        if self.high == math.inf:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{self.low:g}, {self.high:g}{right}"


def device_count(key: str, value: int) -> None:
    """A mesh axis: a number of devices, or -1 for the devices the other axes leave."""
    if value == 0 or value < -1:
        raise UserError(f"{key}={value} must be a positive device count or -1 (the rest of the devices); fix {key}")


def not_blank(key: str, value: str) -> None:
    if not value.strip():
        raise UserError(f"{key} is empty; set {key}=byte, bpe, or the path of a tokenizer.json")


def known_bundled_corpus(key: str, value: str | None) -> None:
    """A `bundled:<name>` path names a corpus shipped in the package (other paths are read later)."""
    if value is not None and resources.is_bundled(value):
        resources.check_bundled_name(value)


def source_weights(key: str, sources: tuple[Any, ...]) -> None:
    """A mixture's weights are relative sampling rates: none negative, not all zero; bundled names exist."""
    for source in sources:
        if source.weight < 0:
            raise UserError(
                f"{key}: {source.path} has weight {source.weight:g}; weights must be >= 0 (0 leaves it out)"
            )
        known_bundled_corpus(key, source.path)
    if sources and not any(source.weight > 0 for source in sources):
        raise UserError(f"{key}: every weight is 0, so nothing can be sampled; give at least one a positive weight")


def split_precision_rule(rule: str) -> tuple[str, str]:
    """A precision rule "REGEX=RECIPE" as (regex, recipe); the recipe follows the last "="."""
    pattern, sep, recipe = rule.rpartition("=")
    if not sep:
        raise UserError(
            f"precision.rules entry {rule!r} has no recipe; write it as REGEX=RECIPE, e.g. 'blocks\\.0\\..*=bf16'"
        )
    return pattern, recipe


def precision_rules(key: str, rules: tuple[str, ...]) -> None:
    for rule in rules:
        split_precision_rule(rule)
