"""Tokenizers: bytes, a BPE trained on the run's data, any Hugging Face `tokenizer.json`, a SentencePiece model.

`data.tokenizer` (and `fp4lm prepare --tokenizer`) names one: `byte` (ids 0-255 and end-of-text 256; with
`data.vocab_size=256` no end-of-text), `bpe` (byte-level, trained once on the run's training text), or a PATH
(a tokenizer.json, a directory holding one, or a SentencePiece .model). All share one interface: `name`,
`vocab_size`, `eos_id`, `bos_id`, `fingerprint` (equal for tokenizers that give equal ids), `encode`, `decode`,
`to_json()` (kept in checkpoints) and `save(directory)`, which writes the standard files other tools read
(tokenizer.json or tokenizer.model, and tokenizer_config.json with fp4lm's ids under "fp4lm"; the 256-id byte
tokenizer as one file in fp4lm's own format). The model's vocabulary (`model_vocab_size`) is the tokenizer's,
or a larger `data.vocab_size`, padded to a multiple of `data.vocab_multiple`.

base.py holds the interface and the saved forms; byte.py, huggingface.py and sentencepiece.py the three kinds;
files.py reads them back; vocab.py decides the run's tokenizer and the model's vocabulary.
"""

from fp4lm.tokenizer.base import (
    BYTE_EOS_ID,
    END_OF_TEXT,
    SENTENCEPIECE_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    TOKENIZER_KEYWORDS,
    VOCAB_MULTIPLE,
    Tokenizer,
    split_into_pieces,
)
from fp4lm.tokenizer.byte import ByteTokenizer
from fp4lm.tokenizer.files import load_tokenizer, open_tokenizer, tokenizer_from_json
from fp4lm.tokenizer.huggingface import BPETokenizer, HuggingFaceTokenizer, even_sample
from fp4lm.tokenizer.sentencepiece import SentencePieceTokenizer
from fp4lm.tokenizer.vocab import (
    check_tokenizer_matches,
    is_tokenizer_path,
    load_or_train_tokenizer,
    model_vocab_size,
    planned_model_vocab_size,
    saved_model_vocab_size,
)

__all__ = [
    "BPETokenizer",
    "BYTE_EOS_ID",
    "ByteTokenizer",
    "END_OF_TEXT",
    "HuggingFaceTokenizer",
    "SENTENCEPIECE_FILE",
    "SentencePieceTokenizer",
    "TOKENIZER_CONFIG_FILE",
    "TOKENIZER_FILE",
    "TOKENIZER_KEYWORDS",
    "Tokenizer",
    "VOCAB_MULTIPLE",
    "check_tokenizer_matches",
    "even_sample",
    "is_tokenizer_path",
    "load_or_train_tokenizer",
    "load_tokenizer",
    "model_vocab_size",
    "open_tokenizer",
    "planned_model_vocab_size",
    "saved_model_vocab_size",
    "split_into_pieces",
    "tokenizer_from_json",
]
