"""`fp4lm compare`: train several precision recipes with identical settings and report them side by side.

    fp4lm compare [CONFIG.yaml] --recipes bf16,nvfp4,... [--preset quick|standard] [--out DIR]
                  [section.key=value ...]

Every recipe gets the same config (so the same seed, data order and hyperparameters); only
`precision.recipe`, the run directory and the entry's own `@section.key=value` overrides differ. Recipes
run one after another, each in its own `fp4lm train` subprocess with run directory DIR/runs/<label>.
When a run finishes its record is written to DIR/records/<label>.json; a later invocation reuses every
record it finds (no retraining) and resumes an interrupted run from its checkpoint. After each recipe the
report (results.json, PNGs, report.html, report.md) is rewritten from the records present, so a
comparison cut short still leaves a readable report of what finished; at the end the results table is printed.

Everything that can be checked before training is checked before anything is written: the recipes, the preset,
the overrides (each recipe's config as the trainer will check it, with its memory estimate and run
directory), the data path, the matplotlib extra, the reuse of existing records, and the --out directory
(which must not be an fp4lm training run).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shlex
import sys
from typing import Any, TextIO

from fp4lm.cli import Parser, split_config_and_overrides
from fp4lm.config import load_config, parse_override
from fp4lm.errors import EXIT_DIVERGED, EXIT_OK, EXIT_USER_ERROR, UserError
from fp4lm.jsonio import write_json_atomically, write_text_atomically
from fp4lm.report import presets, records, runner, specs
from fp4lm.report.html import render_html
from fp4lm.report.markdown import render_markdown, table_markdown
from fp4lm.report.plots import require_matplotlib, write_plots
from fp4lm.report.results import aggregate
from fp4lm.resources import data_file

# Settings that do not change what a run computes; a reused record may differ from the request in them.
_IRRELEVANT_FOR_REUSE = {
    ("train", "run_dir"),
    ("metrics", "progress"),
    ("metrics", "tensorboard"),
    ("checkpoint", "every"),
    ("checkpoint", "keep"),
    ("checkpoint", "enabled"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="fp4lm compare",
        description="Train several precision recipes with identical settings and compare them.",
        epilog="example: fp4lm compare --preset quick --recipes bf16,nvfp4,nvfp4@precision.bf16_after=0.8 "
        "--out runs/compare-quick",
    )
    parser.add_argument(
        "args",
        nargs="*",
        metavar="ARG",
        help="an optional CONFIG.yaml, then section.key=value overrides for every recipe",
    )
    parser.add_argument(
        "--recipes",
        required=True,
        help="comma list of recipes, each optionally with @section.key=value overrides, "
        "e.g. bf16,nvfp4,nvfp4@precision.bf16_after=0.8",
    )
    parser.add_argument(
        "--preset",
        help="run size preset: " + "; ".join(f"{name} ({presets.EXPECTED_DURATION[name]})" for name in presets.PRESETS),
    )
    parser.add_argument("--out", help="comparison directory, not a training run's (default: runs/compare-<preset>)")
    return parser


def split_positionals(args: list[str]) -> tuple[str | None, list[str]]:
    """The optional CONFIG.yaml and the section.key=value overrides, which must not set what compare sets."""
    config_path, overrides = split_config_and_overrides(args)
    for text in overrides:
        section, key, _ = parse_override(text)
        if f"{section}.{key}" in specs.RESERVED_KEYS:
            raise UserError(f"{section}.{key} is set by fp4lm compare for each recipe; remove it (use --recipes/--out)")
    return config_path, overrides


def _training_run_markers(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Files and directories that make a directory an fp4lm training run (named where the trainer writes them;
    imported here, not at module level, because fp4lm.train.checkpoint imports JAX)."""
    from fp4lm.train.checkpoint import checkpoint_dir
    from fp4lm.train.metrics import METRICS_FILE
    from fp4lm.train.run_dir import RUN_CONFIG_FILE, SUMMARY_FILE

    return [checkpoint_dir(out_dir), *(out_dir / name for name in (METRICS_FILE, SUMMARY_FILE, RUN_CONFIG_FILE))]


def check_out_dir_is_not_a_run(out_dir: pathlib.Path) -> None:
    """--out holds a comparison (records/, runs/, logs/, the report); a training run's directory is refused."""
    found = [path.name for path in _training_run_markers(out_dir) if path.exists()]
    if found:
        raise UserError(
            f"--out {out_dir} is an fp4lm training run (it has {', '.join(found)}); "
            "choose another --out for the comparison, e.g. runs/compare"
        )


def prepare_out_dir(out_dir: pathlib.Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise UserError(
            f"cannot write to --out {out_dir} ({error.strerror or error}); choose a writable directory"
        ) from None


def resolve_config(
    spec: specs.RecipeSpec, config_path: str | None, shared: list[str], run_dir: pathlib.Path
) -> tuple[list[str], dict[str, Any]]:
    """The trainer's override list for this recipe and the config it resolves to (validated now: for a recipe
    still to train, also its memory estimate and its run directory, as `fp4lm train` will check them)."""
    overrides = [*shared, *spec.overrides, f"precision.recipe={spec.recipe}", f"train.run_dir={run_dir}"]
    from fp4lm.train.run_dir import SUMMARY_FILE, inspect_run_dir
    from fp4lm.train.validate import check_config_for_training  # imports JAX: after the cheap checks

    try:
        config = load_config(config_path, overrides)
        check_config_for_training(config)
        if not (run_dir / SUMMARY_FILE).is_file():  # a finished run is recorded, not trained again
            _check_training_fits(config)
            inspect_run_dir(str(run_dir), overwrite=config.train.overwrite).check_accepted()
    except UserError as error:
        raise UserError(f"recipe {spec.entry!r}: {error}") from None
    if not data_file(config.data.path).exists():
        raise UserError(
            f"data.path={config.data.path} does not exist; fix data.path (or omit it for the bundled corpus)"
        )
    return overrides, config.to_dict()


def _check_training_fits(config) -> None:
    """fp4lm.train.memory's check, from this process, which only asks the device its size: it must not
    preallocate GPU memory that the training subprocesses need, so the allocator's preallocation is off while
    JAX starts here, and the caller's setting is back before any subprocess inherits the environment."""
    from fp4lm.train.memory import check_training_fits

    key = "XLA_PYTHON_CLIENT_PREALLOCATE"
    before = os.environ.get(key)
    os.environ[key] = "false"
    try:
        check_training_fits(config)
    finally:
        if before is None:
            del os.environ[key]
        else:
            os.environ[key] = before


def config_difference(recorded: dict[str, Any], requested: dict[str, Any]) -> str | None:
    """The first setting (other than run bookkeeping) in which a reused record differs from the request."""
    for section, values in requested.items():
        for key, value in values.items():
            if (section, key) in _IRRELEVANT_FOR_REUSE:
                continue
            old = recorded.get(section, {}).get(key)
            if old != value:
                return f"{section}.{key}: recorded {old!r}, requested {value!r}"
    return None


def reuse_record(path: pathlib.Path, spec: specs.RecipeSpec, config: dict[str, Any]) -> dict[str, Any] | None:
    record = records.read_record(path)
    if record is None:
        return None
    difference = config_difference(record["config"], config)
    if difference is not None:
        raise UserError(
            f"{path} was recorded with other settings ({difference}); use another --out, or delete that record "
            "and its run directory to retrain"
        )
    return record


def spec_fields(spec: specs.RecipeSpec) -> dict[str, Any]:
    return {
        "label": spec.label,
        "recipe": spec.recipe,
        "entry": spec.entry,
        "display": spec.display,
        "overrides": list(spec.overrides),
    }


def write_report(
    out_dir: pathlib.Path, finished: list[dict[str, Any]], command: str, preset: str | None, *, full: bool = True
) -> dict[str, Any]:
    """results.json, and when `full` also the PNGs, report.md and report.html; returns the results."""
    results = aggregate(finished, command=command, preset=preset)
    write_json_atomically(out_dir / "results.json", results)
    if not full:
        return results
    plots = write_plots(results, out_dir)
    write_text_atomically(out_dir / "report.md", render_markdown(results, plots))
    write_text_atomically(out_dir / "report.html", render_html(results, plots, out_dir))
    return results


def run_comparison(argv: list[str], echo: TextIO | None = None) -> int:
    """Everything `fp4lm compare` does; returns the exit code. User mistakes raise UserError."""
    stream: TextIO = echo if echo is not None else sys.stdout
    from fp4lm.train.run_dir import SUMMARY_FILE  # imports JAX, as resolve_config does

    parsed = build_parser().parse_intermixed_args(argv)
    config_path, user_overrides = split_positionals(parsed.args)
    shared = [*presets.preset_overrides(parsed.preset), *user_overrides]
    recipe_specs = specs.parse_recipes(parsed.recipes)
    specs.check_recipe_names(recipe_specs)
    require_matplotlib()  # before hours of training, not at the report
    out_dir = pathlib.Path(parsed.out or f"runs/compare-{parsed.preset or 'custom'}")
    check_out_dir_is_not_a_run(out_dir)
    resolved = {
        spec.label: resolve_config(spec, config_path, shared, out_dir / "runs" / spec.label) for spec in recipe_specs
    }
    reusable = {  # a record recorded with other settings is refused now, not after other recipes trained
        spec.label: reuse_record(records.record_path(out_dir, spec.label), spec, resolved[spec.label][1])
        for spec in recipe_specs
    }
    prepare_out_dir(out_dir)
    command = shlex.join(["fp4lm", "compare", *argv])

    finished: list[dict[str, Any]] = []
    for index, spec in enumerate(recipe_specs, start=1):
        overrides, config = resolved[spec.label]
        record_file = records.record_path(out_dir, spec.label)
        run_dir = out_dir / "runs" / spec.label
        record = reusable[spec.label]
        if record is not None:
            stream.write(f"[compare {index}/{len(recipe_specs)}] {spec.display}: reusing {record_file}\n")
        else:
            status, wall_s = "finished", None
            if not (run_dir / SUMMARY_FILE).is_file():
                if finished:  # results of what finished, in case this comparison is cut short
                    write_report(out_dir, finished, command, parsed.preset, full=False)
                stream.write(f"[compare {index}/{len(recipe_specs)}] {spec.display}: training in {run_dir}\n")
                stream.flush()
                outcome = runner.run_training(
                    runner.train_command(config_path, overrides), out_dir / "logs" / f"{spec.label}.log", stream
                )
                wall_s = outcome.wall_s
                if outcome.exit_code == EXIT_DIVERGED:
                    status = "diverged"
                elif outcome.exit_code == EXIT_USER_ERROR:
                    raise UserError(
                        f"training {spec.display} stopped on a user error (printed above); fix it and rerun"
                    )
                elif outcome.exit_code != EXIT_OK or not (run_dir / SUMMARY_FILE).is_file():
                    stream.write(
                        f"fp4lm compare: training {spec.display} failed (exit code {outcome.exit_code}); "
                        f"log in {out_dir / 'logs' / (spec.label + '.log')}; rerun the same command to resume\n"
                    )
                    return 1
            record = records.build_record(
                spec_fields=spec_fields(spec), config=config, run_dir=run_dir, status=status, train_wall_s=wall_s
            )
            write_json_atomically(record_file, record)
            stream.write(f"[compare {index}/{len(recipe_specs)}] {spec.display}: {status}, record {record_file}\n")
        finished.append(record)
    results = write_report(out_dir, finished, command, parsed.preset)
    stream.write(f"\n{table_markdown(results)}\n\n")
    stream.write(f"fp4lm compare: report in {out_dir / 'report.html'} and {out_dir / 'report.md'}\n")
    return 0


def main_compare(argv: list[str]) -> int:
    """Entry point for `fp4lm compare` (wired in fp4lm/cli.py). Raises UserError for bad input."""
    try:
        return run_comparison(argv)
    except SystemExit as exit_request:  # --help
        return int(exit_request.code or 0)
