"""report.html: one self-contained file (PNG plots embedded as base64 data URIs, inline CSS).

Written for a reader who has not seen the project: it opens with what was compared and a glossary of the
recipes, says how large a gap must be to stand out from seed noise and marks the gaps inside it, then the
plots; the quantization heatmaps follow with a guide to what is normal, and the throughput chart (which on
emulated FP4 says nothing about FP4 hardware) sits in an appendix. `tools/screenshot_report.py` renders the
page at 1400 px for a look.
"""

from __future__ import annotations

import base64
import html
import pathlib
from typing import Any

from fp4lm.report.glossary import NOTATION, glossary
from fp4lm.report.markdown import compared_line, noise_paragraph, settings_line
from fp4lm.report.plots import HEALTH_GUIDE, ROUTING_GUIDE, Plot
from fp4lm.report.results import TABLE_COLUMNS, TEXT_COLUMNS, format_cell
from fp4lm.report.routing import ROUTING_BY_SEED_NOTE, routing_table
from fp4lm.report.sweep import SWEEP_NOTE, sweep_table

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1400px; margin: 2em auto; padding: 0 1em; color: #222;
       line-height: 1.45; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; vertical-align: top; }
th { background: #f2f2f2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.noise td { color: #777; font-style: italic; }
table.glossary td:first-child { white-space: nowrap; font-weight: 600; }
img { max-width: 100%; border: 1px solid #eee; }
pre { background: #f6f6f6; padding: 0.7em; white-space: pre-wrap; overflow-wrap: anywhere; }
p.note { color: #555; font-size: 0.95em; }
"""

NOISE_VERDICTS = ("within noise", "1 seed: inside noise band")


def table_html(results: dict[str, Any]) -> str:
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title in TABLE_COLUMNS)
    rows = []
    for row in results["table"]:
        cells = []
        for key, _ in TABLE_COLUMNS:
            css = "" if key in TEXT_COLUMNS else ' class="num"'
            cells.append(f"<td{css}>{html.escape(format_cell(key, row[key]))}</td>")
        css = ' class="noise"' if row["verdict"] in NOISE_VERDICTS else ""
        rows.append(f"<tr{css}>" + "".join(cells) + "</tr>")
    return f'<table class="results">\n<tr>{head}</tr>\n' + "\n".join(rows) + "\n</table>"


def glossary_html(results: dict[str, Any]) -> str:
    rows = "\n".join(
        f"<tr><td>{html.escape(name)}</td><td>{html.escape(text)}</td></tr>" for name, text in glossary(results)
    )
    return (
        '<table class="glossary">\n<tr><th>recipe</th><th>what it changes</th></tr>\n'
        f'{rows}\n</table>\n<p class="note">{html.escape(NOTATION)}</p>'
    )


def embedded_image(path: pathlib.Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _plot_html(plot: Plot, out_dir: pathlib.Path) -> list[str]:
    parts = [
        f"<h3>{html.escape(plot.title)}</h3>"
        if plot.section in ("health", "routing")
        else f"<h2>{html.escape(plot.title)}</h2>"
    ]
    if plot.note:
        parts.append(f'<p class="note">{html.escape(plot.note)}</p>')
    parts.append(embedded_image(out_dir / plot.file, plot.title))
    return parts


def _section_with_table(title: str, note: str, header: list[str], rows: list[list[str]]) -> list[str]:
    """An <h2>, its note and a table of text cells."""
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return [
        f"<h2>{html.escape(title)}</h2>",
        f'<p class="note">{html.escape(note)}</p>',
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>",
    ]


def _routing_by_seed_html(comparison: dict[str, Any]) -> list[str]:
    header, rows, sentences = routing_table(comparison)
    section = _section_with_table("Routing by seed", ROUTING_BY_SEED_NOTE, header, rows)
    return [*section, *[f"<p>{html.escape(sentence)}</p>" for sentence in sentences]]


def _sweep_html(summary: dict[str, Any]) -> list[str]:
    return _section_with_table("Where each recipe diverges", SWEEP_NOTE, *sweep_table(summary))


def render_html(results: dict[str, Any], plots: list[Plot], out_dir: pathlib.Path) -> str:
    baseline = results["baseline"]
    gap_note = (
        f"Gap = (val loss &minus; val loss of {html.escape(baseline)}) / val loss of {html.escape(baseline)} on the "
        "same seed, averaged over the seeds; positive = worse than bf16. Greyed rows: the gap is inside the noise."
        if baseline
        else "No plain bf16 run in this comparison, so no gap column."
    )
    sections = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>fp4lm compare</title>',
        f"<style>{_STYLE}</style></head><body>",
        "<h1>fp4lm compare: precision recipes trained side by side</h1>",
        f"<p>{html.escape(compared_line(results))}</p>",
        f"<p>Settings shared by every recipe: {html.escape(settings_line(results))}.</p>",
        "<h2>Recipes</h2>",
        glossary_html(results),
        "<h2>Results</h2>",
        f"<p><strong>Noise.</strong> {html.escape(noise_paragraph(results))}</p>",
        *[f"<p><strong>Warning:</strong> {html.escape(warning)}.</p>" for warning in results["warnings"]],
        table_html(results),
        f"<p>{gap_note} Tokens/s is the steady-state training throughput (intervals with a compilation excluded; "
        "see the appendix).</p>",
    ]
    main = [plot for plot in plots if plot.section == "main"]
    health = [plot for plot in plots if plot.section == "health"]
    routing = [plot for plot in plots if plot.section == "routing"]
    appendix = [plot for plot in plots if plot.section == "appendix"]
    for plot in main:
        sections += _plot_html(plot, out_dir)
    if health:
        sections += ["<h2>Quantization health</h2>", f'<p class="note">{html.escape(HEALTH_GUIDE)}</p>']
        for plot in health:
            sections += _plot_html(plot, out_dir)
    if results.get("sweep"):
        sections += _sweep_html(results["sweep"])
    if results.get("routing"):
        sections += _routing_by_seed_html(results["routing"])
    if routing:
        sections += ["<h2>Expert routing</h2>", f'<p class="note">{html.escape(ROUTING_GUIDE)}</p>']
        for plot in routing:
            sections += _plot_html(plot, out_dir)
    if appendix:
        sections.append("<h2>Appendix</h2>")
        for plot in appendix:
            sections += _plot_html(plot, out_dir)
    sections += ["<h2>Command</h2>", f"<pre>{html.escape(results['command'])}</pre>", "</body></html>", ""]
    return "\n".join(sections)
