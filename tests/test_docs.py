"""The README is a front door and the guides in docs/ stay true to the repository; measured figures live in
BENCHMARKS.md only, so no guide, config or preset goes stale when the machine or the code gets faster."""

import re

import pytest

from tests.conftest import REPO

README = REPO / "README.md"
GUIDES = sorted((REPO / "docs").glob("*.md"))
CONFIGS = sorted((REPO / "configs").glob("*.yaml")) + sorted((REPO / "fp4lm" / "resources").glob("*.yaml"))
PRESETS = [REPO / "fp4lm" / "compare" / "presets.py"]
NUMBER = r"(?<![\w.])\d[\d,.]*"  # a number standing on its own: not the 8 of FP8 or the 16 of 1x16

# What a measurement reads like: a throughput, a duration, a load average, a speed-up, a peak, a test count.
MEASUREMENTS = {
    "throughput": NUMBER + r"\s*(?:k|M)?\s*(?:tok(?:en)?s?|samples|steps?)(?:/s\b|/sec| per second)",
    "FLOP rate": NUMBER + r"\s*[TPG]FLOP/?s\b",
    "duration": NUMBER + r"\s*(?:ms|µs|us|s|sec|secs|seconds?|min|mins|minutes?|hours?)(?![\w/])",
    "minutes and seconds": r"\b\d+m\d+(?:\.\d+)?s\b",
    "load average": r"\bload(?: averages?)? (?:of |at |was |from )?\d",
    "speed-up": NUMBER
    + r"x (?:faster|slower|longer|shorter|the time|its time|the speed|speed-?up|(?:its |the )?(?:bf16|fp8|dense|"
    r"per-expert loop)\b)",
    "measured on a machine": r"\bmeasured (?:on|at) (?:a |an |the |one |two )?(?:\d|idle|busy|shared|development|"
    r"machine|host|CPU|GPU|H\d00|B\d00|GB\d00)|\bon the (?:2|two)-core\b",
    "peak memory": r"\bpeaks? (?:at |of )?(?:about )?\d|" + NUMBER + r"\s*(?:GB|GiB|MB|MiB) (?:peak|resident)",
    "test count": NUMBER + r" (?:tests? )?passed\b",
}


def measurements_in(text: str) -> list[str]:
    """Every (kind, match) a text states that reads like a measurement."""
    found = []
    for line in text.splitlines():
        for kind, pattern in MEASUREMENTS.items():
            found += [f"{kind}: {m.group(0)!r} in {line.strip()[:100]!r}" for m in re.finditer(pattern, line)]
    return found


@pytest.mark.parametrize(
    "text",
    [
        "make run trains in 1m52s",
        "15,760 tokens/s on the CPU",
        "it took 7.1 minutes",
        "(load average 2.4 falling to 1.7)",
        "runs 1.13x the time of the loop",
        "nvfp4 is 1.3x slower than bf16",
        "Measured on the 2-core development machine",
        "one document peaks at about 360 MiB",
        "1,987 passed",
        "a step of 48 ms",
    ],
)
def test_the_measurement_patterns_catch_what_a_measurement_reads_like(text):
    assert measurements_in(text), text


@pytest.mark.parametrize(
    "text",
    [
        "NVFP4 weights in 16x16 tiles, activations in 1x16 blocks",
        "FP8 TFLOP/s/GPU from the published tables",
        "3 x 128 = 384, the dense default's mlp_dim, with 3x the MLP weights",
        "`distributed.timeout_s` seconds to wait",
        "loads the export; bf16 for the last 20% of training",
        "the validation loss fell 47% (3.29)",
        "tokens_per_sec and tflops_per_sec in metrics.jsonl",
    ],
)
def test_the_measurement_patterns_leave_plain_facts_alone(text):
    assert not measurements_in(text), measurements_in(text)


@pytest.mark.parametrize("path", [README, *GUIDES, *CONFIGS, *PRESETS], ids=lambda p: str(p.relative_to(REPO)))
def test_no_guide_config_or_preset_states_a_measurement(path):
    """Times, speeds, loads and peaks go to BENCHMARKS.md, with the machine and the date; the text links there."""
    assert measurements_in(path.read_text()) == [], "move these figures to BENCHMARKS.md and link to it"


def test_the_readme_is_a_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    for section in ("## The two commands", "## The library", "## The command line", "## Guides", "## Layout"):
        assert section in text
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)\)", text))
    assert linked == {p.name for p in GUIDES}, "every guide in docs/ is linked from the README, and no other"


@pytest.mark.parametrize("path", [README, *GUIDES], ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_points_at_a_file(path):
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text())
    missing = [t for t in targets if "://" not in t and not (path.parent / t).exists()]
    assert missing == []


@pytest.mark.parametrize("path", GUIDES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_guide_opens_with_its_title(path):
    assert path.read_text().startswith("# ")


@pytest.mark.parametrize("path", [README, *GUIDES], ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_a_document_names_exists(path):
    """A file or folder a guide points the reader to (fp4lm/..., tests/..., bench/..., configs/...) is there."""
    named = re.findall(r"\b(?:fp4lm|tests|bench|tools|configs|results)/[\w./-]*\w", path.read_text())
    assert [p for p in sorted(set(named)) if not (REPO / p).exists()] == []
