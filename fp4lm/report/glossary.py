"""The report's glossary: what each compared recipe changes, derived from fp4lm.quant.recipes (its one home).

A recipe is described by how it differs from `nvfp4` (the paper's recipe) operand by operand, e.g.
`nvfp4_no_rht`: "wgrad_g nvfp4 1x16 SR RHT -> nvfp4 1x16 SR, ...; in short: no random Hadamard transform".
A recipe entry's `@section.key=value` overrides are explained from the precision settings they set, and an
override that changed nothing (a setting written at its default) is said to be one.
"""

from __future__ import annotations

from typing import Any

NOTATION = (
    "Operands: fprop_x / fprop_w are the activations and weights of the forward GEMM; dgrad_g / dgrad_w the "
    "output gradient and weights of the input-gradient GEMM; wgrad_g / wgrad_x the output gradient and "
    "activations of the weight-gradient GEMM. 1x16 = a scale per 16 consecutive values, 16x16 = a scale per "
    "16x16 weight tile; RNE = round to nearest even, SR = stochastic rounding, RHT = random Hadamard "
    "transform applied before quantizing. Every recipe keeps attention's core, norms and the LM head in bf16."
)

# What one QuantSpec field change means, in words: (field, old value, new value) -> phrase.
_CHANGE_WORDS = {
    ("hadamard", True, False): "no random Hadamard transform",
    ("rounding", "stochastic", "nearest"): "round to nearest instead of stochastic rounding",
    ("block", (16, 16), (1, 16)): "1-D 1x16 weight blocks instead of 16x16 tiles",
}

OVERRIDE_WORDS = {
    "precision.bf16_after": "quantized layers switch to bf16 after this fraction of the steps (the dashed line)",
    "precision.bf16_last_layers": "this many of the last transformer blocks stay in bf16",
    "precision.bf16_first_layers": "this many of the first transformer blocks stay in bf16",
    "train.seed": "another seed (initialisation, data order and rounding keys)",
}


def _spec_text(spec) -> str:
    return "bf16" if spec is None else spec.describe()


def recipe_description(name: str) -> str:
    """What recipe `name` quantizes, as a difference from nvfp4 (or in full when it shares little with it)."""
    from fp4lm.quant.recipes import RECIPES, SLOTS

    recipe, reference = RECIPES[name], RECIPES["nvfp4"]
    if not recipe.is_quantized:
        return "no quantization: every GEMM in bf16 (the baseline)"
    mine, theirs = recipe.specs(), reference.specs()
    if name == "nvfp4":
        return "the paper's NVFP4 recipe: " + "; ".join(f"{slot} {_spec_text(mine[slot])}" for slot in SLOTS)
    changed = [slot for slot in SLOTS if mine[slot] != theirs[slot]]
    if any(getattr(mine[slot], "format", None) != "nvfp4" for slot in SLOTS):
        groups: dict[str, list[str]] = {}
        for slot in SLOTS:
            groups.setdefault(_spec_text(mine[slot]), []).append(slot)
        return "; ".join(f"{', '.join(slots)} {text}" for text, slots in groups.items())
    words = []
    for slot in changed:
        for field in ("hadamard", "rounding", "block"):
            key = (field, getattr(theirs[slot], field), getattr(mine[slot], field))
            if key[1] != key[2] and key in _CHANGE_WORDS and _CHANGE_WORDS[key] not in words:
                words.append(_CHANGE_WORDS[key])
    detail = "; ".join(f"{slot} {_spec_text(theirs[slot])} -> {_spec_text(mine[slot])}" for slot in changed)
    summary = f"in short: {', '.join(words)}" if words else ""
    return f"nvfp4 except {detail}" + (f"; {summary}" if summary else "")


def override_description(text: str, effective: bool) -> str:
    key, value = text.split("=", 1)
    meaning = OVERRIDE_WORDS.get(key, "a setting for this recipe only")
    if not effective:
        return f"{key}={value}: the value it had anyway, so it changed nothing"
    return f"{key}={value}: {meaning}"


def glossary(results: dict[str, Any]) -> list[tuple[str, str]]:
    """(display name, description) for every recipe compared, in report order."""
    rows, described = [], set()
    for label in results["order"]:
        entry = results["recipes"][label]
        effective = set(entry.get("effective_overrides", entry["overrides"]))
        recipe = entry["recipe"]
        parts = [f"{recipe} as above" if recipe in described else recipe_description(recipe)]
        described.add(recipe)
        parts += [override_description(text, text in effective) for text in entry["overrides"]]
        rows.append((entry["display"], "; ".join(parts)))
    return rows
