"""The run's tokenizer and the model's vocabulary: the tokenizer's size, or a larger data.vocab_size, padded to
a multiple of data.vocab_multiple."""

from __future__ import annotations

import functools
import os
import pathlib

from fp4lm.config import BYTE_VOCAB_SIZE, DEFAULT_BPE_VOCAB_SIZE
from fp4lm.errors import UserError
from fp4lm.tokenizer.base import TOKENIZER_KEYWORDS, VOCAB_MULTIPLE, Tokenizer
from fp4lm.tokenizer.byte import ByteTokenizer
from fp4lm.tokenizer.files import load_tokenizer, open_tokenizer


def is_tokenizer_path(spec: str) -> bool:
    """Whether `data.tokenizer` names a file or directory (anything but the keywords byte and bpe)."""
    return spec not in TOKENIZER_KEYWORDS


def model_vocab_size(tokenizer: Tokenizer, vocab_size: int | None = None, multiple: int = VOCAB_MULTIPLE) -> int:
    """The model's vocabulary (embedding rows, LM head columns): the tokenizer's, or `vocab_size` (data.vocab_size)
    when larger (for a BPE fp4lm trained, by default the size it was asked to learn, so that the plan made before
    training, `planned_model_vocab_size`, holds), rounded up to a multiple of `multiple`. A `vocab_size` smaller
    than the tokenizer's is refused. The 256-id byte tokenizer (fp4lm's own format) keeps its 256 (unpadded)."""
    if vocab_size is not None and vocab_size < tokenizer.vocab_size:
        raise UserError(
            f"vocab_size={vocab_size} is smaller than the {tokenizer.name} tokenizer's vocabulary "
            f"({tokenizer.vocab_size} tokens); leave the vocabulary size unset (the model follows the tokenizer) "
            f"or set it to at least {tokenizer.vocab_size}",
            settings=("vocab_size",),
        )
    trained = getattr(tokenizer, "trained_vocab_size", None)  # a BPE fp4lm trained: the size it was asked for
    size = max(tokenizer.vocab_size, vocab_size or trained or 0)
    if getattr(tokenizer, "legacy", False):
        return size
    return -(-size // multiple) * multiple


def check_tokenizer_matches(tokenizer: Tokenizer, name: str, vocab_size: int | None, origin: str) -> None:
    """A saved tokenizer must be the one the config asks for: the same kind (byte, bpe), for bpe the same
    training size when one is given, for a path the same fingerprint as the file's."""
    if is_tokenizer_path(name):
        if not pathlib.Path(name).expanduser().exists():
            return  # the file is gone (moved, deleted): the copy saved with the run is the run's tokenizer
        wanted = open_tokenizer(name)
        if wanted.fingerprint != tokenizer.fingerprint:
            raise UserError(
                f"{origin} was made with another tokenizer ({tokenizer.name}, vocab {tokenizer.vocab_size}) than "
                f"{name} ({wanted.name}, vocab {wanted.vocab_size}); use the run's tokenizer or a new run directory",
                settings=("tokenizer", "run_dir"),
            )
        return
    trained = getattr(tokenizer, "trained_vocab_size", None)
    if name == "byte":  # a saved 256-id byte tokenizer fits any vocabulary size
        same = tokenizer.name == name and not (vocab_size == BYTE_VOCAB_SIZE and tokenizer.eos_id is not None)
    else:
        same = tokenizer.name == name and (vocab_size is None or trained is None or trained == vocab_size)
    if not same:
        size = trained or tokenizer.vocab_size
        raise UserError(
            f"{origin} was made with tokenizer {tokenizer.name} (vocab {size}), "
            f"but this run asks for {name} (vocab {vocab_size}); set tokenizer={tokenizer.name} "
            f"vocab_size={size} or use a new run directory",
            settings=("tokenizer", "vocab_size", "run_dir"),
        )


def load_or_train_tokenizer(
    kind: str, vocab_size: int | None, run_dir: str | os.PathLike | None, training_text: str | None
) -> Tokenizer:
    """The run's tokenizer: loaded from `run_dir` when saved there (and checked against the request),
    otherwise opened or made (BPE: trained on `training_text`) and saved into `run_dir` (if not None)."""
    if run_dir is not None:
        saved = load_tokenizer(run_dir)
        if saved is not None:
            check_tokenizer_matches(saved, kind, vocab_size, f"run dir {run_dir}")
            return saved
    tokenizer = open_tokenizer(kind, vocab_size=vocab_size, training_text=training_text)
    if run_dir is not None:
        tokenizer.save(run_dir)
    return tokenizer


def planned_model_vocab_size(data_cfg) -> int:
    """The model's vocabulary as far as the config tells before the data is read (memory estimates, `fp4lm
    project`): a bpe tokenizer is taken to learn all of its `data.vocab_size`; a tokenizer file is opened (a
    missing or broken one is refused here, early)."""
    spec, vocab_size = data_cfg.tokenizer, data_cfg.vocab_size
    multiple = getattr(data_cfg, "vocab_multiple", VOCAB_MULTIPLE)
    if spec == "byte":
        return model_vocab_size(ByteTokenizer(with_eos=vocab_size != BYTE_VOCAB_SIZE), vocab_size, multiple)
    if spec == "bpe":
        return -(-(vocab_size or DEFAULT_BPE_VOCAB_SIZE) // multiple) * multiple
    path = pathlib.Path(spec).expanduser()
    stamp = (path.stat().st_mtime_ns, path.stat().st_size) if path.is_file() else None
    return model_vocab_size(_opened(str(path), stamp), vocab_size, multiple)


@functools.lru_cache(maxsize=4)
def _opened(path: str, stamp: tuple[int, int] | None) -> Tokenizer:
    """open_tokenizer(path), kept while the file is unchanged (`stamp`): estimates ask more than once."""
    del stamp  # part of the cache key only
    return open_tokenizer(path)


def saved_model_vocab_size(run_dir: str | os.PathLike, data_cfg) -> int:
    """The model vocabulary of the run in `run_dir` (`fp4lm eval`, `sample`, export read its checkpoints with it):
    from the tokenizer saved there, or as planned from `data_cfg` when there is none."""
    saved = load_tokenizer(run_dir)
    if saved is None:
        return planned_model_vocab_size(data_cfg)
    return model_vocab_size(saved, data_cfg.vocab_size, getattr(data_cfg, "vocab_multiple", VOCAB_MULTIPLE))
