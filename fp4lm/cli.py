"""The `fp4lm` command: every parser, and dispatch; the work happens in the packages (train, inference,
export, compare, project and plan, data.prepare).

    fp4lm train   [CONFIG.yaml] [section.key=value ...] [--dry-run [--json]]
    fp4lm eval    RUN_DIR
    fp4lm sample  RUN_DIR --prompt TEXT [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]
    fp4lm project --model PRESET|CONFIG --gpu NAME [--seq N] [--batch N] [--recipes a,b] [--json]
                  [--gpus N --tp T --pp P --vp V --cp C --ep E --fsdp --gbs G --mbs M]
    fp4lm plan    --model PRESET|CONFIG --gpu NAME --gpus N [layout] --tokens 15T [--price P] [--sweep N,...]
    fp4lm compare [CONFIG.yaml] --recipes bf16,nvfp4,... [section.key=value ...]
    fp4lm prepare SOURCE... --tokenizer TOK --out DIR [--workers N] [...];  fp4lm prepare --verify DIR
    fp4lm export  RUN_DIR --format hf|nvfp4|nvfp4-ct --out DIR [--step N] [--dtype bfloat16|float32] [--force]
                  [--activations nvfp4 --calibration-batches N]

Exit codes (defined in fp4lm.errors): 0 done; 2 a user error (one line "error: <problem>; <fix>" on stderr,
no traceback, the settings it involves spelled as config keys); 3 training diverged; 130 interrupted (Ctrl-C);
143 terminated (SIGTERM; the run saved a checkpoint first).
Out of memory (MemoryError, XLA's RESOURCE_EXHAUSTED) is 2 even after the memory estimate passed: a config that
does not fit this device; 1 (a traceback) is an internal error.
Heavy imports (jax) happen inside the commands, so `--help` is instant.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from fp4lm.errors import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, EXIT_USER_ERROR, Terminated, TrainingDiverged, UserError
from fp4lm.project.command import add_layout_arguments, add_plan_arguments

# XLA's C++ log level: 2 keeps its warnings and info (the SPMD partitioner's "Involuntary full
# rematerialization" notes among them) out of the user's terminal; its errors still show.
XLA_LOG_LEVEL_VARIABLE, XLA_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL", "2"
XLA_LOG_HELP = (
    f"XLA's own warnings are hidden ({XLA_LOG_LEVEL_VARIABLE}={XLA_LOG_LEVEL}); "
    f"{XLA_LOG_LEVEL_VARIABLE}=0 fp4lm ... shows them"
)
MAX_SAMPLE_TOKENS = 100_000  # `fp4lm sample --max-tokens`: generating more is a job, not a sample

# Commands that write into a run directory; the others only read (an OSError there is a read error).
_WRITING_COMMANDS = ("train", "compare")


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage mistake as a UserError (one line, exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message}; see {self.prog} --help")


def split_config_and_overrides(args: list[str]) -> tuple[str | None, list[str]]:
    """The optional leading CONFIG.yaml, then section.key=value overrides (`fp4lm train` and `fp4lm compare`)."""
    config_path = None
    if args and "=" not in args[0]:
        config_path, args = args[0], args[1:]
    for arg in args:
        if "=" not in arg:
            raise UserError(
                f"unexpected argument {arg!r}; give at most one config file, first, then overrides that look like "
                "section.key=value, e.g. train.steps=100"
            )
    return config_path, list(args)


_INTERRUPTED_WITHOUT_CHECKPOINTS = (
    "interrupted; checkpoints are off (checkpoint.enabled=false), so start it again with `fp4lm train --force`, "
    "which moves these results aside"
)


# What Ctrl-C leaves, per command, unless the interrupted code said more (KeyboardInterrupt's message).
_INTERRUPTED = {
    "train": "interrupted; the run resumes from its latest checkpoint when started again",
    "compare": "interrupted; the finished runs keep their records: rerun the same command to resume the comparison",
    "export": "interrupted; nothing was written (an export is written complete or not at all)",
}


def _cmd_train(ns: argparse.Namespace) -> int:
    config_path, overrides = split_config_and_overrides(ns.args)
    if not ns.args:  # no arguments: the quick default run (the bundled default config, what `make run` trains)
        from fp4lm.resources import default_config

        config_path = str(default_config())
    if ns.force:
        overrides = [*overrides, "train.overwrite=true"]
    from fp4lm.train.run_dir import resolve_train_config  # an existing run's saved config is the base

    config = resolve_train_config(config_path, overrides)  # what the dry run compiles is what train trains
    if ns.dry_run:  # reads train.run_dir as train would, writes nothing
        from fp4lm.train.dry_run import dry_run
        from fp4lm.train.run_dir import check_run_dir_accepts

        check_run_dir_accepts(config)
        plan = None
        if ns.plan is not None:  # checked before compiling: a bad spec costs nothing
            from fp4lm.project.command import plan_for_dry_run

            plan = plan_for_dry_run(config, ns.plan)
        dry_run(config, as_json=ns.json, plan=plan)
        return 0
    if ns.plan is not None:
        raise UserError("--plan is the dry run's (fp4lm train CONFIG --dry-run --plan ...); add --dry-run")
    if ns.json:
        raise UserError("--json is the dry run's (fp4lm train CONFIG --dry-run --json); add --dry-run or drop --json")
    from fp4lm.train import train

    try:
        train(config)
    except KeyboardInterrupt:
        if config.checkpoint.enabled:
            raise
        raise KeyboardInterrupt(_INTERRUPTED_WITHOUT_CHECKPOINTS) from None
    return 0


def _cmd_eval(ns: argparse.Namespace) -> int:
    from fp4lm.inference.saved_run import check_eval_batches, evaluate_sources, load_run

    check_eval_batches(ns.batches)  # before loading, as sample checks its options
    run = load_run(ns.run_dir)
    note = lambda text: print(text, file=sys.stderr)  # noqa: E731
    val_loss, per_source = evaluate_sources(run, batches=ns.batches, log=note)  # a mixture: its mean, and each source
    sources = ", ".join(f"{name} {loss:.4f}" for name, loss in per_source.items())
    print(f"{ns.run_dir}: step {run.step} val_loss {val_loss:.4f}" + (f" ({sources})" if sources else ""))
    return 0


def _cmd_sample(ns: argparse.Namespace) -> int:
    from fp4lm.inference.sample import stream_sample
    from fp4lm.inference.saved_run import load_run
    from fp4lm.model.generate import check_sampling_options

    options = {"temperature": ns.temperature, "top_k": ns.top_k, "top_p": ns.top_p, "max_tokens": ns.max_tokens}
    check_sampling_options(**options)  # before loading
    if ns.max_tokens > MAX_SAMPLE_TOKENS:
        raise UserError(
            f"--max-tokens {ns.max_tokens:,} is more than {MAX_SAMPLE_TOKENS:,} (one forward pass each, past the "
            "context the model slides its window); pass e.g. --max-tokens 500"
        )
    run = load_run(ns.run_dir)

    def write(text: str) -> None:  # streamed: each piece as soon as its tokens are chosen
        sys.stdout.write(text)
        sys.stdout.flush()

    stream_sample(run, ns.prompt, seed=ns.seed, write=write, **options)
    write("\n")
    return 0


def _cmd_plan(ns: argparse.Namespace) -> int:
    from fp4lm.project.command import main_plan

    _check_overrides(ns.overrides)
    print(main_plan(vars(ns)))
    return 0


def _check_overrides(overrides: list[str]) -> None:
    for override in overrides:
        if "=" not in override:
            raise UserError(f"unexpected argument {override!r}; overrides look like section.key=value")


def _cmd_project(ns: argparse.Namespace) -> int:
    from fp4lm.project import run_project

    _check_overrides(ns.overrides)
    print(run_project(ns))
    return 0


def _cmd_export(ns: argparse.Namespace) -> int:
    from fp4lm.export import export_run

    export_run(
        ns.run_dir,
        fmt=ns.format,
        out=ns.out,
        step=ns.step,
        dtype=ns.dtype,
        force=ns.force,
        activations=ns.activations,
        calibration_batches=ns.calibration_batches,
    )
    return 0


def _cmd_prepare(ns: argparse.Namespace) -> int:
    from fp4lm.data.prepare import run_prepare_command

    return run_prepare_command(ns)


def _cmd_compare(argv: list[str]) -> int:
    try:
        parsed = build_compare_parser().parse_intermixed_args(argv)
    except SystemExit as exit_request:  # --help
        return int(exit_request.code or 0)
    config_path, overrides = split_config_and_overrides(parsed.args)
    from fp4lm.compare.comparison import run_comparison

    return run_comparison(parsed, config_path, overrides, command=shlex.join(["fp4lm", "compare", *argv]))


_TRAIN_DESCRIPTION = f"""\
Train a model, or resume the run in train.run_dir. With no arguments: the quick default run, the bundled
default config (what `make run` trains; a 0.9M-parameter Llama on the bundled Shakespeare). Otherwise the
code defaults below, then CONFIG.yaml (overrides, nested by section), then the section.key=value overrides.
A path the run reads (data.path) is relative to the config file that names it, or to the current directory
on the command line; data.path=bundled:shakespeare is the bundled corpus.
{XLA_LOG_HELP}."""


def _train_keys_help() -> str:
    from fp4lm.config import keys_help  # yaml and dataclasses only: --help stays instant

    return "config keys (section.key, code default, type):\n" + keys_help()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="fp4lm", description="Pretrain language models with NVFP4 mixed precision.", epilog=f"{XLA_LOG_HELP}."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    train = commands.add_parser("train", help="train (or resume) a model", add_help=False)
    train.set_defaults(handler=_cmd_train)

    evaluate = commands.add_parser("eval", help="validation loss of a run's latest checkpoint", prog="fp4lm eval")
    evaluate.add_argument("run_dir", metavar="RUN_DIR")
    evaluate.add_argument("--batches", type=int, default=None, help="validation batches (default: eval.batches)")
    evaluate.set_defaults(handler=_cmd_eval)

    sample = commands.add_parser("sample", help="generate text from a run's latest checkpoint", prog="fp4lm sample")
    sample.add_argument("run_dir", metavar="RUN_DIR")
    sample.add_argument("--prompt", required=True, help="text to continue")
    sample.add_argument("--max-tokens", type=int, default=100)
    sample.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    sample.add_argument("--top-k", type=int, default=40, help="0 = no top-k filter")
    sample.add_argument(
        "--top-p", type=float, default=1.0, help="nucleus sampling: 0.9 keeps 90%% of the mass; 1 = off"
    )
    sample.add_argument("--seed", type=int, default=0)
    sample.set_defaults(handler=_cmd_sample)

    project = commands.add_parser(
        "project", help="projected step time per precision recipe on a datacenter GPU", prog="fp4lm project"
    )
    project.add_argument("--model", required=True, help="preset name (configs/<name>.yaml) or a YAML path")
    project.add_argument("--gpu", required=True, help="e.g. h100, b200, gb200, gb300")
    project.add_argument("--seq", type=int, default=None, help="sequence length (default: data.seq_len)")
    project.add_argument(
        "--batch", type=int, default=None, help="sequences per GPU (default: project.batch_per_device)"
    )
    project.add_argument("--recipes", default=None, help="comma list, e.g. bf16,fp8,nvfp4")
    project.add_argument("--json", action="store_true", help="print JSON instead of a table")
    project.add_argument("overrides", nargs="*", metavar="section.key=value")
    add_layout_arguments(project)
    project.set_defaults(handler=_cmd_project)

    plan = commands.add_parser(
        "plan", help="a training run's days, GPU-hours, $ and MWh per recipe on a GPU cluster", prog="fp4lm plan"
    )
    plan.add_argument("--model", required=True, help="preset name (configs/<name>.yaml) or a YAML path")
    plan.add_argument("--gpu", required=True, help="e.g. h100, b200, gb200, gb300")
    plan.add_argument("--seq", type=int, default=None, help="sequence length (default: data.seq_len)")
    plan.add_argument("--recipes", default=None, help="comma list, e.g. bf16,fp8,nvfp4")
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plan.add_argument("overrides", nargs="*", metavar="section.key=value")
    add_plan_arguments(plan)
    add_layout_arguments(plan)
    plan.set_defaults(handler=_cmd_plan)

    export = commands.add_parser(
        "export",
        help="write a checkpoint for Hugging Face transformers, vLLM, TensorRT-LLM, SGLang",
        prog="fp4lm export",
        description="hf: bf16/f32 safetensors for transformers; nvfp4: the trained NVFP4 weights in ModelOpt's "
        "layout; nvfp4-ct: the same in compressed-tensors' nvfp4-pack-quantized format",
    )
    export.add_argument("run_dir", metavar="RUN_DIR")
    export.add_argument("--format", required=True, choices=("hf", "nvfp4", "nvfp4-ct"))
    export.add_argument("--out", required=True, help="output directory (new or empty)")
    export.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    export.add_argument("--dtype", default=None, help="hf only: bfloat16 or float32 (default bfloat16)")
    export.add_argument(
        "--force", action="store_true", help="replace a non-empty --out, moving its contents to OUT.old-<date-time>"
    )
    export.add_argument("--activations", default="none", help="nvfp4: W4A4, with calibrated input scales")
    export.add_argument(
        "--calibration-batches",
        type=int,
        default=None,
        help="with --activations nvfp4: validation batches to calibrate on",
    )
    export.set_defaults(handler=_cmd_export)

    prepare = commands.add_parser(
        "prepare",
        help="tokenize text sources once into memory-mapped token shards (data.path=DIR trains from them)",
        prog="fp4lm prepare",
        description="Tokenize SOURCEs (files, directories, globs; JSONL, .jsonl.gz/.zst, Parquet, text) once into "
        "DIR: token shards, a document index and manifest.json. Rerunning the same command resumes an interrupted "
        "prepare; `fp4lm prepare --verify DIR` re-hashes a prepared directory.",
    )
    prepare.add_argument(
        "sources", nargs="+", metavar="SOURCE", help="files, directories, globs or bundled:NAME (or DIR, with --verify)"
    )
    prepare.add_argument(
        "--tokenizer", help="byte, or the path of a tokenizer.json, its directory, or a SentencePiece .model"
    )
    prepare.add_argument("--out", help="output directory: new, empty, or an unfinished prepare of the same inputs")
    prepare.add_argument("--format", default="auto", choices=("auto", "jsonl", "parquet", "text"))
    prepare.add_argument("--text-field", default="text", help="JSONL field or Parquet column holding the text")
    prepare.add_argument(
        "--text-delimiter",
        default=None,
        help="text files: split documents at this string (default: a file is one document)",
    )
    prepare.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    prepare.add_argument(
        "--val-fraction",
        type=float,
        default=None,
        help="documents held out for validation (default: data.val_fraction's, so raw and prepared split alike)",
    )
    prepare.add_argument(
        "--tail-split", action="store_true", help="hold out the last --val-fraction of the tokens instead"
    )
    prepare.add_argument("--shard-tokens", type=int, default=None, help="tokens per shard at most (default 2**27)")
    prepare.add_argument(
        "--skip-bad-lines", action="store_true", help="skip (and count) JSONL lines that are not usable"
    )
    prepare.add_argument("--verify", action="store_true", help="re-hash the prepared shards against the manifest")
    prepare.add_argument("--progress", default="auto", choices=("auto", "rich", "plain", "off"))
    prepare.set_defaults(handler=_cmd_prepare)

    commands.add_parser(
        "compare",
        help="train several recipes with identical settings and report them",
        prog="fp4lm compare",
        add_help=False,
    )
    return parser


def build_train_parser() -> argparse.ArgumentParser:
    """`fp4lm train`'s own parser: its overrides may stand before or after the options (parse_intermixed_args),
    which a subcommand of the main parser cannot do."""
    train = Parser(
        prog="fp4lm train",
        description=_TRAIN_DESCRIPTION,
        epilog=_train_keys_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("args", nargs="*", metavar="[CONFIG.yaml] [section.key=value ...]")
    train.add_argument(
        "--force",
        action="store_true",
        help="start over in a train.run_dir that holds something (train.overwrite=true): its "
        "contents are moved to RUN_DIR.old-<date-time>/, never deleted",
    )
    train.add_argument(
        "--dry-run",
        action="store_true",
        help="compile one training step of the config train would run (an existing run's saved config, "
        "train.init_from's model) for the configured mesh without allocating anything, and print the memory per "
        "device, FLOPs per step, the bytes each device sends per step by collective, each parameter's sharding and "
        "each layer's precision; on a CPU, "
        "XLA_FLAGS=--xla_force_host_platform_device_count=N stands in for N devices",
    )
    train.add_argument(
        "--json",
        action="store_true",
        help='with --dry-run: print everything it finds as one JSON object (collectives under "collectives")',
    )
    train.add_argument(
        "--plan",
        default=None,
        metavar="gpu=G,gpus=N,tokens=T[,price=P,...]",
        help="with --dry-run: also plan a run of the config on a GPU cluster (days, GPU-hours, $, MWh per recipe; "
        "fp4lm plan's keys: price, pue, power, recipes, sweep, plot, tp, pp, vp, cp, ep, fsdp, gbs, mbs)",
    )
    train.set_defaults(handler=_cmd_train)
    return train


def build_compare_parser() -> argparse.ArgumentParser:
    """`fp4lm compare`'s own parser: its overrides may stand between the options (parse_intermixed_args),
    which a subcommand of the main parser cannot do."""
    from fp4lm.compare import presets  # the standard library only: --help stays instant

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
    parser.add_argument(
        "--force",
        action="store_true",
        help="start --out afresh, moving what it holds to OUT.old-<date-time> beside it (nothing is deleted)",
    )
    parser.add_argument(
        "--seeds",
        help="run every recipe with several values of train.seed: N for seeds 0..N-1, or a comma list (0,1,2); "
        "the report gives the mean and a 95%% interval of the gap to bf16 from the paired seeds",
    )
    parser.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=A,B,...",
        help="train every recipe (and seed) at every value of a config key, e.g. --sweep optimizer.lr=1e-3,1e-2,1e-1; "
        "give it twice for a grid of two keys; the report draws final validation loss against the value and marks "
        "runs that diverged",
    )
    parser.add_argument(
        "--ablations",
        default="",
        help="more recipes (same syntax as --recipes) that run on the first seed only, marked single seed",
    )
    parser.add_argument(
        "--reuse",
        action="append",
        default=[],
        metavar="DIR",
        help="another comparison directory whose records are reused where their settings are identical (repeatable)",
    )
    return parser


def run(argv: list[str]) -> int:
    if argv and argv[0] == "compare":  # its own parser (build_compare_parser)
        return _cmd_compare(argv[1:])
    if argv and argv[0] == "train":  # its own parser (build_train_parser)
        return _cmd_train(build_train_parser().parse_intermixed_args(argv[1:]))
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command is None:
        parser.print_help()
        return EXIT_USER_ERROR
    # One device, no distributed run to join first: check the platform now.
    if ns.command in ("eval", "sample", "export"):
        from fp4lm.sharding import all_devices

        all_devices()
    return ns.handler(ns)


def _describe_os_error(error: OSError, *, writing: bool) -> str:
    """One line for a failed file operation: a write (train, compare) or a read (eval, sample, project)."""
    if writing:
        from fp4lm.train.validate import describe_os_error

        return describe_os_error(error, "the run")
    where = f" {error.filename}" if error.filename else ""
    return f"cannot read{where}: {error.strerror or error}; check that the path exists and is readable"


def _quiet_xla_log() -> None:
    """Keeps XLA's C++ warnings out of the user's terminal (`XLA_LOG_LEVEL`), for this fp4lm process and the
    runs it starts: only when the user has not set the variable (theirs is kept), and only before JAX is imported,
    whose backend reads it once (a program that imported JAX and calls `main` keeps its own setting)."""
    if "jax" not in sys.modules:
        os.environ.setdefault(XLA_LOG_LEVEL_VARIABLE, XLA_LOG_LEVEL)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    _quiet_xla_log()
    try:
        code = run(argv)
        sys.stdout.flush()  # a closed stdout shows here, not in the interpreter's exit
    except BrokenPipeError:
        _silence_stdout()
        code = EXIT_BROKEN_PIPE
    except UserError as error:
        from fp4lm.config import describe_error

        print(f"error: {describe_error(error)}", file=sys.stderr)
        code = UserError.exit_code
    except TrainingDiverged as error:
        print(f"error: {error}", file=sys.stderr)
        code = TrainingDiverged.exit_code
    except KeyboardInterrupt as error:  # its message, if any, says what starting again does
        print(str(error) or _INTERRUPTED.get(argv[0] if argv else "", "interrupted"), file=sys.stderr)
        code = EXIT_INTERRUPTED
    except Terminated as error:  # SIGTERM: the run saved its step first
        print(str(error), file=sys.stderr)
        code = Terminated.exit_code
    except OSError as error:
        print(
            f"error: {_describe_os_error(error, writing=bool(argv) and argv[0] in _WRITING_COMMANDS)}", file=sys.stderr
        )
        code = UserError.exit_code
    except Exception as error:
        if not _is_out_of_memory(error):
            raise
        print(f"error: {_describe_out_of_memory(error, argv[0] if argv else '')}", file=sys.stderr)
        code = UserError.exit_code
    sys.exit(code)


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout without a file descriptor (captured in a test): nothing to flush
        pass


def _is_out_of_memory(error: BaseException) -> bool:
    """Python's MemoryError, or XLA's RESOURCE_EXHAUSTED (jax's XlaRuntimeError / JaxRuntimeError)."""
    if isinstance(error, MemoryError):
        return True
    return type(error).__name__ in ("XlaRuntimeError", "JaxRuntimeError") and "RESOURCE_EXHAUSTED" in str(error)


def _describe_out_of_memory(error: BaseException, command: str) -> str:
    """One line for an out-of-memory failure the estimate before compiling (fp4lm.train.memory) let through."""
    detail = str(error).strip().splitlines()[0][:200] if str(error).strip() else "MemoryError"
    if command in ("eval", "sample"):
        fix = "run it on a machine with as much memory as the one it was trained on"
    else:
        fix = (
            "reduce train.batch_size, data.seq_len or the model's size, set model.remat=full, "
            "or shard over more devices (mesh.fsdp)"
        )
    return f"out of memory ({detail}); the configuration does not fit this machine: {fix}"
