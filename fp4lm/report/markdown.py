"""report.md: the results table, the shared settings, links to the PNGs and the exact command."""

from __future__ import annotations

from typing import Any

from fp4lm.report.plots import Plot
from fp4lm.report.results import TABLE_COLUMNS, format_cell


def settings_line(results: dict[str, Any]) -> str:
    """The settings every recipe shared, in one line (from the first record's resolved config)."""
    first = results["recipes"][results["order"][0]]
    config = first["config"]
    model, data, train = config["model"], config["data"], config["train"]
    total_tokens = first["tokens_per_step"] * train["steps"]
    return (
        f"model {model['num_layers']} layers x d_model {model['d_model']} (mlp {model['mlp_dim']}, "
        f"{model['num_heads']} heads / {model['num_kv_heads']} kv); {data['tokenizer']} tokenizer "
        f"(vocab {data['vocab_size']}), seq_len {data['seq_len']}, batch {train['batch_size']}; "
        f"{train['steps']} steps = {total_tokens:,} tokens; seed {train['seed']}; data {data['path']}"
    )


def table_markdown(results: dict[str, Any]) -> str:
    header = "| " + " | ".join(title for _, title in TABLE_COLUMNS) + " |"
    rule = "|" + "|".join("---" if key in ("display", "status") else "---:" for key, _ in TABLE_COLUMNS) + "|"
    lines = [header, rule]
    for row in results["table"]:
        lines.append("| " + " | ".join(format_cell(key, row[key]) for key, _ in TABLE_COLUMNS) + " |")
    return "\n".join(lines)


def render_markdown(results: dict[str, Any], plots: list[Plot]) -> str:
    baseline = results["baseline"]
    gap_note = (
        f"Gap = (val loss - val loss of {baseline}) / val loss of {baseline}; positive = worse than bf16."
        if baseline
        else "No plain bf16 run in this comparison, so no gap column."
    )
    parts = [
        "# fp4lm compare",
        "",
        f"Settings shared by every recipe: {settings_line(results)}.",
        "",
        table_markdown(results),
        "",
        *[f"**Warning:** {warning}.\n" for warning in results["warnings"]],
        gap_note + " Tokens/s is the steady-state training throughput (intervals with a compilation excluded).",
        "",
    ]
    for plot in plots:
        parts += [f"## {plot.title}", "", f"![{plot.title}]({plot.file})", ""]
    parts += ["## Command", "", "```", results["command"], "```", ""]
    return "\n".join(parts)
