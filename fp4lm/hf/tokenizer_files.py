"""The run's tokenizer as the files Hugging Face tools read: tokenizer.json, tokenizer_config.json and
special_tokens_map.json (`transformers.AutoTokenizer.from_pretrained(DIR)` opens them as a
`PreTrainedTokenizerFast`). The byte tokenizer is written as the equivalent byte-level model whose ids are
the byte values (fp4lm.tokenizer); a SentencePiece tokenizer as its own `tokenizer.model`.
"""

from __future__ import annotations

import json
import pathlib

from fp4lm.tokenizer import tokenizer_from_json

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"


def _token_text(hf_json: dict, token_id: int | None) -> str | None:
    """The text of token `token_id` in a `tokenizers` JSON (its added tokens first, then the model's vocab)."""
    if token_id is None:
        return None
    for added in hf_json.get("added_tokens", []):
        if added.get("id") == token_id:
            return added.get("content")
    vocab = hf_json.get("model", {}).get("vocab", {})
    if isinstance(vocab, dict):
        for text, index in vocab.items():
            if index == token_id:
                return text
    return None


def special_ids(tokenizer_json: str) -> tuple[int | None, int | None]:
    """(bos_id, eos_id) of the checkpoint's tokenizer (None where it has none)."""
    tokenizer = tokenizer_from_json(tokenizer_json, origin="the checkpoint's tokenizer")
    return getattr(tokenizer, "bos_id", None), getattr(tokenizer, "eos_id", None)


def write_tokenizer(directory: pathlib.Path, tokenizer_json: str, *, model_max_length: int) -> list[str]:
    """Writes the tokenizer files into `directory`; returns their names."""
    tokenizer = tokenizer_from_json(tokenizer_json, origin="the checkpoint's tokenizer")
    hf_json = getattr(tokenizer, "hf_json", None)
    config_path = directory / TOKENIZER_CONFIG_FILE
    if hf_json is None:  # SentencePiece: its own model file (and fp4lm's tokenizer_config.json)
        written = {tokenizer.save(directory).name}
        eos_text = bos_text = None
    else:
        written = {TOKENIZER_FILE}
        (directory / TOKENIZER_FILE).write_text(json.dumps(hf_json, ensure_ascii=False), encoding="utf-8")
        eos_text = _token_text(hf_json, getattr(tokenizer, "eos_id", None))
        bos_text = _token_text(hf_json, getattr(tokenizer, "bos_id", None))
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    if hf_json is not None:
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config.update(model_max_length=model_max_length, clean_up_tokenization_spaces=False)
    special = {}
    if eos_text is not None:
        config["eos_token"] = special["eos_token"] = eos_text
    if bos_text is not None:
        config["bos_token"] = special["bos_token"] = bos_text
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (directory / SPECIAL_TOKENS_FILE).write_text(json.dumps(special, indent=2, ensure_ascii=False) + "\n")
    return sorted(written | {TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_FILE})
