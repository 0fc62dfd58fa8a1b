"""Screenshot a comparison's report.html as a reader sees it: 1400 px wide, the whole page, in headless Chromium.

    python tools/screenshot_report.py results/standard/report.html [--out report.png] [--width 1400]

Uses whichever of these is present: the `playwright` package with its Chromium (`pip install playwright`,
then `python -m playwright install chromium`, which downloads the browser), or a Chromium / Chrome binary on
PATH (or named by $CHROMIUM), run as `--headless --screenshot`. Neither ships with fp4lm: on a machine
without them the script says so and exits 2. Look at the PNG: the table and glossary fit the width, the
command box wraps, plot labels are legible.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def with_playwright(page: pathlib.Path, out: pathlib.Path, width: int) -> bool:
    try:
        from playwright.sync_api import sync_playwright  # pyright: ignore[reportMissingImports]
    except ImportError:
        return False
    with sync_playwright() as driver:
        browser = driver.chromium.launch()
        tab = browser.new_page(viewport={"width": width, "height": 1000})
        tab.goto(page.resolve().as_uri())
        tab.screenshot(path=str(out), full_page=True)
        browser.close()
    return True


def with_binary(page: pathlib.Path, out: pathlib.Path, width: int, height: int) -> bool:
    binary = os.environ.get("CHROMIUM") or next((b for b in BINARIES if shutil.which(b)), None)
    if binary is None:
        return False
    command = [
        binary,
        "--headless",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
        f"--screenshot={out.resolve()}",
        *(["--no-sandbox"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),  # Chromium refuses root else
        page.resolve().as_uri(),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=pathlib.Path, help="a report.html")
    parser.add_argument("--out", type=pathlib.Path, help="the PNG (default: next to the report, report-1400px.png)")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument(
        "--height", type=int, default=12000, help="page height for a Chromium binary (no full-page mode)"
    )
    args = parser.parse_args(argv)
    if not args.report.is_file():
        print(f"error: {args.report} does not exist; give a comparison's report.html", file=sys.stderr)
        return 2
    out = args.out or args.report.with_name(f"report-{args.width}px.png")
    if with_playwright(args.report, out, args.width) or with_binary(args.report, out, args.width, args.height):
        print(f"screenshot: {out}")
        return 0
    print(
        "error: no headless Chromium here; pip install playwright and run `python -m playwright install "
        "chromium`, or put a Chromium binary on PATH (or in $CHROMIUM)",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
