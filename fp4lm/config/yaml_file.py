"""Reading a YAML config file or override value: yaml's safe loader, refusing a key given twice, every failure
one line. Only true and false are booleans (as in YAML 1.2): yaml's 1.1 rule would read a user's `off`, `no`
or `on` as a boolean and the error would then name a value they never typed."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import yaml

from fp4lm.errors import UserError


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first_line: int, second_line: int):
        super().__init__(f"key {key!r} is given twice (lines {first_line} and {second_line})")
        self.key, self.first_line, self.second_line = key, first_line, second_line


class _ConfigLoader(yaml.SafeLoader):
    """yaml's safe loader that refuses a key given twice in one mapping (yaml itself keeps the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in first_lines:
                    raise _DuplicateKey(key, first_lines[key], line)
                first_lines[key] = line
            except TypeError:  # an unhashable key: yaml reports it itself
                pass
        return super().construct_mapping(node, deep=deep)


_BOOL = "tag:yaml.org,2002:bool"
_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def load_value(text: str, setting: str) -> Any:
    """The value of an override `setting=text` as YAML, with the config file's rules; "" stays ""."""
    try:
        return yaml.load(text, Loader=_ConfigLoader) if text else text
    except yaml.YAMLError as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(
            f"{setting}={text}: the value is not valid YAML ({reason}); fix it, or quote a string, e.g. "
            f"'{setting}=\"...\"'"
        ) from None


def load_yaml(path: str | pathlib.Path) -> dict[str, Any]:
    path = pathlib.Path(path)
    if not path.exists():
        raise UserError(f"config file {path} not found; pass an existing YAML file (see configs/)")
    if not path.is_file():  # a directory, FIFO or device: reading it could hang or never end
        raise UserError(f"config file {path} is not a regular file; pass a YAML file (see configs/)")
    try:
        tree = yaml.load(path.read_text(), Loader=_ConfigLoader)  # a SafeLoader subclass
    except _DuplicateKey as e:
        raise UserError(f"config file {path}: {e}; keep one of them") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"config file {path} is not valid YAML ({reason}); fix the syntax") from None
    return tree or {}
