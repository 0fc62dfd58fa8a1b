"""What a user reads about the config: `keys_help()` for `fp4lm train --help`, and the one-line error text."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

from fp4lm.config.fields import help_of
from fp4lm.config.sections import Config, DataConfig
from fp4lm.errors import UserError


def _type_name(annotation: Any) -> str:
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) and type(None) in args:
        return " | ".join(_type_name(a) for a in args if a is not type(None)) + " | none"
    if typing.get_origin(annotation) is Literal:
        return "|".join(str(a) for a in args)
    if typing.get_origin(annotation) is tuple:
        return "list"
    return getattr(annotation, "__name__", str(annotation))


def _default_text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value) or "(empty)"
    return str(value)


def keys_help() -> str:
    """Every config section with its keys, defaults, types and help, read from the dataclasses (for `--help`)."""
    lines = []
    for section, section_cls in typing.get_type_hints(Config).items():
        hints = typing.get_type_hints(section_cls)
        rows = [
            (
                f"{section}.{field.name}",
                _default_text(field.default),
                f"({_type_name(hints[field.name])})",
                help_of(field),
            )
            for field in dataclasses.fields(section_cls)
        ]
        key_width, default_width, type_width = (max(len(row[column]) for row in rows) for column in range(3))
        lines.append(f"{section}:")
        lines += [
            f"  {key:<{key_width}}  {default:<{default_width}}  {kind:<{type_width}}  {text}".rstrip()
            for key, default, kind, text in rows
        ]
    return "\n".join(lines)


# How the parameters that library code names in `UserError.settings` are spelled as config keys.
_SETTING_KEYS = {
    **{f.name: f"data.{f.name}" for f in dataclasses.fields(DataConfig)},
    "run_dir": "train.run_dir",
    "batch_size": "train.batch_size",
    "seed": "train.seed",
}


def describe_error(error: UserError) -> str:
    """The one line a user sees for `error`: its message, then the config keys of the settings it names."""
    keys = [_SETTING_KEYS.get(name, name) for name in error.settings]
    return f"{error} ({', '.join(keys)})" if keys else str(error)
