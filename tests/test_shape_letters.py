"""Every array name in fp4lm spells its axes with the letters of the one table, fp4lm.shapes."""

from __future__ import annotations

import ast
import pathlib
import re

from fp4lm.shapes import SHAPE_LETTERS

ROOT = pathlib.Path(__file__).resolve().parents[1] / "fp4lm"
SHAPED_NAME = re.compile(r"^[a-z][a-z0-9_]*_([A-Z]+)$")


def shaped_names(source: str) -> set[str]:
    """Names (variables, arguments, attributes) that end in capital axis letters, like `x_BTD`."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
    return {name for name in names if SHAPED_NAME.match(name)}


def test_every_axis_letter_is_in_the_table():
    unknown = {}
    for path in sorted(ROOT.rglob("*.py")):
        for name in shaped_names(path.read_text(encoding="utf-8")):
            letters = set(SHAPED_NAME.match(name).group(1)) - set(SHAPE_LETTERS)
            if letters:
                unknown.setdefault(str(path.relative_to(ROOT.parent)), []).append(name)
    assert not unknown, f"axis letters not in fp4lm/shapes.py: {unknown}"


def test_a_name_with_an_unknown_letter_is_found():
    assert shaped_names("def f(x_BTQ, y):\n    z_ND = x_BTQ\n") == {"x_BTQ", "z_ND"}
