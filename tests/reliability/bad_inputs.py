"""The catalogue of bad inputs: files a new user might point fp4lm at, and the command lines they might type.

Each case is (id, argv, words the one-line answer must contain). `{name}` in an argument is replaced by the
path of the fixture file or directory `name` (see `make_bad_files`); `TRAIN` expands to `train` plus a valid
tiny configuration whose run directory is an existing run that training accepts (`{restartable_run}`), so a
case proves that its mistake is caught before anything in that run is touched. (`{existing_run}` holds results
without a checkpoint: training refuses it, before building the data.)
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from fp4lm.config.tiny import TINY_DATA, TINY_MODEL
from tests.reliability.helpers_reliability import write_corpus


def make_bad_files(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Writes every fixture once; returns name -> path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    files = {"corpus": write_corpus(root / "corpus.txt")}

    def put(key: str, name: str, content: bytes | str) -> None:
        files[key] = root / name
        files[key].write_bytes(content.encode() if isinstance(content, str) else content)

    put("empty", "empty.txt", b"")
    put("binary", "binary.txt", bytes(range(256)) * 40)
    put("latin1", "latin1.txt", ("caf\xe9 cr\xe8me br\xfbl\xe9e " * 400).encode("latin-1"))
    put("short", "short.txt", "To be, or not to be.\n")
    put("nofield", "nofield.jsonl", "".join(json.dumps({"body": f"line {i} of text"}) + "\n" for i in range(200)))
    put("brokenjson", "brokenjson.jsonl", '{"text": "fine"}\n{"text": "unterminated\n')
    put("corrupt", "corrupt.parquet", b"PAR1" + bytes(range(200)) * 3 + b"PAR1")
    put("raw", "raw.bin", np.arange(5000, dtype=np.uint16).tobytes())
    put("bad_yaml", "bad.yaml", "model:\n  d_model: [32, 64\n")
    put("listing", "listing.yaml", "- model\n- data\n")
    put("scalar_section", "scalar_section.yaml", "model: 5\n")
    put("duplicate_key", "duplicate_key.yaml", "model:\n  d_model: 64\n  d_model: 32\n")  # a key given twice
    put(
        "duplicate_section",
        "duplicate_section.yaml",
        "model: {d_model: 64}\ndata: {seq_len: 32}\nmodel: {num_layers: 2}\n",
    )
    np.save(root / "floats.npy", np.linspace(0, 1, 5000, dtype=np.float32))
    files["floats"] = root / "floats.npy"
    np.save(root / "bigids.npy", np.full(5000, 300, np.int32))
    files["bigids"] = root / "bigids.npy"
    pq.write_table(pa.table({"body": ["some words"] * 500}), root / "nocolumn.parquet")
    files["nocolumn"] = root / "nocolumn.parquet"
    pq.write_table(pa.table({"text": list(range(500))}), root / "intcolumn.parquet")
    files["intcolumn"] = root / "intcolumn.parquet"
    (root / "emptydir").mkdir(exist_ok=True)
    files["emptydir"] = root / "emptydir"
    files["missing"] = root / "no_such_file.txt"
    files["prepared_truncated"] = _prepared_with_damage(root / "prepared_truncated", truncate=True)
    files["prepared_edited"] = _prepared_with_damage(root / "prepared_edited", truncate=False)
    files["prepared"] = _prepared_bytes(root / "prepared", documents=40)  # made with the byte tokenizer (257 ids)
    files["prepared_small"] = _prepared_bytes(root / "prepared_small", documents=1)
    files["missing_yaml"] = root / "no_such_config.yaml"
    files["hf_mistral"] = _hf_checkpoint(root / "hf_mistral", architectures=["MistralForCausalLM"])
    files["hf_missing_shard"] = _hf_checkpoint(root / "hf_missing_shard")
    files["hf_wide"] = _hf_checkpoint(root / "hf_wide", hidden_size=64)
    files.update(make_damaged_checkpoint_files(root))  # train/export/compare (defined with its cases below)
    put("settings_json", "settings.json", json.dumps({"lr": 0.1}))  # JSON, but not a tokenizer
    put("cut_model", "cut.model", b"\n\x0e\n\x05<unk>")  # the first bytes of a SentencePiece model, cut off
    files["tokenizer_300"] = _tokenizer_json(root / "tokenizer300")  # a 300-token tokenizer.json
    files["users_dir"] = root / "users_dir"  # a user's own files, which no --out may replace
    files["users_dir"].mkdir(exist_ok=True)
    (files["users_dir"] / "report.html").write_text("<p>my own report</p>\n")
    files.update(_damaged_data_files(root))
    return files


def _tokenizer_json(directory: pathlib.Path) -> pathlib.Path:
    """A byte-level BPE tokenizer.json with 300 tokens (<|endoftext|> included), trained on the test corpus."""
    from fp4lm.tokenizer import BPETokenizer

    BPETokenizer.train(write_corpus(directory.with_suffix(".txt")).read_text(), 300).save(directory)
    return directory / "tokenizer.json"


def _hf_checkpoint(directory: pathlib.Path, **changes) -> pathlib.Path:
    """A Hugging Face Llama directory (config.json, tokenizer.json, an index) whose one shard is missing."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 256,
        **changes,
    }
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "tokenizer.json").write_text("{}")
    index = {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


def _prepared_with_damage(directory: pathlib.Path, *, truncate: bool) -> pathlib.Path:
    """A prepared corpus (fp4lm prepare's format) whose first train shard lost its last token, or had one changed."""
    from tests.data.helpers_data import write_prepared_corpus

    documents = [[np.arange(2, 40), np.array([7, 8, 9])], [np.arange(50, 90)]]
    tokenizer = {"fingerprint": "0" * 64, "name": "test", "vocab_size": 256, "eos_id": None, "bos_id": None}
    write_prepared_corpus(directory, {"train": documents}, tokenizer=tokenizer)
    shard = directory / "train-00000.npy"
    data = shard.read_bytes()
    shard.write_bytes(data[:-2] if truncate else data[:-1] + bytes([data[-1] ^ 1]))
    return directory


def _prepared_bytes(directory: pathlib.Path, *, documents: int, token: int = 100) -> pathlib.Path:
    """A sound prepared corpus of `documents` byte-tokenizer documents of 20 tokens (end-of-text included);
    `token`: the last document's fourth token (one beyond the vocabulary makes it unsound)."""
    from fp4lm.tokenizer import ByteTokenizer
    from tests.data.helpers_data import write_prepared_corpus

    tokenizer = ByteTokenizer()
    entry = {"fingerprint": tokenizer.fingerprint, "name": "byte", "vocab_size": tokenizer.vocab_size}
    entry.update(eos_id=tokenizer.eos_id, bos_id=None)
    docs = [np.append(np.arange(97, 116), tokenizer.eos_id) for _ in range(documents)]
    docs[-1][3] = token
    write_prepared_corpus(directory, {"train": [docs], "val": [docs[:1]]}, tokenizer=entry)
    return directory


def make_existing_run(path: pathlib.Path) -> pathlib.Path:
    """A run directory with results worth keeping (but no checkpoint): what `nothing overwritten` protects."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text('{"step": 1, "loss": 5.5}\n{"step": 2, "loss": 5.25}\n')
    (path / "summary.json").write_text('{"final_train_loss": 5.25}\n')
    (path / "notes.txt").write_text("results of last week\n")
    return path


def make_restartable_run(path: pathlib.Path) -> pathlib.Path:
    """An fp4lm run stopped before its first checkpoint (config.json, a logged step, a user's notes): training
    accepts it (and starts it over), so every check of the settings and the data runs, and must write nothing."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"checkpoint": {"enabled": True}}) + "\n")
    (path / "metrics.jsonl").write_text('{"step": 1, "loss": 5.5}\n')
    (path / "notes.txt").write_text("results of last week\n")
    return path


TRAIN_BASE = [
    *TINY_MODEL,
    *TINY_DATA,
    "data.path={corpus}",
    "train.run_dir={restartable_run}",
    "train.steps=4",
    "metrics.progress=plain",
    "metrics.tensorboard=false",
    "eval.sample_tokens=0",
]

# Mistakes caught by the config, the data readers, the recipe checks and the mesh, before any compilation.
TRAIN_CASES = [
    ("unknown_key", ["model.dmodel=64"], ["model.dmodel", "valid keys"]),
    ("unknown_section", ["modle.d_model=64"], ["modle", "valid sections"]),
    ("wrong_type_int", ["model.d_model=wide"], ["model.d_model", "integer"]),
    ("wrong_type_float", ["optimizer.lr=fast"], ["optimizer.lr", "number"]),
    # the value the user typed is the one named (yaml 1.1 read `off` as False), a broken one is a line
    ("word_read_as_bool", ["metrics.progress=off"], ["metrics.progress='off'", "auto"]),
    ("override_value_not_yaml", ["train.steps=[1"], ["train.steps=[1", "not valid YAML"]),
    ("wrong_type_bool", ["checkpoint.enabled=maybe"], ["checkpoint.enabled", "true or false"]),
    ("fractional_int", ["train.steps=1.5"], ["train.steps", "integer"]),
    ("empty_value", ["train.steps="], ["train.steps"]),
    ("negative_width", ["model.d_model=-32"], ["model.d_model", "positive"]),
    ("zero_batch", ["train.batch_size=0"], ["train.batch_size", "positive"]),
    ("zero_steps", ["train.steps=0"], ["train.steps", "positive"]),
    ("zero_seq_len", ["data.seq_len=0"], ["data.seq_len", "positive"]),
    ("negative_lr", ["optimizer.lr=-0.001"], ["optimizer.lr", "positive"]),
    ("end_of_run_sample_top_p_zero", ["eval.sample_top_p=0"], ["eval.sample_top_p=0.0", "(0, 1]"]),
    ("end_of_run_sample_top_p_above_one", ["eval.sample_top_p=1.5"], ["eval.sample_top_p=1.5", "(0, 1]"]),
    ("width_not_multiple_of_16", ["model.d_model=40"], ["model.d_model=40", "multiple of 16"]),
    ("mlp_not_multiple_of_16", ["model.mlp_dim=72"], ["model.mlp_dim=72", "multiple of 16"]),
    (
        "tokens_per_step_not_multiple_of_16",
        ["train.batch_size=3", "data.seq_len=7"],
        ["train.batch_size * data.seq_len", "multiple of 16"],
    ),
    ("mxfp4_width_not_multiple_of_32", ["precision.recipe=mxfp4", "model.d_model=48"], ["model.d_model=48", "32"]),
    (
        "heads_do_not_divide_width",
        ["model.d_model=48", "model.num_heads=5", "model.num_kv_heads=1"],
        ["model.num_heads=5", "model.d_model=48"],
    ),
    ("kv_heads_do_not_divide_heads", ["model.num_kv_heads=3"], ["model.num_kv_heads=3"]),
    ("odd_head_dim", ["model.d_model=48", "model.num_heads=16", "model.num_kv_heads=16"], ["even"]),
    ("unknown_recipe", ["precision.recipe=nvfp5"], ["nvfp5", "nvfp4"]),
    ("unknown_tokenizer", ["data.tokenizer=wordpiece"], ["data.tokenizer", "bpe"]),
    ("unknown_data_format", ["data.format=csv"], ["data.format", "jsonl"]),
    ("val_fraction_out_of_range", ["data.val_fraction=1.5"], ["data.val_fraction"]),
    ("bf16_after_out_of_range", ["precision.bf16_after=2"], ["precision.bf16_after"]),
    ("bf16_layers_exceed_model", ["precision.bf16_first_layers=5"], ["precision.bf16_first_layers=5"]),
    ("rule_without_recipe", ["precision.rules=blocks"], ["REGEX=RECIPE"]),
    ("rule_matches_no_layer", [r"precision.rules=blocks\.9\..*=bf16"], ["matches no linear layer"]),
    ("byte_vocab_too_small", ["data.vocab_size=100"], ["data.vocab_size"]),
    ("loss_scale_backoff_above_1", ["loss_scale.backoff_factor=2"], ["loss_scale.backoff_factor"]),
    ("override_without_section", ["steps=10"], ["steps=10", "section.key=value"]),
    ("argument_without_equals", ["model.d_model"], ["model.d_model", "section.key=value"]),
    ("two_mesh_axes_minus_one", ["mesh.data=-1", "mesh.fsdp=-1"], ["-1"]),
    ("mesh_larger_than_devices", ["mesh.data=16", "mesh.fsdp=16"], ["mesh.data", "devices"]),
    # gradient accumulation, the profile window, the dry run's mesh
    ("grad_accum_steps_not_dividing_batch", ["train.grad_accum_steps=3"], ["train.grad_accum_steps=3", "divide"]),
    (
        "profile_window_beyond_steps",
        ["profile.start_step=3", "profile.steps=5"],
        ["profile.start_step=3", "train.steps=4"],
    ),
    (
        "dry_run_mesh_larger_than_devices",
        ["mesh.data=4", "mesh.fsdp=4", "--dry-run"],
        ["--dry-run", "needs 16 devices", "xla_force_host_platform_device_count=16"],
    ),
    (  # the tests run on a CPU: cuDNN flash attention needs an NVIDIA GPU
        "attention_cudnn_unsupported",
        ["model.attention=cudnn"],
        ["model.attention=cudnn", "NVIDIA GPU", "compute capability", "cuDNN >= 9.0", "model.attention=auto"],
    ),
    (
        "process_id_out_of_range",
        ["distributed.process_id=3", "distributed.num_processes=2"],
        ["distributed.process_id=3"],
    ),
    ("data_file_missing", ["data.path={missing}"], ["no_such_file.txt", "data.path"]),
    ("data_file_empty", ["data.path={empty}"], ["empty.txt", "empty"]),
    ("data_file_binary", ["data.path={binary}"], ["binary.txt", "binary"]),
    ("data_file_not_utf8", ["data.path={latin1}"], ["latin1.txt", "UTF-8"]),
    ("corpus_shorter_than_a_sequence", ["data.path={short}"], ["short.txt", "data.seq_len"]),
    ("jsonl_without_text_field", ["data.path={nofield}"], ["nofield.jsonl", "data.text_field"]),
    ("jsonl_broken_line", ["data.path={brokenjson}"], ["brokenjson.jsonl", "line 2"]),
    ("parquet_corrupt", ["data.path={corrupt}"], ["corrupt.parquet", "Parquet"]),
    ("parquet_without_text_column", ["data.path={nocolumn}"], ["nocolumn.parquet", "column"]),
    ("parquet_text_column_not_strings", ["data.path={intcolumn}"], ["intcolumn.parquet", "string"]),
    ("raw_token_file_without_width", ["data.path={raw}"], ["raw.bin", "tokens_uint16"]),
    ("npy_of_floats", ["data.path={floats}"], ["floats.npy", "integer"]),
    ("token_ids_beyond_vocab", ["data.path={bigids}"], ["bigids.npy", "data.vocab_size"]),
    # the user's tokenizer
    ("tokenizer_missing", ["data.tokenizer={missing}"], ["no_such_file.txt", "does not exist", "data.tokenizer"]),
    ("tokenizer_not_json", ["data.tokenizer={corpus}"], ["corpus.txt", "not JSON", "data.tokenizer"]),
    ("tokenizer_json_not_a_tokenizer", ["data.tokenizer={settings_json}"], ["settings.json", "not a tokenizer"]),
    ("tokenizer_model_truncated", ["data.tokenizer={cut_model}"], ["SentencePiece", "data.tokenizer"]),
    (
        "vocab_size_below_the_tokenizers",
        ["data.tokenizer={tokenizer_300}", "data.vocab_size=256"],
        ["vocab_size=256 is smaller", "300 tokens", "data.vocab_size"],
    ),
    ("data_directory_empty", ["data.path={emptydir}"], ["emptydir", "data.path"]),
    # training on prepared data, mixtures, a separate validation source
    ("prepared_other_tokenizer", ["data.path={prepared}"], ["another tokenizer", "prepared", "data.tokenizer"]),
    ("prepared_too_small", ["data.path={prepared_small}", "data.vocab_size=257"], ["too small", "data.seq_len"]),
    ("prepared_shard_truncated", ["data.path={prepared_truncated}"], ["train-00000.npy", "damaged"]),
    ("mixture_negative_weight", ["data.sources={corpus}:-1"], ["data.sources", "weight -1"]),
    ("mixture_weights_all_zero", ["data.sources={corpus}:0,{latin1}:0"], ["data.sources", "every weight is 0"]),
    ("mixture_source_too_small", ["data.sources={corpus}:1,{short}:1"], ["short.txt", "data.seq_len"]),
    ("mixture_source_missing", ["data.sources={corpus}:1,{missing}:1"], ["no_such_file.txt", "data.sources"]),
    ("val_path_missing", ["data.val_path={missing}"], ["data.val_path", "no_such_file.txt"]),
    ("val_path_too_small", ["data.val_path={short}"], ["data.val_path", "short.txt", "too small"]),
    ("run_dir_is_a_file", ["train.run_dir={corpus}"], ["train.run_dir", "not a directory"]),
    ("run_dir_below_a_file", ["train.run_dir={corpus}/run"], ["train.run_dir", "Not a directory"]),
    # non-finite numbers; a bundled corpus that does not exist
    ("nan_learning_rate", ["optimizer.lr=nan"], ["optimizer.lr", "finite"]),
    ("nan_grad_clip", ["optimizer.grad_clip=nan"], ["optimizer.grad_clip", "finite"]),
    ("inf_init_std", ["model.init_std=inf"], ["model.init_std", "finite"]),
    ("unknown_bundled_corpus", ["data.path=bundled:nope"], ["bundled:nope", "data.path"]),
    # a device as data.path (the FIFO: test_refused_early.py); sizes no machine holds
    ("data_path_is_a_device", ["data.path=/dev/zero"], ["/dev/zero", "character device", "data.path"]),
    ("impossible_width", ["model.d_model=1000000000"], ["per device", "model.d_model"]),
    ("impossible_vocabulary", ["data.vocab_size=1000000000"], ["per device", "data.vocab_size"]),
    ("impossible_sequence", ["data.seq_len=60000"], ["per device", "data.seq_len"]),
    ("impossible_depth", ["model.num_layers=100000000"], ["per device", "model.num_layers"]),
    # a plain valid command on results without a checkpoint; an empty run_dir
    (
        "run_dir_holds_results_without_checkpoint",
        ["train.run_dir={existing_run}"],
        ["train.run_dir", "no fp4lm checkpoint", "--force"],
    ),
    ("run_dir_empty", ["train.run_dir="], ["train.run_dir", "empty"]),
]

# Other commands and whole command lines.
COMMAND_CASES = [
    ("unknown_subcommand", ["frobnicate"], ["frobnicate", "train"]),
    ("config_file_missing", ["train", "{missing_yaml}"], ["no_such_config.yaml", "not found"]),
    ("config_file_is_a_directory", ["train", "{emptydir}"], ["emptydir", "not a regular file"]),
    ("config_file_bad_yaml", ["train", "{bad_yaml}"], ["bad.yaml", "YAML"]),
    ("config_file_is_a_list", ["train", "{listing}"], ["listing.yaml", "mapping"]),
    ("config_section_not_a_mapping", ["train", "{scalar_section}"], ["scalar_section.yaml", "model"]),
    ("project_unknown_gpu", ["project", "--model", "llama3-8b", "--gpu", "rtx9090"], ["rtx9090", "h100"]),
    ("project_unknown_model", ["project", "--model", "llama5-1t", "--gpu", "h100"], ["llama5-1t", "preset"]),
    ("project_zero_sequence", ["project", "--model", "llama3-8b", "--gpu", "h100", "--seq", "0"], ["--seq"]),
    (  # an expert-parallel layout that splits the experts unevenly
        "project_experts_not_divisible",
        ["project", "--model", "mixtral-8x7b", "--gpu", "b200", "mesh.expert=3"],
        ["mesh.expert=3", "model.num_experts=8"],
    ),
    (
        "project_unknown_recipe",
        ["project", "--model", "llama3-8b", "--gpu", "h100", "--recipes", "bf16,nvfp9"],
        ["nvfp9"],
    ),
    ("sample_missing_run_dir", ["sample", "{missing}", "--prompt", "ROMEO:"], ["no_such_file.txt", "run directory"]),
    ("sample_without_prompt", ["sample", "{existing_run}"], ["--prompt"]),
    ("eval_run_dir_without_checkpoint", ["eval", "{existing_run}"], ["checkpoint"]),
    (
        "compare_unknown_recipe",
        [
            "compare",
            "--recipes",
            "bf16,nvfp9",
            "--out",
            "{existing_run}/compare",
            *[a for a in TRAIN_BASE if not a.startswith("train.run_dir")],
        ],
        ["nvfp9"],
    ),
    # a key or a section given twice; compare --out onto a training run
    ("config_key_given_twice", ["train", "{duplicate_key}"], ["d_model", "lines 2 and 3"]),
    ("config_section_given_twice", ["train", "{duplicate_section}"], ["'model'", "lines 1 and 3"]),
    (
        "compare_out_is_a_training_run",
        [
            "compare",
            "--recipes",
            "bf16",
            "--out",
            "{existing_run}",
            *[a for a in TRAIN_BASE if not a.startswith("train.run_dir")],
        ],
        ["--out", "training run"],
    ),
    # compare --out onto a user's files (their report.html) is refused without --force
    (
        "compare_out_holds_users_files",
        [
            "compare",
            "--recipes",
            "bf16",
            "--out",
            "{users_dir}",
            *[a for a in TRAIN_BASE if not a.startswith("train.run_dir")],
        ],
        ["--out", "not an fp4lm comparison", "report.html", "--force"],
    ),
    # sizes the projection cannot represent (a missing GPU platform and a closed pipe need an environment or a
    # pipe: test_refused_early.py)
    (
        "project_sequence_beyond_limit",
        ["project", "--model", "llama3-8b", "--gpu", "h100", "--seq", "1000000000000"],
        ["--seq", "1,048,576"],
    ),
    (
        "project_tokens_beyond_limit",
        ["project", "--model", "llama3-8b", "--gpu", "h100", "--batch", "100000"],
        ["--batch", "4,194,304"],
    ),
    (
        "project_model_beyond_limit",
        ["project", "--model", "llama3-8b", "--gpu", "h100", "model.num_layers=100000000"],
        ["parameters", "model.num_layers"],
    ),
]

# `fp4lm prepare` (its output goes below the existing run, which must stay untouched)
PREPARE_OUT = ["--tokenizer", "byte", "--out", "{existing_run}/prepared"]
COMMAND_CASES += [
    ("prepare_glob_matches_nothing", ["prepare", "{emptydir}/*.jsonl", *PREPARE_OUT], ["*.jsonl", "matches no files"]),
    ("prepare_jsonl_line_not_json", ["prepare", "{brokenjson}", *PREPARE_OUT], ["brokenjson.jsonl: line 2", "JSON"]),
    ("prepare_jsonl_without_field", ["prepare", "{nofield}", *PREPARE_OUT], ["nofield.jsonl: line 1", "--text-field"]),
    ("prepare_parquet_without_column", ["prepare", "{nocolumn}", *PREPARE_OUT], ["nocolumn.parquet", "column"]),
    (
        "prepare_tokenizer_not_a_tokenizer",
        ["prepare", "{nofield}", "--tokenizer", "{corpus}", "--out", "{existing_run}/prepared"],
        ["corpus.txt", "tokenizer"],
    ),
    ("prepare_verify_truncated_shard", ["prepare", "--verify", "{prepared_truncated}"], ["train-00000.npy", "damaged"]),
    ("prepare_verify_edited_shard", ["prepare", "--verify", "{prepared_edited}"], ["train-00000.npy", "sha256"]),
    (
        "prepare_out_not_empty",
        ["prepare", "{nofield}", "--tokenizer", "byte", "--out", "{existing_run}"],
        ["not empty"],
    ),
]

# export and import. An export is refused before it reads the run or writes its output directory.
EXPORT_OUT = ["--out", "{existing_run}/exported"]
INIT_RUN = ["train.run_dir={existing_run}/imported"]  # a new run directory (never created: refused before)
COMMAND_CASES += [
    ("export_no_checkpoint", ["export", "{existing_run}", "--format", "hf", *EXPORT_OUT], ["no checkpoints"]),
    (
        "export_out_not_empty",
        ["export", "{existing_run}", "--format", "nvfp4", "--out", "{users_dir}"],
        ["not empty", "--force", "users_dir.old-<date-time>"],
    ),
    # --force never replaces the run being exported, a directory holding it, or another run
    (
        "export_force_out_is_the_run",
        ["export", "{existing_run}", "--format", "hf", "--out", "{existing_run}", "--force"],
        ["--out", "the run being exported", "a directory of its own"],
    ),
    (
        "export_force_out_holds_the_run",
        ["export", "{existing_run}", "--format", "hf", "--out", "{existing_run}/..", "--force"],
        ["--out", "holds the run being exported"],
    ),
    (
        "export_force_out_holds_another_run",
        ["export", "{restartable_run}", "--format", "hf", "--out", "{existing_run}", "--force"],
        ["--out", "holds the fp4lm training run", "existing_run"],
    ),
    (
        "export_w4a4_without_calibration",
        ["export", "{existing_run}", "--format", "nvfp4", "--activations", "nvfp4", *EXPORT_OUT],
        ["--activations nvfp4", "--calibration-batches"],
    ),
    ("export_unknown_format", ["export", "{existing_run}", "--format", "gguf", *EXPORT_OUT], ["--format", "gguf"]),
    (
        "export_bad_dtype",
        ["export", "{existing_run}", "--format", "hf", "--dtype", "float16", *EXPORT_OUT],
        ["--dtype float16"],
    ),
    (
        "init_from_not_llama",
        ["train", "train.init_from={hf_mistral}", *INIT_RUN],
        ["MistralForCausalLM", "LlamaForCausalLM"],
    ),
    (
        "init_from_missing_shard",
        ["train", "train.init_from={hf_missing_shard}", *INIT_RUN],
        ["model-00001-of-00001.safetensors", "missing"],
    ),
    (
        "init_from_no_directory",
        ["train", "train.init_from={missing}", *INIT_RUN],
        ["train.init_from", "no config.json"],
    ),
    (
        "init_from_conflicting_width",
        ["train", "train.init_from={hf_wide}", *INIT_RUN, "model.d_model=32"],
        ["model.d_model=32", "d_model=64"],
    ),
]

# Resuming an existing run (a finished reference run) with settings its checkpoints cannot serve.
RESUME_CASES = [
    ("resume_other_width", ["model.d_model=64", "model.num_heads=4"], ["model.d_model=32", "model.d_model=64"]),
    ("resume_other_depth", ["model.num_layers=2"], ["model.num_layers=1", "model.num_layers=2"]),
    ("resume_other_tokenizer", ["data.tokenizer=bpe", "data.vocab_size=512"], ["data.tokenizer=byte"]),
    ("resume_other_vocab", ["data.vocab_size=512"], ["data.vocab_size=256"]),
    ("resume_other_seq_len", ["data.seq_len=16"], ["seq_len=32", "seq_len=16"]),
    ("resume_other_batch", ["train.batch_size=8"], ["train.batch_size=4", "train.batch_size=8"]),
    ("resume_other_seed", ["train.seed=5"], ["seed=0", "seed=5"]),
    # the setting that differs is named, every mismatch at once; another recipe
    ("resume_other_data", ["data.path={latin1}"], ["data.path=", "latin1.txt"]),
    (
        "resume_lists_every_mismatch",
        ["train.seed=5", "data.seq_len=16", "model.num_layers=2"],
        ["train.seed=5", "data.seq_len=16", "model.num_layers=2"],
    ),
    ("resume_other_recipe", ["precision.recipe=fp8"], ["precision.recipe=nvfp4", "train.allow_recipe_change=true"]),
]

# Commands on a finished run that must refuse a bad option.
FINISHED_RUN_CASES = [
    ("sample_negative_temperature", ["sample", "{run}", "--prompt", "hi", "--temperature", "-1"], ["--temperature"]),
    ("sample_negative_max_tokens", ["sample", "{run}", "--prompt", "hi", "--max-tokens", "-5"], ["--max-tokens"]),
    ("sample_empty_prompt", ["sample", "{run}", "--prompt", ""], ["prompt is empty"]),
    ("eval_zero_batches", ["eval", "{run}", "--batches", "0"], ["--batches"]),
    ("eval_negative_batches", ["eval", "{run}", "--batches", "-3"], ["--batches"]),
    # a temperature that is not a finite number >= 0; top-k below 0
    (
        "sample_nan_temperature",
        ["sample", "{run}", "--prompt", "hi", "--temperature", "nan"],
        ["--temperature", "finite"],
    ),
    (
        "sample_inf_temperature",
        ["sample", "{run}", "--prompt", "hi", "--temperature", "inf"],
        ["--temperature", "finite"],
    ),
    ("sample_negative_top_k", ["sample", "{run}", "--prompt", "hi", "--top-k", "-1"], ["--top-k"]),
    # top-p outside (0, 1]; a prompt the KV cache (the context, data.seq_len=32) cannot hold
    ("sample_zero_top_p", ["sample", "{run}", "--prompt", "hi", "--top-p", "0"], ["--top-p", "(0, 1]"]),
    (
        "sample_prompt_longer_than_context",
        ["sample", "{run}", "--prompt", "ROMEO: " * 10],
        ["prompt is", "longer than the model's context of 32", "data.seq_len"],
    ),
    (
        "export_step_missing",
        ["export", "{run}", "--format", "hf", "--step", "7", "--out", "{run}/../exported"],
        ["step 7", "saved steps"],
    ),
]


# train/export/compare: damaged checkpoints
def make_damaged_checkpoint_files(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Hugging Face checkpoints whose weights file is cut short, has a corrupt header, or whose index is cut."""
    from fp4lm.hf import safetensors_files

    made = {}
    for name in ("hf_truncated", "hf_bad_header", "hf_bad_index"):
        made[name] = _hf_checkpoint(root / name)
        (made[name] / safetensors_files.INDEX_FILE).unlink()
        weights = made[name] / safetensors_files.SINGLE_FILE
        safetensors_files.write_file(weights, [("model.embed_tokens.weight", np.ones((256, 32), np.float32))], {})
    data = (made["hf_truncated"] / "model.safetensors").read_bytes()
    (made["hf_truncated"] / "model.safetensors").write_bytes(data[: len(data) // 2])
    data = bytearray((made["hf_bad_header"] / "model.safetensors").read_bytes())
    data[8:10] = b"{{"  # the header is no longer JSON
    (made["hf_bad_header"] / "model.safetensors").write_bytes(bytes(data))
    (made["hf_bad_index"] / "model.safetensors.index.json").write_text('{"weight_map": {"model.embed')
    return made


COMMAND_CASES += [
    (
        "init_from_truncated_safetensors",
        ["train", "train.init_from={hf_truncated}", *INIT_RUN],
        ["hf_truncated/model.safetensors", "damaged", "copy or download it again"],
    ),
    (
        "init_from_corrupt_safetensors_header",
        ["train", "train.init_from={hf_bad_header}", *INIT_RUN, "--dry-run"],
        ["hf_bad_header/model.safetensors", "damaged"],
    ),
    (
        "init_from_cut_index",
        ["train", "--dry-run", "train.init_from={hf_bad_index}", *INIT_RUN],
        ["hf_bad_index/model.safetensors.index.json", "damaged"],
    ),
    (
        "resume_on_an_export",
        ["train", "train.run_dir={hf_wide}"],
        ["train.run_dir=", "hf_wide holds a Hugging Face checkpoint", "train.init_from="],
    ),
    (
        "init_from_a_training_run",
        ["train", "train.init_from={existing_run}", *INIT_RUN],
        ["an fp4lm training run", "train.run_dir=", "fp4lm export"],
    ),
    (
        "init_from_a_restartable_run",
        ["train", "train.init_from={restartable_run}", *INIT_RUN],
        ["an fp4lm training run", "export it first"],
    ),
    (
        "export_dtype_for_nvfp4",
        ["export", "{existing_run}", "--format", "nvfp4", "--dtype", "float32", *EXPORT_OUT],
        ["--dtype float32", "--format hf only", "drop --dtype"],
    ),
    (
        "export_calibration_without_w4a4",
        ["export", "{existing_run}", "--format", "nvfp4-ct", "--calibration-batches", "8", *EXPORT_OUT],
        ["--calibration-batches 8", "--activations nvfp4"],
    ),
    (
        "export_calibration_beyond_bound",
        [
            "export",
            "{existing_run}",
            "--format",
            "nvfp4",
            "--activations",
            "nvfp4",
            "--calibration-batches",
            "1000000000",
            *EXPORT_OUT,
        ],
        ["--calibration-batches", "10,000"],
    ),
    (
        "compare_too_many_seeds",
        ["compare", "--recipes", "bf16", "--seeds", "1000", "--out", "{existing_run}/compare"],
        ["--seeds 1,000", "at most 100"],
    ),
    (
        "compare_seed_beyond_range",
        ["compare", "--recipes", "bf16", "--seeds", "0,3000000000", "--out", "{existing_run}/compare"],
        ["seed 3000000000", "train.seed"],
    ),
]
TRAIN_CASES += [
    ("steps_beyond_the_step_counter", ["train.steps=3000000000"], ["train.steps=3,000,000,000", "int32"]),
]

# mixture-of-experts settings that cannot run (the tiny model, nvfp4, with 4 experts of width 32).
MOE = ["model.num_experts=4", "model.moe_mlp_dim=32"]
TRAIN_CASES += [
    ("moe_top_k_above_the_experts", [*MOE, "model.experts_per_token=5"], ["experts_per_token=5", "num_experts=4"]),
    ("moe_width_not_whole_blocks", [*MOE, "model.moe_mlp_dim=24"], ["model.moe_mlp_dim=24", "multiple of 16"]),
    ("moe_capacity_zero", [*MOE, "model.capacity_factor=0"], ["model.capacity_factor", "positive"]),
    ("moe_capacity_negative", [*MOE, "model.capacity_factor=-1.5"], ["model.capacity_factor", "positive"]),
    ("moe_no_block_left", [*MOE, "model.first_dense_layers=1"], ["model.first_dense_layers=1", "num_experts=0"]),
]
RESUME_CASES += [
    ("resume_dense_with_experts", MOE, ["model.num_experts=0", "model.num_experts=4"]),
    ("resume_with_qk_norm", ["model.qk_norm=true"], ["model.qk_norm=False", "model.qk_norm=True"]),
]
FINISHED_RUN_CASES += [
    (
        "init_from_on_a_run_to_resume",
        ["train", "train.run_dir={run}", "train.init_from={hf_wide}"],
        ["train.init_from=", "holds a run started from scratch", "leave train.init_from out"],
    ),
    (
        "sample_max_tokens_beyond_bound",
        ["sample", "{run}", "--prompt", "hi", "--max-tokens", "1000000"],
        ["--max-tokens 1,000,000", "100,000"],
    ),
    (
        "dry_run_override_a_resume_refuses",
        ["train", "train.run_dir={run}", "--dry-run", "model.num_layers=2"],
        ["model.num_layers=1", "model.num_layers=2", "leave these settings out"],
    ),
]


def expand(argv: list[str], paths: dict[str, pathlib.Path]) -> list[str]:
    out = []
    for arg in argv:
        if arg == "TRAIN":
            out += ["train", *expand(TRAIN_BASE, paths)]
            continue
        out.append(arg.format(**{k: str(v) for k, v in paths.items()}))
    return out


# data. Damaged compressed streams in every format (never a skippable line), ...
def _damaged_data_files(root: pathlib.Path) -> dict[str, pathlib.Path]:
    import gzip
    import lzma

    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    lines = "".join(json.dumps({"text": f"document {i} " * 8}) + "\n" for i in range(3000)).encode()
    text = ("To be, or not to be, that is the question.\n" * 3000).encode()

    def cut(name: str, data: bytes) -> pathlib.Path:
        (root / name).write_bytes(data[: len(data) * 2 // 3])
        return root / name

    files = {
        "cut_jsonl_zst": cut("cut.jsonl.zst", zstandard.ZstdCompressor().compress(lines)),
        "cut_jsonl_gz": cut("cut.jsonl.gz", gzip.compress(lines)),
        "cut_text_zst": cut("cut.txt.zst", zstandard.ZstdCompressor().compress(text)),
        "cut_text_xz": cut("cut.txt.xz", lzma.compress(text)),
    }
    whole = root / "whole.parquet"
    pq.write_table(pa.table({"text": [f"document {i} " * 8 for i in range(3000)]}), whole, compression="zstd")
    damaged = bytearray(whole.read_bytes())  # a zstd-compressed data page with 40 bytes changed; footer intact
    damaged[len(damaged) // 3 : len(damaged) // 3 + 40] = bytes(b ^ 0x5A for b in damaged[len(damaged) // 3 :][:40])
    files["cut_parquet"] = root / "damaged.parquet"
    files["cut_parquet"].write_bytes(bytes(damaged))
    files["prepared_bad_ids"] = _prepared_bytes(root / "prepared_bad_ids", documents=40, token=300)
    (root / "surrogate.jsonl").write_text('{"text": "fine"}\n{"text": "half a pair \\ud800 here"}\n' * 300)
    files["surrogate"] = root / "surrogate.jsonl"
    texts = pa.array([b"fine", b"caf\xe9"], type=pa.binary()).cast(pa.string(), safe=False)
    pq.write_table(pa.table({"text": texts}), root / "latin1.parquet")
    files["latin1_parquet"] = root / "latin1.parquet"
    return files


DATA_OUT = ["--tokenizer", "byte", "--out", "{existing_run}/prepared"]
COMMAND_CASES += [
    # item 6: a truncated or corrupt compressed stream names the file, even with --skip-bad-lines
    (
        "prepare_cut_jsonl_zst",
        ["prepare", "{cut_jsonl_zst}", "--skip-bad-lines", *DATA_OUT],
        ["cut.jsonl.zst", "truncated"],
    ),
    (
        "prepare_cut_jsonl_gz",
        ["prepare", "{cut_jsonl_gz}", "--skip-bad-lines", *DATA_OUT],
        ["cut.jsonl.gz", "not a valid gz"],
    ),
    ("prepare_cut_text_zst", ["prepare", "{cut_text_zst}", *DATA_OUT], ["cut.txt.zst", "truncated"]),
    ("prepare_cut_text_xz", ["prepare", "{cut_text_xz}", *DATA_OUT], ["cut.txt.xz", "not a valid xz"]),
    (
        "prepare_damaged_parquet",
        ["prepare", "{cut_parquet}", "--skip-bad-lines", *DATA_OUT],
        ["damaged.parquet", "Parquet"],
    ),
]
TRAIN_CASES += [
    ("train_cut_jsonl_zst", ["data.path={cut_jsonl_zst}"], ["cut.jsonl.zst", "truncated"]),
    # silently ignored input: data.path beside data.sources; a weight that is not a number (not "a missing file")
    ("train_path_beside_sources", ["data.sources={short}:1,{latin1}:1"], ["data.path=", "beside data.sources"]),
    ("train_source_weight_not_a_number", ["data.sources={corpus}:x"], ["data.sources", "'x'", "not a number"]),
    ("train_lone_surrogate", ["data.path={surrogate}"], ["surrogate.jsonl: line 2", "surrogate"]),
    # item 7: a token id beyond the vocabulary in a shard, where training opens it and in --verify
    (
        "train_prepared_id_beyond_vocab",
        ["data.path={prepared_bad_ids}", "data.vocab_size=257"],
        ["train-00000.npy", "300"],
    ),
]
COMMAND_CASES += [
    # malformed text: a lone surrogate escape, a Parquet value that is not UTF-8 (invalid UTF-8 in text files:
    # latin1 above), in prepare and in training on the raw file
    ("prepare_lone_surrogate", ["prepare", "{surrogate}", *DATA_OUT], ["surrogate.jsonl: line 2", "surrogate"]),
    ("prepare_parquet_not_utf8", ["prepare", "{latin1_parquet}", *DATA_OUT], ["latin1.parquet: row 2", "UTF-8"]),
    # counts: --shard-tokens 0 was taken as the default; bounds on both sides; --workers 0
    ("prepare_shard_tokens_zero", ["prepare", "{short}", "--shard-tokens", "0", *DATA_OUT], ["--shard-tokens 0"]),
    ("prepare_shard_tokens_huge", ["prepare", "{short}", "--shard-tokens", "99999999999", *DATA_OUT], ["2**32"]),
    ("prepare_unknown_bundled_corpus", ["prepare", "bundled:nope", *DATA_OUT], ["bundled:nope", "bundled:shakespeare"]),
    ("prepare_workers_zero", ["prepare", "{short}", "--workers", "0", *DATA_OUT], ["--workers 0", "not positive"]),
    (
        "prepare_verify_id_beyond_vocab",
        ["prepare", "--verify", "{prepared_bad_ids}"],
        ["train-00000.npy", "token id 300"],
    ),
]
TRAIN_CASES += [
    # expert parallelism. mesh.expert splits the experts evenly, and only a MoE model has any.
    (
        "experts_not_divisible_by_mesh_expert",
        ["model.num_experts=6", "model.experts_per_token=2", "mesh.expert=4"],
        ["mesh.expert=4", "model.num_experts=6", "divide"],
    ),
    ("mesh_expert_on_a_dense_model", ["mesh.expert=2"], ["mesh.expert=2", "dense", "mesh.fsdp"]),
]
