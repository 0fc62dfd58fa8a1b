"""The user's tokenizer: a tokenizer.json (trained here with `tokenizers`) or a SentencePiece model given by
path, end/start-of-text ids, fingerprints, the model vocabulary's padding, and the one-line errors."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from fp4lm import tokenizer as tok
from fp4lm.config import load_config
from tests.data.helpers_data import sample_text, user_error

TEXT = sample_text(300) + "caf\u00e9 \u2014 \U0001f600\n"


def train_hf_tokenizer(specials: list[str], vocab_size: int = 300):
    """A byte-level BPE tokenizer trained here, with `specials` (ids 0, 1, ...) as its special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=specials,
        show_progress=False,
    )
    hf.train_from_iterator(TEXT.splitlines(keepends=True), trainer=trainer)
    return hf


@pytest.fixture(scope="module")
def gpt2_style(tmp_path_factory):
    """A tokenizer.json like GPT-2's: one special token, <|endoftext|>."""
    path = tmp_path_factory.mktemp("gpt2") / "tokenizer.json"
    train_hf_tokenizer(["<|endoftext|>"]).save(str(path))
    return path


@pytest.fixture(scope="module")
def llama3_style(tmp_path_factory):
    """A tokenizer.json like Llama 3's: <|begin_of_text|> and <|end_of_text|>, in a directory of its own."""
    directory = tmp_path_factory.mktemp("llama3")
    train_hf_tokenizer(["<|begin_of_text|>", "<|end_of_text|>"]).save(str(directory / "tokenizer.json"))
    return directory


def test_a_tokenizer_json_by_path_round_trips_and_finds_its_end_of_text(gpt2_style):
    opened = tok.open_tokenizer(str(gpt2_style))
    assert opened.name == "huggingface" and opened.vocab_size == 300
    assert opened.eos_id == 0 and opened.bos_id is None
    ids = opened.encode(TEXT)
    assert ids.dtype == np.int32 and opened.decode(ids) == TEXT
    assert 0 not in ids.tolist()  # text never produces the special token
    from tokenizers import Tokenizer

    assert ids.tolist() == Tokenizer.from_file(str(gpt2_style)).encode(TEXT, add_special_tokens=False).ids


def test_a_directory_with_begin_and_end_tokens(llama3_style):
    opened = tok.open_tokenizer(str(llama3_style))  # the directory holding tokenizer.json
    assert (opened.bos_id, opened.eos_id) == (0, 1)
    # a Hugging Face tokenizer_config.json beside the file decides, as it does for transformers
    (llama3_style / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|begin_of_text|>"}}))
    try:
        renamed = tok.open_tokenizer(str(llama3_style / "tokenizer.json"))
        assert renamed.eos_id == 0 and renamed.bos_id is None  # a BOS equal to the EOS counts as none
    finally:
        (llama3_style / "tokenizer_config.json").unlink()


def test_fingerprints_are_stable_and_tell_tokenizers_apart(gpt2_style, llama3_style, tmp_path):
    first, again = tok.open_tokenizer(str(gpt2_style)), tok.open_tokenizer(str(gpt2_style))
    assert first.fingerprint == again.fingerprint and len(first.fingerprint) == 64
    # the same tokenizer re-serialised (other key order, indentation) is the same tokenizer
    reordered = tmp_path / "tokenizer.json"
    reordered.write_text(json.dumps(dict(reversed(json.loads(gpt2_style.read_text()).items())), indent=4))
    assert tok.open_tokenizer(str(reordered)).fingerprint == first.fingerprint
    # saved into a run directory and read back: still the same
    first.save(tmp_path / "run")
    assert tok.load_tokenizer(tmp_path / "run").fingerprint == first.fingerprint  # pyright: ignore[reportOptionalMemberAccess]
    others = {
        tok.open_tokenizer(str(llama3_style)).fingerprint,
        tok.open_tokenizer("byte").fingerprint,
        tok.open_tokenizer("byte", vocab_size=256).fingerprint,
        tok.open_tokenizer("bpe", vocab_size=290, training_text=TEXT).fingerprint,
        tok.open_tokenizer(str(_changed_vocab(gpt2_style, tmp_path))).fingerprint,
    }
    assert len(others) == 5 and first.fingerprint not in others
    # fp4lm's bpe trained on the same text with the same settings is that very tokenizer: same fingerprint
    assert tok.open_tokenizer("bpe", vocab_size=300, training_text=TEXT).fingerprint == first.fingerprint


def _changed_vocab(path, tmp_path):
    payload = json.loads(path.read_text())
    token, token_id = next((t, i) for t, i in payload["model"]["vocab"].items() if i == 290)
    del payload["model"]["vocab"][token]
    payload["model"]["vocab"][token + "x"] = token_id
    payload["model"]["merges"] = [m for m in payload["model"]["merges"] if "".join(m) != token]
    changed = tmp_path / "changed" / "tokenizer.json"
    changed.parent.mkdir()
    changed.write_text(json.dumps(payload))
    return changed


def test_the_byte_tokenizer_is_written_as_a_standard_file_with_the_same_ids(tmp_path):
    from tokenizers import Tokenizer

    byte = tok.open_tokenizer("byte")
    assert (byte.vocab_size, byte.eos_id, byte.bos_id) == (257, 256, None)
    byte.save(tmp_path)
    standard = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = "Hark! caf\u00e9 \U0001f600\n\ttabs"
    assert standard.encode(text).ids == byte.encode(text).tolist() == list(text.encode("utf-8"))
    assert standard.token_to_id("<|endoftext|>") == 256
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["eos_token"] == "<|endoftext|>"
    reopened = tok.open_tokenizer(str(tmp_path / "tokenizer.json"))
    assert isinstance(reopened, tok.ByteTokenizer) and reopened.fingerprint == byte.fingerprint


def test_bpe_is_saved_as_a_standard_tokenizer_json_with_its_end_of_text(tmp_path):
    from tokenizers import Tokenizer

    bpe = tok.open_tokenizer("bpe", vocab_size=300, training_text=TEXT)
    bpe.save(tmp_path)
    standard = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert standard.token_to_id("<|endoftext|>") == bpe.eos_id is not None
    assert standard.encode(TEXT, add_special_tokens=False).ids == bpe.encode(TEXT).tolist()
    by_path = tok.open_tokenizer(str(tmp_path / "tokenizer.json"))
    assert by_path.name == "bpe" and by_path.fingerprint == bpe.fingerprint


def test_the_256_id_byte_tokenizer_keeps_its_one_file_format_and_an_old_bpe_is_refused(tmp_path):
    hf = train_hf_tokenizer([], vocab_size=280)
    old = {"format": "fp4lm-tokenizer/1", "name": "bpe", "vocab_size": 300, "tokenizers": json.loads(hf.to_str())}
    (tmp_path / "tokenizer.json").write_text(json.dumps(old))
    user_error(lambda: tok.load_tokenizer(tmp_path), "older fp4lm", "new run directory")
    byte_dir = tmp_path / "byte"
    byte_dir.mkdir()
    (byte_dir / "tokenizer.json").write_text(
        json.dumps({"format": "fp4lm-tokenizer/1", "name": "byte", "vocab_size": 256})
    )
    old_byte = tok.load_tokenizer(byte_dir)
    assert isinstance(old_byte, tok.ByteTokenizer) and old_byte.eos_id is None and old_byte.vocab_size == 256
    assert tok.model_vocab_size(old_byte, 256) == 256
    tok.check_tokenizer_matches(old_byte, "byte", 256, "run dir")
    old_byte.save(tmp_path / "again")  # saved again: still the old one-file form
    assert json.loads((tmp_path / "again" / "tokenizer.json").read_text())["format"] == "fp4lm-tokenizer/1"


def test_the_model_vocabulary_is_the_tokenizers_padded(gpt2_style):
    opened = tok.open_tokenizer(str(gpt2_style))  # 300 tokens
    assert tok.model_vocab_size(opened) == 384
    assert tok.model_vocab_size(opened, None, 64) == 320 and tok.model_vocab_size(opened, None, 1) == 300
    assert tok.model_vocab_size(opened, 1000) == 1024  # a larger data.vocab_size is the model's, padded
    assert tok.model_vocab_size(tok.open_tokenizer("byte")) == 384
    assert tok.model_vocab_size(tok.open_tokenizer("byte", vocab_size=256), 256) == 256
    small = tok.open_tokenizer("bpe", vocab_size=300, training_text=TEXT)
    assert tok.model_vocab_size(small, 300) == 384  # bpe: data.vocab_size is what it learns (at most)
    tiny = tok.BPETokenizer.train("abc abc abd\n", 1000)  # learns far fewer than 1000 on so little text
    assert tiny.vocab_size < 300 and tok.model_vocab_size(tiny) == 1024  # what the plan made before training says
    user_error(lambda: tok.model_vocab_size(opened, 280), "vocab_size=280 is smaller", "300 tokens", "data.vocab_size")


def test_the_planned_vocabulary_follows_the_config(gpt2_style):
    def planned(*overrides):
        return tok.planned_model_vocab_size(load_config(None, list(overrides)).data)

    assert planned() == 2048  # bpe learns 2048 by default
    assert planned("data.tokenizer=bpe", "data.vocab_size=1000") == 1024
    assert planned("data.tokenizer=byte") == 384 and planned("data.tokenizer=byte", "data.vocab_size=256") == 256
    assert planned(f"data.tokenizer={gpt2_style}") == 384
    assert planned(f"data.tokenizer={gpt2_style}", "data.vocab_multiple=1") == 300


def test_config_keeps_tokenizer_paths_absolute(tmp_path, monkeypatch, gpt2_style):
    monkeypatch.chdir(gpt2_style.parent)
    assert load_config(None, ["data.tokenizer=tokenizer.json"]).data.tokenizer == str(gpt2_style)
    assert load_config(None, ["data.tokenizer=byte"]).data.tokenizer == "byte"
    (tmp_path / "c.yaml").write_text("data: {tokenizer: tok/tokenizer.json}\n")
    assert load_config(tmp_path / "c.yaml").data.tokenizer == str(tmp_path / "tok" / "tokenizer.json")


def test_sentencepiece_model_by_path(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXT.splitlines()),
        model_writer=model,
        vocab_size=300,
        model_type="bpe",
        byte_fallback=True,  # as Llama 2's: newlines and unseen characters become byte pieces
        normalization_rule_name="identity",
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        bos_id=1,
        eos_id=2,
        unk_id=0,
        pad_id=-1,
        minloglevel=2,
    )
    path = tmp_path / "sp.model"
    path.write_bytes(model.getvalue())
    opened = tok.open_tokenizer(str(path))
    assert (opened.name, opened.vocab_size, opened.bos_id, opened.eos_id) == ("sentencepiece", 300, 1, 2)
    assert opened.decode(opened.encode(TEXT)) == TEXT
    assert tok.open_tokenizer(str(path)).fingerprint == opened.fingerprint
    opened.save(tmp_path / "run")
    again = tok.load_tokenizer(tmp_path / "run")
    assert again is not None and again.fingerprint == opened.fingerprint
    assert tok.tokenizer_from_json(opened.to_json()).fingerprint == opened.fingerprint
    (tmp_path / "cut.model").write_bytes(model.getvalue()[:100])
    user_error(lambda: tok.open_tokenizer(str(tmp_path / "cut.model")), "cut.model is not a SentencePiece model")


def test_sentencepiece_without_its_package_names_the_extra(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # import fails as if it were not installed
    (tmp_path / "a.model").write_bytes(b"\x00")
    user_error(
        lambda: tok.open_tokenizer(str(tmp_path / "a.model")), "sentencepiece", "pip install 'fp4lm[sentencepiece]'"
    )


def test_files_that_are_not_tokenizers_are_one_line_errors(tmp_path):
    user_error(lambda: tok.open_tokenizer(str(tmp_path / "missing.json")), "does not exist", "data.tokenizer")
    (tmp_path / "notes.json").write_text("these are notes")
    user_error(lambda: tok.open_tokenizer(str(tmp_path / "notes.json")), "is not JSON", "tokenizer.json")
    (tmp_path / "list.json").write_text("[1, 2, 3]")
    user_error(lambda: tok.open_tokenizer(str(tmp_path / "list.json")), "JSON but not a tokenizer")
    (tmp_path / "broken.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": 7}}))
    user_error(lambda: tok.open_tokenizer(str(tmp_path / "broken.json")), "not a usable tokenizer.json")
    (tmp_path / "empty").mkdir()
    user_error(lambda: tok.open_tokenizer(str(tmp_path / "empty")), "holds no tokenizer.json")
    user_error(lambda: tok.open_tokenizer("bpe"), "no text to train")
