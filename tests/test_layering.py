"""The package's layering, read from its imports: no import circle, and every import points down.

LAYERS lists fp4lm's packages and top-level modules from the top (the command line) to the bottom (errors).
A module may import from its own package and from any lower layer, never from its layer or above; so a new
package must be given its place here, and an import that runs back up fails this test by name.
"""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "fp4lm"

LAYERS = [
    ["fp4lm.__main__"],
    ["fp4lm.cli"],  # every parser; dispatch only
    ["fp4lm.compare"],  # runs recipes side by side (records, seeds, reuse)
    ["fp4lm.report"],  # renders records: results, plots, HTML, Markdown
    ["fp4lm.export"],  # `fp4lm export`: a run's checkpoint out to other tools
    ["fp4lm.inference"],  # a saved run read back: eval, sample
    ["fp4lm.train"],  # the trainer
    ["fp4lm.project"],  # the step-time projection
    ["fp4lm.hf"],  # Hugging Face names, safetensors, tokenizer files, import and HF export
    ["fp4lm.model"],  # the Llama family, attention, decode, generation
    ["fp4lm.data"],  # sources, prepare, shards, mixtures, the pipeline
    ["fp4lm.tokenizer"],  # byte, BPE, Hugging Face and SentencePiece tokenizers; the model vocabulary
    ["fp4lm.quant"],  # recipes, the quantized dot_general, GEMM backends, the policy
    ["fp4lm.numerics"],  # the number formats: jax, numpy and ml_dtypes only
    ["fp4lm.flops"],
    ["fp4lm.linear_layers", "fp4lm.sharding"],
    ["fp4lm.config"],
    [
        "fp4lm.hardware",
        "fp4lm.host_load",
        "fp4lm.jsonio",
        "fp4lm.extras",
        "fp4lm.resources",
        "fp4lm.user_dirs",
        "fp4lm.file_lock",
        "fp4lm.sigterm",
        "fp4lm.shapes",
    ],
    ["fp4lm.errors"],
    ["fp4lm"],  # the package's own __init__
]
NUMERICS_MAY_IMPORT = {"jax", "numpy", "ml_dtypes", "__future__", "dataclasses", "functools", "math", "typing"}

# Imports that still run upward, each with the change that removes it. Empty is the goal.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _resolve(name: str) -> str:
    """The fp4lm module `name` is or lies in (`fp4lm.data.corpus.Corpus` -> `fp4lm.data.corpus`)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str) -> tuple[set[str], set[str]]:
    """(the fp4lm modules `module` imports, the top-level names of everything else it imports); imports in
    functions and under TYPE_CHECKING count too: they are dependencies all the same."""
    fp4lm_modules, others = set(), set()
    for node in ast.walk(ast.parse(MODULES[module].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "fp4lm":
                fp4lm_modules.add(_resolve(name))
            else:
                others.add(name.split(".")[0])
    fp4lm_modules.discard(module)
    return fp4lm_modules, others


GRAPH = {module: _imports(module)[0] for module in MODULES}


def _unit(module: str) -> tuple[int, str]:
    """(layer index, the LAYERS entry that holds `module`)."""
    for index, layer in enumerate(LAYERS):
        for unit in layer:
            if module == unit or module.startswith(unit + ".") and unit != "fp4lm":
                return index, unit
    raise KeyError(module)


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in GRAPH[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(GRAPH)))
    for module in GRAPH:
        if module not in index:
            visit(module)
    return found


def test_no_import_circles():
    assert _cycles() == []


def test_every_module_has_a_layer():
    unplaced = []
    for module in MODULES:
        try:
            _unit(module)
        except KeyError:
            unplaced.append(module)
    assert unplaced == [], "give these packages or modules their place in LAYERS"


def test_every_import_points_down():
    upward = []
    for module, targets in GRAPH.items():
        layer, unit = _unit(module)
        for target in targets:
            target_layer, target_unit = _unit(target)
            if target_unit != unit and target_layer <= layer and (module, target) not in KNOWN_UPWARD:
                upward.append(f"{module} -> {target}")
    assert sorted(upward) == []


def test_known_upward_imports_still_exist():
    """An entry of KNOWN_UPWARD that no longer happens must be removed, so the list only shrinks."""
    assert {(module, target) for module, target in KNOWN_UPWARD if target not in GRAPH[module]} == set()


def test_numerics_imports_nothing_beyond_jax_and_numpy():
    numerics = [module for module in MODULES if module.startswith("fp4lm.numerics")]
    beyond = {f"{module}: {name}" for module in numerics for name in _imports(module)[1] - NUMERICS_MAY_IMPORT}
    beyond |= {f"{module}: {name}" for module in numerics for name in GRAPH[module] if name not in numerics}
    assert sorted(beyond) == []


def test_the_check_sees_a_circle(monkeypatch):
    monkeypatch.setitem(GRAPH, "fp4lm.errors", GRAPH["fp4lm.errors"] | {"fp4lm.cli"})
    assert any({"fp4lm.errors", "fp4lm.cli"} <= set(cycle) for cycle in _cycles())


@pytest.mark.parametrize("broken", [("fp4lm.numerics.nvfp4", "fp4lm.quant.dot")])
def test_the_check_sees_an_upward_import(broken, monkeypatch):
    module, target = broken
    monkeypatch.setitem(GRAPH, module, GRAPH[module] | {target})
    with pytest.raises(AssertionError):
        test_every_import_points_down()
