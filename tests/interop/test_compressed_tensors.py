"""compressed-tensors' own NVFP4 decompression of the nvfp4-ct export equals fp4lm's independent decoder
(tests/export/nvfp4_decoder.py) rounded to bfloat16, the dtype compressed-tensors decompresses to, on every
weight of every quantized layer; and both equal the forward pass's weights of that run (the ModelOpt export's
bytes, which are the codes the forward pass used)."""

from __future__ import annotations

import pytest

from tests.export.safetensors_reading import read_checkpoint
from tests.interop.checks import assert_decompressed_weights_are_ours

pytestmark = pytest.mark.slow


def test_compressed_tensors_decompression_equals_our_decoder(exports, consumer):
    ct = read_checkpoint(exports["nvfp4-ct"])
    modelopt = read_checkpoint(exports["nvfp4"])
    theirs = consumer("decompress", str(exports["nvfp4-ct"]))
    assert len(theirs) == 14  # 2 blocks x 7 projections
    assert_decompressed_weights_are_ours(theirs, ct, modelopt)
