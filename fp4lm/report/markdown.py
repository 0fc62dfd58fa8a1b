"""report.md: what was compared, the noise, the results table, the shared settings, the PNGs and the command."""

from __future__ import annotations

from typing import Any

from fp4lm.report.glossary import glossary
from fp4lm.report.plots import HEALTH_GUIDE, ROUTING_GUIDE, Plot
from fp4lm.report.results import TABLE_COLUMNS, TEXT_COLUMNS, format_cell
from fp4lm.report.routing import routing_markdown
from fp4lm.report.sweep import sweep_markdown


def settings_line(results: dict[str, Any]) -> str:
    """The settings every recipe shared, in one line (from the first record's resolved config)."""
    first = results["recipes"][results["order"][0]]
    config = first["config"]
    model, data, train = config["model"], config["data"], config["train"]
    total_tokens = first["tokens_per_step"] * train["steps"]
    seeds = sorted({s for entry in results["recipes"].values() for s in entry.get("seeds", [train["seed"]])})
    seed_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"
    experts = ""
    if model.get("num_experts"):  # a mixture of experts: its routed experts' shape
        experts = (
            f", {model['num_experts']} experts of width {model.get('moe_mlp_dim') or model['mlp_dim']}, "
            f"top-{model['experts_per_token']}"
        )
    return (
        f"model {model['num_layers']} layers x d_model {model['d_model']} (mlp {model['mlp_dim']}{experts}, "
        f"{model['num_heads']} heads / {model['num_kv_heads']} kv); {data['tokenizer']} tokenizer "
        f"(vocab {data['vocab_size']}), seq_len {data['seq_len']}, batch {train['batch_size']}; "
        f"{train['steps']} steps = {total_tokens:,} tokens; {seed_text}; data {data['path']}"
    )


def compared_line(results: dict[str, Any]) -> str:
    """What was compared, in one sentence: the recipes, their seeds, the preset, and the question asked."""
    entries = [results["recipes"][label] for label in results["order"]]
    seeded = [e for e in entries if not e.get("single_seed")]
    seeds = sorted({s for e in seeded for s in e.get("seeds", [])})
    singles = [e["display"] for e in entries if e.get("single_seed")]
    text = f"{len(entries)} precision recipes trained with identical settings"
    if len(seeds) > 1:
        text += f", each on seeds {', '.join(map(str, seeds))}"
    if singles:
        text += f" ({', '.join(singles)}: one seed only, as ablations)"
    if results.get("preset"):
        text += f", preset {results['preset']}"
    question = (
        "The question: how much higher (or lower) is each recipe's final validation loss than bf16's, "
        "and is the difference larger than run-to-run noise?"
        if results["baseline"]
        else "There is no plain bf16 run, so the recipes are compared with each other only."
    )
    return f"{text}. {question}"


def noise_paragraph(results: dict[str, Any]) -> str:
    """How large a gap must be to stand out from seed noise, in words."""
    noise = results.get("noise") or {}
    band, spread = noise.get("band"), noise.get("bf16_spread_pct")
    if not results["baseline"]:
        return "Without a bf16 run there is no gap and no noise estimate."
    if band is None:
        return (
            "Every recipe ran on one seed, so this comparison cannot measure its own noise: each gap is a single "
            "draw that another seed may move by as much as the gaps themselves, or flip in sign. Run "
            "`fp4lm compare --seeds N` for intervals."
        )
    text = (
        f"A gap from a single seed cannot be told from seed noise within ±{band['band_pct']:.2f}% (the 95% range "
        f"of one paired gap, estimated from the seed-to-seed spread of {', '.join(band['from'])}, "
        f"{band['dof']} degree{'s' if band['dof'] != 1 else ''} of freedom). A recipe run on several seeds "
        "has its own 95% interval (Student t "
        "over its paired per-seed gaps); 'within noise' means that interval contains 0."
    )
    if spread is not None:
        text += f" bf16's own final loss varies by {spread:.2f}% (standard deviation) from seed to seed."
    return text


def table_markdown(results: dict[str, Any]) -> str:
    header = "| " + " | ".join(title for _, title in TABLE_COLUMNS) + " |"
    rule = "|" + "|".join("---" if key in TEXT_COLUMNS else "---:" for key, _ in TABLE_COLUMNS) + "|"
    lines = [header, rule]
    for row in results["table"]:
        lines.append("| " + " | ".join(format_cell(key, row[key]) for key, _ in TABLE_COLUMNS) + " |")
    return "\n".join(lines)


def render_markdown(results: dict[str, Any], plots: list[Plot]) -> str:
    baseline = results["baseline"]
    gap_note = (
        f"Gap = (val loss - val loss of {baseline}) / val loss of {baseline} on the same seed, averaged over the "
        "seeds; positive = worse than bf16."
        if baseline
        else "No plain bf16 run in this comparison, so no gap column."
    )
    parts = [
        "# fp4lm compare",
        "",
        compared_line(results),
        "",
        f"Settings shared by every recipe: {settings_line(results)}.",
        "",
        "## Recipes",
        "",
        *[f"- **{name}**: {text}" for name, text in glossary(results)],
        "",
        "## Results",
        "",
        f"Noise: {noise_paragraph(results)}",
        "",
        table_markdown(results),
        "",
        *[f"**Warning:** {warning}.\n" for warning in results["warnings"]],
        gap_note + " Tokens/s is the steady-state training throughput (intervals with a compilation excluded).",
        "",
        *routing_markdown(results.get("routing")),
        *sweep_markdown(results.get("sweep")),
    ]
    headings = {"health": ("Quantization health", HEALTH_GUIDE), "routing": ("Expert routing", ROUTING_GUIDE)}
    said = set()
    for plot in plots:
        if plot.section in headings and plot.section not in said:
            heading, guide = headings[plot.section]
            parts += [f"## {heading}", "", guide, ""]
            said.add(plot.section)
        parts += [f"## {plot.title}", ""]
        if plot.note:
            parts += [plot.note, ""]
        parts += [f"![{plot.title}]({plot.file})", ""]
    parts += ["## Command", "", "```", results["command"], "```", ""]
    return "\n".join(parts)
