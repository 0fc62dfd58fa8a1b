"""Reading a config: defaults <- a YAML file of overrides <- `section.key=value` overrides, then validation.

Values are converted to each field's type here (a wrong type is a `UserError` naming the key); a path the
run reads (`data.path`) given in a YAML file is relative to that file's directory, one given on the command
line to the current directory, and the config holds it absolute (or as `bundled:<name>`, see fp4lm.resources).
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import types
import typing
from typing import Any, Literal

from fp4lm import resources
from fp4lm.config.combinations import validate
from fp4lm.config.sections import Config, DataSource, TokenizerKind
from fp4lm.config.yaml_file import load_value, load_yaml
from fp4lm.errors import UserError


def _coerce(key: str, raw: Any, annotation: Any) -> Any:
    """Converts a YAML/CLI value to the field's type, or raises a UserError naming the key."""
    args = typing.get_args(annotation)
    is_optional = isinstance(annotation, types.UnionType) and type(None) in args
    if is_optional:
        if raw is None or (isinstance(raw, str) and raw.lower() in ("none", "null", "")):
            return None
        annotation = next(a for a in args if a is not type(None))
    if typing.get_origin(annotation) is Literal:  # one of the declared choices: checked by validate()
        annotation = str
    if annotation == tuple[DataSource, ...]:
        return _coerce_sources(key, raw)
    if typing.get_origin(annotation) is tuple:
        if isinstance(raw, str):
            raw = [part for part in raw.split(",") if part]
        if not isinstance(raw, (list, tuple)):
            raise UserError(f"{key}: expected a list, got {raw!r}; write e.g. {key}=a,b")
        return tuple(str(v) for v in raw)
    if annotation is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "false", "1", "0", "yes", "no"):
            return raw.lower() in ("true", "1", "yes")
        raise UserError(f"{key}: expected true or false, got {raw!r}; write {key}=true or {key}=false")
    if annotation is int:
        if isinstance(raw, bool):
            raise UserError(f"{key}: expected an integer, got {raw!r}; write a whole number, e.g. {key}=8")
        if isinstance(raw, int):
            return raw
        if isinstance(raw, float) and raw.is_integer():
            return int(raw)
        if isinstance(raw, str):
            try:
                return int(raw.replace("_", ""))
            except ValueError:
                pass
        raise UserError(f"{key}: expected an integer, got {raw!r}; write a whole number, e.g. {key}=8")
    if annotation is float:
        expected_a_number = UserError(f"{key}: expected a number, got {raw!r}; write e.g. {key}=0.001")
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise expected_a_number
        try:
            value = float(raw)
        except ValueError:
            raise expected_a_number from None
        if not math.isfinite(value):
            raise UserError(f"{key}: expected a finite number, got {raw!r}; write e.g. {key}=0.001")
        return value
    if annotation is str:
        if isinstance(raw, (dict, list)):
            raise UserError(f"{key}: expected a string, got {raw!r}; write a single value, e.g. {key}=text")
        return str(raw)
    raise AssertionError(f"unhandled annotation {annotation} for {key}")


def _coerce_sources(key: str, raw: Any) -> tuple[DataSource, ...]:
    """A mixture: a list of {path, weight} mappings, or "PATH:WEIGHT,PATH:WEIGHT" (the weight defaults to 1)."""
    if isinstance(raw, str):
        raw = [part for part in raw.split(",") if part]
    if not isinstance(raw, (list, tuple)):
        raise UserError(f"{key}: expected a list of {{path, weight}}, got {raw!r}; write e.g. {key}=a.txt:3,b.txt:1")
    sources = []
    for entry in raw:
        if isinstance(entry, str):
            path, _, weight = entry.rpartition(":")
            try:
                entry = {"path": path, "weight": float(weight)} if path else {"path": entry}
            except ValueError:
                if not resources.is_bundled(entry) and not os.path.exists(entry):
                    raise UserError(
                        f"{key}: {entry!r} has the weight {weight!r}, which is not a number; write PATH:WEIGHT "
                        f"(e.g. {path}:3), or PATH:1 for a path that holds a colon"
                    ) from None
                entry = {"path": entry}
        if isinstance(entry, DataSource):
            entry = dataclasses.asdict(entry)
        if not isinstance(entry, dict) or set(entry) - {"path", "weight"} or not entry.get("path"):
            raise UserError(
                f"{key}: each source is {{path, weight}}, got {entry!r}; write e.g. {key}=a.txt:3,b.txt:1 "
                f"or in YAML `sources: [{{path: a.txt, weight: 3}}]`"
            )
        weight = _coerce(f"{key}[{len(sources)}].weight", entry.get("weight", 1.0), float)
        sources.append(DataSource(path=str(entry["path"]), weight=weight))
    return tuple(sources)


def _section_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _apply(config: Config, section: str, key: str, raw: Any) -> Config:
    sections = _section_types(Config)
    if section not in sections:
        raise UserError(f"unknown config section {section!r}; valid sections: {', '.join(sections)}")
    section_cls = sections[section]
    fields = _section_types(section_cls)
    if key not in fields:
        raise UserError(f"unknown config key {section}.{key}; valid keys in {section}: {', '.join(fields)}")
    value = _coerce(f"{section}.{key}", raw, fields[key])
    new_section = dataclasses.replace(getattr(config, section), **{key: value})
    return dataclasses.replace(config, **{section: new_section})


def from_dict(tree: dict[str, Any], base: Config | None = None, *, source: str = "config") -> Config:
    """Applies a nested {section: {key: value}} dict of overrides to `base` (default: the defaults)."""
    config = base or Config()
    if tree is None:
        return config
    if not isinstance(tree, dict):
        raise UserError(
            f"{source}: expected a mapping of sections (model:, data:, ...), got {type(tree).__name__}; "
            "write it as `section: {key: value}` lines, like configs/default.yaml"
        )
    for section, values in tree.items():
        if not isinstance(values, dict):
            raise UserError(
                f"{source}: section {section!r} must be a mapping of key: value; write e.g. `{section}: {{key: value}}`"
            )
        for key, raw in values.items():
            config = _apply(config, str(section), str(key), raw)
    return config


def parse_override(text: str) -> tuple[str, str, str]:
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise UserError(f"bad override {text!r}; write section.key=value, e.g. train.steps=100")
    dotted, value = text.split("=", 1)
    section, key = dotted.split(".", 1)
    return section.strip(), key.strip(), value.strip()


# Paths the run reads: relative to the config file that names them, or to the current directory on the command line.
_INPUT_PATHS = (
    ("data", "path"),
    ("data", "val_path"),
    ("data", "sources"),
    ("data", "tokenizer"),
    ("train", "init_from"),
)


def _absolute(value: str, base_dir: pathlib.Path) -> str:
    if not value or resources.is_bundled(value):
        return value
    return os.path.abspath(os.path.join(base_dir, os.path.expanduser(value)))


def _absolute_path(config: Config, section: str, key: str, base_dir: pathlib.Path) -> Config:
    value = getattr(getattr(config, section), key)
    if key == "sources":
        value = tuple(dataclasses.replace(s, path=_absolute(s.path, base_dir)) for s in value)
        return dataclasses.replace(config, data=dataclasses.replace(config.data, sources=value))
    if not value or resources.is_bundled(value):
        return config
    if (section, key) == ("data", "tokenizer") and value in typing.get_args(TokenizerKind):
        return config  # a keyword, not a path
    absolute = os.path.abspath(os.path.join(base_dir, os.path.expanduser(value)))
    return dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **{key: absolute})})


def load_config(
    path: str | pathlib.Path | None = None, overrides: list[str] | tuple[str, ...] = (), base: Config | None = None
) -> Config:
    """Defaults (or `base`) <- YAML file (optional) <- `section.key=value` overrides, then validation."""
    config = base or Config()
    if path is not None:
        config = from_dict(load_yaml(path), config, source=str(path))
        for section, key in _INPUT_PATHS:
            config = _absolute_path(config, section, key, pathlib.Path(path).parent)
    for text in overrides:
        section, key, value = parse_override(text)
        config = _apply(config, section, key, load_value(value, f"{section}.{key}"))
        if (section, key) in _INPUT_PATHS:
            config = _absolute_path(config, section, key, pathlib.Path.cwd())
    validate(config)
    return config
