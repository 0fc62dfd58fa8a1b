"""report.html: one self-contained file (PNG plots embedded as base64 data URIs, inline CSS)."""

from __future__ import annotations

import base64
import html
import pathlib
from typing import Any

from fp4lm.report.markdown import settings_line
from fp4lm.report.plots import Plot
from fp4lm.report.results import TABLE_COLUMNS, format_cell

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.7em; }
th { background: #f2f2f2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; border: 1px solid #eee; }
pre { background: #f6f6f6; padding: 0.7em; overflow-x: auto; }
"""


def table_html(results: dict[str, Any]) -> str:
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title in TABLE_COLUMNS)
    rows = []
    for row in results["table"]:
        cells = []
        for key, _ in TABLE_COLUMNS:
            css = "" if key in ("display", "status") else ' class="num"'
            cells.append(f"<td{css}>{html.escape(format_cell(key, row[key]))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table>\n<tr>{head}</tr>\n" + "\n".join(rows) + "\n</table>"


def embedded_image(path: pathlib.Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def render_html(results: dict[str, Any], plots: list[Plot], out_dir: pathlib.Path) -> str:
    baseline = results["baseline"]
    gap_note = (
        f"Gap = (val loss &minus; val loss of {html.escape(baseline)}) / val loss of {html.escape(baseline)}; "
        "positive = worse than bf16."
        if baseline
        else "No plain bf16 run in this comparison, so no gap column."
    )
    sections = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>fp4lm compare</title>',
        f"<style>{_STYLE}</style></head><body>",
        "<h1>fp4lm compare</h1>",
        f"<p>Settings shared by every recipe: {html.escape(settings_line(results))}.</p>",
        *[f"<p><strong>Warning:</strong> {html.escape(warning)}.</p>" for warning in results["warnings"]],
        table_html(results),
        f"<p>{gap_note} Tokens/s is the steady-state training throughput (intervals with a compilation excluded).</p>",
    ]
    for plot in plots:
        sections.append(f"<h2>{html.escape(plot.title)}</h2>")
        sections.append(embedded_image(out_dir / plot.file, plot.title))
    sections += ["<h2>Command</h2>", f"<pre>{html.escape(results['command'])}</pre>", "</body></html>", ""]
    return "\n".join(sections)
