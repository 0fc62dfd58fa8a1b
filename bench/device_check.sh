#!/usr/bin/env bash
# The GPU check (issue 5): one prepared script for an NVIDIA GPU machine with jax (CUDA), flax, optax,
# orbax-checkpoint, numpy, ml_dtypes, pyyaml, pytest and hypothesis preinstalled and no network.
# It needs nothing else: it does not import fp4lm.data or fp4lm.train (grain, tensorboardX are not needed).
#
#   bash bench/device_check.sh [OUT_DIR]        # about 5 minutes on an H200; results in OUT_DIR (default $OUT or /tmp)
#
# 1. the numerics and quantized-dot tests on the GPU;
# 2. GPU vs CPU: the same codes, scale bytes and amax for the same inputs, every format;
# 3. the NVFP4 quantizer's bandwidth against a device-to-device copy;
# 4. train-step tokens/s and MFU for bf16 and emulated nvfp4 at a ~350M-parameter config.
# It prints a short table last and writes the full results to OUT_DIR/device_check.json.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp}}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
$py -c 'import jax; print("jax", jax.__version__, jax.devices())' || { echo "error: jax is not importable"; exit 2; }
for m in flax optax numpy ml_dtypes yaml pytest hypothesis; do
  $py -c "import $m" 2>/dev/null || echo "warning: python package '$m' is missing; carry it as a wheel (see the device tool's README)"
done

echo "== 1. numerics + dot tests on the GPU"
JAX_PLATFORMS=cuda,cpu timeout 240 $py -m pytest -q -p no:cacheprovider -x --timeout 200 \
  tests/numerics tests/quant -o addopts="" 2>&1 | tee "$out/device_tests.log" | tail -n 15
echo "tests exit code: ${PIPESTATUS[0]}" | tee -a "$out/device_tests.log"

echo "== 2-4. CPU/GPU bit equality, quantizer bandwidth, train step"
JAX_PLATFORMS=cuda,cpu timeout 300 $py bench/device_check.py --out "$out/device_check.json"
