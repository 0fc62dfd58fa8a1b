"""The comparison itself: plan the runs, check everything before the first write, train what has no record,
write the report after each run (see the package docstring)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
from typing import Any, TextIO

from fp4lm.compare import presets, records, runner, specs
from fp4lm.config import from_dict, load_config, parse_override
from fp4lm.errors import EXIT_DIVERGED, EXIT_OK, EXIT_USER_ERROR, UserError
from fp4lm.jsonio import write_json_atomically, write_text_atomically
from fp4lm.linear_layers import linear_layers
from fp4lm.report.html import render_html
from fp4lm.report.markdown import render_markdown, table_markdown
from fp4lm.report.plots import require_matplotlib, write_plots
from fp4lm.report.results import aggregate
from fp4lm.resources import data_file
from fp4lm.user_dirs import move_aside, refuse_holding

# Settings that do not change what a run computes; a reused record may differ from the request in them.
_IRRELEVANT_FOR_REUSE = {
    ("train", "run_dir"),
    ("metrics", "progress"),
    ("metrics", "tensorboard"),
    ("metrics", "peak_tflops"),  # only the denominator of the logged MFU
    ("checkpoint", "every"),
    ("checkpoint", "keep"),
    ("checkpoint", "enabled"),
}


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One training run of a comparison: a recipe entry on one seed (seed None: the config's train.seed)."""

    spec: specs.RecipeSpec  # with a sweep, the entry at its sweep point (`specs.at_point`)
    seed: int | None
    single_seed: bool
    swept: specs.RecipeSpec | None = None  # the entry as the user wrote it, when it is swept
    point: tuple[tuple[str, str], ...] = ()  # the swept ("section.key", value) pairs

    @property
    def label(self) -> str:
        return self.spec.label if self.seed is None else f"{self.spec.label}_seed-{self.seed}"

    @property
    def display(self) -> str:
        return self.spec.display if self.seed is None else f"{self.spec.display} (seed {self.seed})"


def parse_seeds(text: str | None) -> list[int] | None:
    """`--seeds`: N (seeds 0..N-1) or a comma list of distinct non-negative seeds; None without the flag."""
    if text is None:
        return None
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(part.isdigit() for part in parts):
        raise UserError(f"--seeds {text!r} is not a count or a list of seeds; write e.g. --seeds 5 or --seeds 0,1,2")
    if "," not in text:
        count = int(parts[0])
        if count < 1:
            raise UserError("--seeds 0 runs nothing; give a count of at least 1, e.g. --seeds 5")
        _check_seed_count(count)
        return list(range(count))
    seeds = [int(part) for part in parts]
    if len(set(seeds)) != len(seeds):
        raise UserError(f"--seeds {text!r} lists a seed twice; list each seed once")
    _check_seed_count(len(seeds))
    if max(seeds) > MAX_SEED:
        raise UserError(f"--seeds: seed {max(seeds)} is above {MAX_SEED} (train.seed's range); pick smaller seeds")
    return seeds


MAX_SEEDS = 100  # each seed is a whole training run of every recipe; 5 already resolves gaps of a few tenths of %
MAX_SEED = 2**31 - 1


def _check_seed_count(count: int) -> None:
    if count > MAX_SEEDS:
        raise UserError(
            f"--seeds {count:,} would train every recipe {count:,} times; at most {MAX_SEEDS} seeds "
            "(5 give a 95% interval of the gap), e.g. --seeds 5"
        )


def plan_runs(
    recipe_specs: list[specs.RecipeSpec],
    ablation_specs: list[specs.RecipeSpec],
    seeds: list[int] | None,
    sweeps: list[specs.Sweep] | None = None,
) -> list[PlannedRun]:
    """Every recipe at every sweep point on every seed (a recipe's points and seeds together), then each
    ablation at every point on the first seed."""
    for spec in [*recipe_specs, *ablation_specs]:
        if seeds is not None and any(text.startswith("train.seed=") for text in spec.overrides):
            raise UserError(f"--recipes entry {spec.entry!r} sets train.seed, which --seeds sets; remove one of them")
    points = specs.sweep_points(sweeps or [])

    def runs_of(spec: specs.RecipeSpec, run_seeds: list[int | None], single_seed: bool) -> list[PlannedRun]:
        swept = spec if sweeps else None
        return [
            PlannedRun(specs.at_point(spec, point), seed, single_seed, swept, point)
            for point in points
            for seed in run_seeds
        ]

    recipe_seeds: list[int | None] = [None] if seeds is None else list(seeds)
    ablation_seeds: list[int | None] = [None] if seeds is None else [seeds[0]]
    runs = [run for spec in recipe_specs for run in runs_of(spec, recipe_seeds, False)]
    runs += [run for spec in ablation_specs for run in runs_of(spec, ablation_seeds, seeds is not None)]
    labels = [run.label for run in runs]
    if len(set(labels)) != len(labels):
        twice = next(label for label in labels if labels.count(label) > 1)
        raise UserError(f"two runs of this comparison would both be {twice}; list each recipe and value once")
    return runs


def check_overrides(overrides: list[str], sweeps: list[specs.Sweep] | None = None) -> None:
    """The section.key=value overrides for every recipe must not set what compare (or its --sweep) sets."""
    swept = {sweep.key for sweep in sweeps or []}
    for text in overrides:
        section, key, _ = parse_override(text)
        if f"{section}.{key}" in specs.RESERVED_KEYS:
            raise UserError(f"{section}.{key} is set by fp4lm compare for each recipe; remove it (use --recipes/--out)")
        if f"{section}.{key}" in swept:
            raise UserError(f"{section}.{key} is set by --sweep for each run; remove the {section}.{key} override")


_WRITTEN_BY_COMPARE = {records.RECORDS_DIR, "runs", "logs", "results.json", "report.html", "report.md"}


def _is_comparison(out_dir: pathlib.Path, entries: list[str]) -> bool:
    """DIR/records/, or (a comparison begun before records/ was made first) runs/ beside nothing but what
    compare writes."""
    if (out_dir / records.RECORDS_DIR).is_dir():
        return True
    return (out_dir / "runs").is_dir() and all(name in _WRITTEN_BY_COMPARE or name.endswith(".png") for name in entries)


def check_out_dir(out_dir: pathlib.Path, *, force: bool) -> bool:
    """Whether --out must be moved aside (`force` on a directory that holds anything). Without `force`, a
    directory that holds anything but an fp4lm comparison (a training run, a user's files) is refused; with it,
    one that holds a training run (not a comparison's own) still is. A directory inside a training run is
    refused either way."""
    from fp4lm.train.run_dir import (  # imports JAX, as resolve_config does
        find_training_run,
        refuse_inside_training_run,
        training_run_markers,
    )

    try:
        entries = sorted(os.listdir(out_dir))
    except (FileNotFoundError, NotADirectoryError):
        entries = []
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir} is a file; name a directory for the comparison (it is created)")
    refuse_inside_training_run(out_dir, f"--out {out_dir}")
    if not entries:
        return False
    if force:
        refuse_holding(out_dir, f"--out {out_dir}", protected={})
        run = None if _is_comparison(out_dir, entries) else find_training_run(out_dir)
        if run is not None:
            raise UserError(
                f"--out {out_dir} holds the fp4lm training run {run}, which --force will not move aside; "
                "choose another --out"
            )
        return True
    fix = f"choose another --out, or pass --force, which moves its contents to {out_dir.name}.old-<date-time>/"
    found = training_run_markers(out_dir)
    if found:
        raise UserError(f"--out {out_dir} is an fp4lm training run (it has {', '.join(found)}); {fix}")
    if not _is_comparison(out_dir, entries):
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise UserError(f"--out {out_dir} holds files that are not an fp4lm comparison ({shown}); {fix}")
    return False


def prepare_out_dir(out_dir: pathlib.Path, *, move_old: bool, stream: TextIO) -> None:
    """Makes --out (moving the old one aside first when `move_old`) with its records/ directory."""
    try:
        if move_old:
            stream.write(f"fp4lm compare: moved the old contents of {out_dir} to {move_aside(out_dir)}\n")
        (out_dir / records.RECORDS_DIR).mkdir(parents=True, exist_ok=True)
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


def _check_started_with(run: PlannedRun, run_dir: pathlib.Path, config: dict[str, Any]) -> None:
    """A run of this comparison that was started before (interrupted, or finished but not yet recorded) must
    have been started with the requested settings: resumed under others, its steps so far would be trained
    with one setting and its record would name another (a result nobody could reproduce)."""
    from fp4lm.train.run_dir import started_run_config

    started = started_run_config(run_dir)
    difference = None if started is None else config_difference(started, config, was="started with")
    if difference is not None:
        raise UserError(
            f"recipe {run.spec.entry!r}: {run_dir} holds its run, started with other settings ({difference}); "
            "rerun with the settings it was started with, use another --out, or pass --force to start the "
            "comparison afresh"
        )


def experts_left_unquantized(planned: list[PlannedRun], resolved: dict[str, tuple[list[str], dict]]) -> list[str]:
    """One sentence per quantized recipe entry that quantizes none of a mixture-of-experts model's routed
    experts (`compare configs/moe.yaml --preset quick`: two blocks, the first dense, the last kept in bf16):
    such a comparison says nothing about FP4 experts, and should say so."""
    from fp4lm.quant import Policy  # imports JAX, as resolve_config does

    notes: dict[str, str] = {}
    for run in planned:
        config = from_dict(resolved[run.label][1])
        policy = Policy.from_config(config)
        layers = linear_layers(config.model)
        quantized = {layer.path: policy.recipe_for(layer.path).is_quantized for layer in layers}
        experts = [layer.path for layer in layers if layer.experts]
        if experts and any(quantized.values()) and not any(quantized[path] for path in experts):
            notes[run.spec.entry] = (
                f"recipe {run.spec.entry!r} quantizes none of this mixture-of-experts model's routed experts "
                f"(model.num_layers={config.model.num_layers}, model.first_dense_layers="
                f"{config.model.first_dense_layers}, precision.bf16_last_layers={config.precision.bf16_last_layers}"
                "), so this comparison does not compare expert quantization; give the model more MoE blocks "
                "(model.num_layers) or keep fewer in bf16"
            )
    return list(notes.values())


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


def config_difference(recorded: dict[str, Any], requested: dict[str, Any], *, was: str = "recorded") -> str | None:
    """The first setting (other than run bookkeeping) in which a reused record (or a started run: `was`)
    differs from the request.

    A setting the record does not have was added to fp4lm after the record was written: the record's run
    behaved as that setting's default does, so it matches a request that leaves it at its default."""
    defaults = load_config(None, []).to_dict()
    for section, values in requested.items():
        for key, value in values.items():
            if (section, key) in _IRRELEVANT_FOR_REUSE:
                continue
            if key not in recorded.get(section, {}) and value == defaults.get(section, {}).get(key):
                continue
            old = recorded.get(section, {}).get(key)
            if old != value:
                return f"{section}.{key}: {was} {old!r}, requested {value!r}"
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


def spec_fields(run: PlannedRun, config: dict[str, Any]) -> dict[str, Any]:
    """What a record says about the run it records: the recipe entry, its group (the recipe) and seed."""
    return {
        "label": run.label,
        "group": run.spec.label,
        "seed": int(config["train"]["seed"]),
        "single_seed": run.single_seed,
        "recipe": run.spec.recipe,
        "entry": run.spec.entry,
        "display": run.spec.display,
        "overrides": list(run.spec.overrides),
        **(
            {"sweep": dict(run.point), "sweep_group": run.swept.label, "sweep_display": run.swept.display}
            if run.swept is not None
            else {}
        ),
    }


def reuse_candidates(out_dir: pathlib.Path, reuse_dirs: list[str]) -> list[tuple[pathlib.Path, dict[str, Any]]]:
    """Every readable record in --out and the --reuse comparisons, to be matched on settings."""
    found = []
    for directory in [out_dir, *map(pathlib.Path, reuse_dirs)]:
        for path in sorted((directory / records.RECORDS_DIR).glob("*.json")):
            record = records.read_record(path)
            if record is not None:
                found.append((path, record))
    return found


def check_reuse_dirs(reuse_dirs: list[str]) -> None:
    for directory in reuse_dirs:
        if not (pathlib.Path(directory) / records.RECORDS_DIR).is_dir():
            raise UserError(f"--reuse {directory} has no records/ directory; name a comparison's --out directory")


def matching_record(
    candidates: list[tuple[pathlib.Path, dict[str, Any]]], run: PlannedRun, config: dict[str, Any]
) -> dict[str, Any] | None:
    """A copy of the first record with the run's exact settings, relabelled as this run, saying where it came from."""
    for path, record in candidates:
        if config_difference(record["config"], config) is None:
            return {**record, **spec_fields(run, config), "reused_from": str(path)}
    return None


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


def run_comparison(
    parsed: argparse.Namespace, config_path: str | None, user_overrides: list[str], *, command: str, echo=None
) -> int:
    """Everything `fp4lm compare` does (its arguments parsed by fp4lm.cli; `command` is the command line as
    typed, for the report); returns the exit code. User mistakes raise UserError."""
    stream: TextIO = echo if echo is not None else sys.stdout
    from fp4lm.train.run_dir import SUMMARY_FILE  # imports JAX, as resolve_config does

    sweeps = specs.parse_sweeps(getattr(parsed, "sweep", None) or [])
    check_overrides(user_overrides, sweeps)
    seeds = parse_seeds(parsed.seeds)
    if seeds is not None and any(text.startswith("train.seed=") for text in user_overrides):
        raise UserError("train.seed is set by --seeds for each run; remove the train.seed override")
    shared = [*presets.preset_overrides(parsed.preset), *user_overrides]
    recipe_specs = specs.parse_recipes(parsed.recipes)
    ablation_specs = specs.parse_recipes(parsed.ablations) if parsed.ablations.strip() else []
    specs.check_unique_labels([*recipe_specs, *ablation_specs])
    specs.check_recipe_names([*recipe_specs, *ablation_specs])
    planned = plan_runs(recipe_specs, ablation_specs, seeds, sweeps)
    check_reuse_dirs(parsed.reuse)
    require_matplotlib()  # before hours of training, not at the report
    out_dir = pathlib.Path(parsed.out or f"runs/compare-{parsed.preset or 'custom'}")
    move_old = check_out_dir(out_dir, force=parsed.force)
    resolved = {
        run.label: resolve_config(
            run.spec,
            config_path,
            [*shared, *([] if run.seed is None else [f"train.seed={run.seed}"])],
            out_dir / "runs" / run.label,
        )
        for run in planned
    }
    reusable = {  # a record recorded with other settings is refused now, not after other recipes trained
        run.label: reuse_record(records.record_path(out_dir, run.label), run.spec, resolved[run.label][1])
        for run in planned
    }
    candidates = reuse_candidates(out_dir, parsed.reuse)
    for run in planned:
        if reusable[run.label] is None:
            reusable[run.label] = matching_record(candidates, run, resolved[run.label][1])
        if reusable[run.label] is None:
            _check_started_with(run, out_dir / "runs" / run.label, resolved[run.label][1])
    notes = experts_left_unquantized(planned, resolved)
    for note in notes:
        stream.write(f"note: {note}\n")
    prepare_out_dir(out_dir, move_old=move_old, stream=stream)

    finished: list[dict[str, Any]] = []
    for index, run in enumerate(planned, start=1):
        overrides, config = resolved[run.label]
        record_file = records.record_path(out_dir, run.label)
        run_dir = out_dir / "runs" / run.label
        record = reusable[run.label]
        progress = f"[compare {index}/{len(planned)}] {run.display}"
        if record is not None and record.get("reused_from") and not record_file.is_file():
            write_json_atomically(record_file, record)
            stream.write(f"{progress}: reusing {record['reused_from']} (identical settings) as {record_file}\n")
        elif record is not None:
            stream.write(f"{progress}: reusing {record_file}\n")
        else:
            status, wall_s, load = "finished", None, None
            if not (run_dir / SUMMARY_FILE).is_file():
                if finished:  # results of what finished, in case this comparison is cut short
                    write_report(out_dir, finished, command, parsed.preset, full=False)
                stream.write(f"{progress}: training in {run_dir}\n")
                stream.flush()
                log = out_dir / "logs" / f"{run.label}.log"
                outcome = runner.run_training(runner.train_command(config_path, overrides), log, stream)
                wall_s, load = outcome.wall_s, (outcome.load_before, outcome.load_after)
                if outcome.exit_code == EXIT_DIVERGED:
                    status = "diverged"
                elif outcome.exit_code == EXIT_USER_ERROR:
                    raise UserError(f"training {run.display} stopped on a user error (printed above); fix it and rerun")
                elif outcome.exit_code != EXIT_OK or not (run_dir / SUMMARY_FILE).is_file():
                    stream.write(
                        f"fp4lm compare: training {run.display} failed (exit code {outcome.exit_code}); "
                        f"log in {log}; rerun the same command to resume\n"
                    )
                    return 1
            record = records.build_record(
                spec_fields=spec_fields(run, config),
                config=config,
                run_dir=run_dir,
                status=status,
                train_wall_s=wall_s,
                train_load=load,
            )
            write_json_atomically(record_file, record)
            stream.write(f"{progress}: {status}, record {record_file}\n")
        finished.append(record)
    results = write_report(out_dir, finished, command, parsed.preset)
    stream.write(f"\n{table_markdown(results)}\n\n")
    for warning in [*results["warnings"], *notes]:  # e.g. records reused from an fp4lm that split the data otherwise
        stream.write(f"warning: {warning}\n")
    stream.write(f"fp4lm compare: report in {out_dir / 'report.html'} and {out_dir / 'report.md'}\n")
    return 0
