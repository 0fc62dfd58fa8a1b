import pathlib
import re
import tempfile

import matplotlib.image
import numpy as np
import pytest

from fp4lm.report.glossary import glossary
from fp4lm.report.html import render_html
from fp4lm.report.markdown import render_markdown
from fp4lm.report.plots import constant_metrics, heatmap_matrix, layer_sort_key, operand_title, operands_of, write_plots
from fp4lm.report.results import TABLE_COLUMNS, aggregate, format_cell
from tests.report.test_report_records import make_record

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """Results of a bf16 + nvfp4 comparison and its plots, drawn once for the module (matplotlib is slow)."""
    tmp_path = tmp_path_factory.mktemp("render")
    bf16 = make_record(tmp_path, "bf16", "bf16", offset=0.0, tokens_per_sec=2000.0)
    nvfp4 = make_record(tmp_path, "nvfp4", "nvfp4", offset=0.05, tokens_per_sec=1500.0, switch_at=32)
    results = aggregate([bf16, nvfp4], command="fp4lm compare --recipes bf16,nvfp4 --preset quick", preset="quick")
    out = tmp_path / "out"
    out.mkdir()
    return results, out, write_plots(results, out)


@pytest.fixture(scope="module")
def results(rendered):
    return rendered[0]


def assert_valid_png(path):
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert np.ptp(image[..., :3]) > 0  # not a blank canvas


def test_plots_are_valid_pngs(rendered):
    _, out, plots = rendered
    assert [p.file for p in plots] == ["loss.png", "gap.png", "quant_nvfp4.png", "throughput.png"]
    for plot in plots:
        assert_valid_png(out / plot.file)


def test_no_gap_plot_or_heatmap_without_bf16_and_telemetry(tmp_path):
    bf16 = make_record(tmp_path, "bf16", "bf16", offset=0.0)
    results = aggregate([bf16], command="c", preset=None)
    out = tmp_path / "out"
    out.mkdir()
    assert [p.file for p in write_plots(results, out)] == ["loss.png", "throughput.png"]


def test_heatmap_matrix_marks_missing_cells(results):
    layers, matrix = heatmap_matrix(results["recipes"]["nvfp4"]["quant_stats"], "fprop_x", "rel_err")
    assert matrix.shape == (len(layers), 4)
    row = layers.index("blocks.1.mlp.down")
    assert np.isnan(matrix[row, 0]) and np.allclose(matrix[row, 1:], 0.1)


def test_html_is_self_contained_and_has_the_table(rendered):
    results, out, plots = rendered
    page = render_html(results, plots, out)
    for row in results["table"]:
        for key, _ in TABLE_COLUMNS:
            assert f">{format_cell(key, row[key])}</td>" in page.replace("&#x27;", "'")
    assert page.count('src="data:image/png;base64,') == len(plots)
    assert not re.search(r'src="(?!data:)', page)  # nothing loaded from outside the file
    assert "fp4lm compare --recipes bf16,nvfp4 --preset quick" in page
    gap = results["recipes"]["nvfp4"]["final"]["gap_pct"]
    assert f"{gap:+.2f}" in page and gap > 0


def test_markdown_has_table_links_and_command(rendered):
    results, _, plots = rendered
    text = render_markdown(results, plots)
    nvfp4_row = next(line for line in text.splitlines() if line.startswith("| nvfp4 |"))
    final = results["recipes"]["nvfp4"]["final"]
    assert format_cell("val_loss", final["val_loss"]) in nvfp4_row
    assert format_cell("gap_pct", final["gap_pct"]) in nvfp4_row
    assert "1,500" in nvfp4_row
    for plot in plots:
        assert f"]({plot.file})" in text
    assert "fp4lm compare --recipes bf16,nvfp4 --preset quick" in text
    assert "2 layers x d_model 64" in text
    assert "Warning" not in text


def test_warnings_reach_both_reports(tmp_path, rendered):
    results, out, plots = rendered
    warned = {**results, "warnings": ["the runs used different tokenizers (x)"]}
    assert "**Warning:** the runs used different tokenizers (x)." in render_markdown(warned, plots)
    assert "<strong>Warning:</strong> the runs used different tokenizers (x).</p>" in render_html(warned, plots, out)


def test_heatmap_rows_follow_the_model():
    paths = [
        "blocks.10.attn.q",
        "blocks.2.mlp.up",
        "blocks.2.attn.o",
        "blocks.2.attn.k",
        "blocks.2.mlp.down",
        "blocks.2.attn.q",
        "blocks.2.mlp.gate",
        "blocks.2.attn.v",
    ]
    assert sorted(paths, key=layer_sort_key) == [
        "blocks.2.attn.q",
        "blocks.2.attn.k",
        "blocks.2.attn.v",
        "blocks.2.attn.o",
        "blocks.2.mlp.gate",
        "blocks.2.mlp.up",
        "blocks.2.mlp.down",
        "blocks.10.attn.q",
    ]


def test_html_reads_for_a_newcomer(rendered):
    """The structure a screenshot would show (no Chromium here; tools/screenshot_report.py takes one where
    there is): what was compared, the glossary, the noise, the plots, the health guide, then the appendix."""
    results, out, plots = rendered
    page = render_html(results, plots, out)
    headings = re.findall(r"<h([123])>(.*?)</h\1>", page)
    titles = [title for _, title in headings]
    assert titles[:3] == ["fp4lm compare: precision recipes trained side by side", "Recipes", "Results"]
    assert titles.index("Quantization health") < titles.index("Appendix") < titles.index("Command")
    assert titles.index("Appendix") < titles.index("Training throughput per recipe")
    assert "2 precision recipes trained with identical settings" in page
    glossary = page[page.index('<table class="glossary">') : page.index("</table>", page.index("glossary"))]
    assert "<td>bf16</td><td>no quantization" in glossary
    assert "<td>nvfp4</td><td>the paper&#x27;s NVFP4 recipe: fprop_x nvfp4 1x16 RNE" in glossary
    assert "RHT = random Hadamard transform" in page
    assert "<strong>Noise.</strong> Every recipe ran on one seed" in page  # one seed: no noise estimate
    assert "not FP4 hardware speed" in page and "What is normal" in page
    assert "white-space: pre-wrap" in page and "overflow-wrap: anywhere" in page


def test_glossary_names_what_an_ablation_changes_and_a_no_op_override(tmp_path):
    bf16 = make_record(tmp_path, "bf16", "bf16", offset=0.0)
    no_rht = make_record(tmp_path, "nvfp4_no_rht", "nvfp4_no_rht", offset=0.01)
    naive = make_record(tmp_path, "naive", "nvfp4_naive", offset=0.02, overrides=["precision.bf16_last_layers=0"])
    results = aggregate([bf16, no_rht, naive], command="c", preset=None)
    text = dict(glossary(results))
    assert text["nvfp4_no_rht"].endswith("in short: no random Hadamard transform")
    assert "wgrad_g nvfp4 1x16 SR RHT -> nvfp4 1x16 SR" in text["nvfp4_no_rht"]
    assert "precision.bf16_last_layers=0: the value it had anyway, so it changed nothing" in text["naive"]
    assert results["recipes"]["naive"]["short_display"] == "nvfp4_naive"  # plots leave the no-op out


def test_heatmaps_drop_constant_metrics_and_say_so(results):
    stats = results["recipes"]["nvfp4"]["quant_stats"]
    assert constant_metrics(stats) == {"saturated_frac": 0.0}  # synthetic_runs: nothing saturates
    health = next(plot for plot in write_plots(results, pathlib.Path(tempfile.mkdtemp())) if plot.section == "health")
    assert health.note == "Not drawn, constant in every layer and step: saturated values (fraction) (0 everywhere)."
    assert [operand_title(op) for op in operands_of(stats)] == [
        "weights (fprop_w)",
        "activations (fprop_x)",
        "gradients (wgrad_g)",
    ]


def test_a_moe_run_gets_a_routing_plot_and_expert_rows_in_its_heatmap(tmp_path):
    from fp4lm.report.plots import ROUTING_GUIDE

    bf16 = make_record(tmp_path, "bf16", "bf16", offset=0.0, moe=True)
    nvfp4 = make_record(tmp_path, "nvfp4", "nvfp4", offset=0.05, moe=True)
    results = aggregate([bf16, nvfp4], command="c", preset=None)
    out = tmp_path / "out"
    out.mkdir()
    plots = write_plots(results, out)
    files = [p.file for p in plots]
    assert files == [
        "loss.png",
        "gap.png",
        "quant_nvfp4.png",
        "routing_bf16.png",
        "routing_nvfp4.png",
        "throughput.png",
    ]
    for plot in plots:
        assert_valid_png(out / plot.file)
    routing = next(p for p in plots if p.file == "routing_nvfp4.png")
    assert routing.section == "routing"
    assert "dropped (token, expert) pairs (fraction) (0 throughout)" in routing.note  # dropless: not drawn
    assert "z-loss" in routing.note and "busiest" not in routing.note
    layers, _ = heatmap_matrix(results["recipes"]["nvfp4"]["quant_stats"], "fprop_x", "rel_err")
    assert layers[-4:] == [
        "blocks.1.mlp.down",
        "blocks.1.mlp.experts.down.0",
        "blocks.1.mlp.experts.down.2",
        "blocks.1.mlp.experts.down.10",
    ]
    markdown = render_markdown(results, plots)
    assert markdown.index("## Quantization health") < markdown.index("## Expert routing") < markdown.index("## Command")
    assert ROUTING_GUIDE in markdown and "](routing_nvfp4.png)" in markdown
    assert "8 experts" not in markdown  # the synthetic runs' config is dense (only their records are MoE)
    page = render_html(results, plots, out)
    assert "<h2>Expert routing</h2>" in page and page.count("<h3>Expert routing: ") == 2
