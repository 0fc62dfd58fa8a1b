"""compressed-tensors' own NVFP4 decompression of the nvfp4-ct export equals fp4lm's independent decoder
(tests/export/nvfp4_decoder.py) rounded to bfloat16, the dtype compressed-tensors decompresses to, on every
weight of every quantized layer; and both equal the forward pass's weights of that run (the ModelOpt export's
bytes, which are the codes the forward pass used)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tests.export import nvfp4_decoder
from tests.export.safetensors_reading import read_checkpoint


def test_compressed_tensors_decompression_equals_our_decoder(exports, consumer):
    ct = read_checkpoint(exports["nvfp4-ct"])
    modelopt = read_checkpoint(exports["nvfp4"])
    theirs = consumer("decompress", str(exports["nvfp4-ct"]))
    assert len(theirs) == 14  # 2 blocks x 7 projections
    for module, weight in theirs.items():
        ours = nvfp4_decoder.decode_compressed_tensors(
            *(ct[f"{module}.{name}"] for name in ("weight_packed", "weight_scale", "weight_global_scale"))
        )
        np.testing.assert_array_equal(weight, ours.astype(ml_dtypes.bfloat16).astype(np.float32), err_msg=module)
        forward = nvfp4_decoder.decode_modelopt(
            *(modelopt[f"{module}.{name}"] for name in ("weight", "weight_scale", "weight_scale_2"))
        )
        np.testing.assert_array_equal(weight, forward.astype(ml_dtypes.bfloat16).astype(np.float32), err_msg=module)
