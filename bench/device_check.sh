#!/usr/bin/env bash
# The GPU check: one prepared script for an NVIDIA GPU machine with jax (CUDA), flax, optax, numpy,
# ml_dtypes, pyyaml, pytest, pytest-xdist, pytest-timeout and hypothesis installed, and no network.
# The train and compare stages also need the trainer's grain and tensorboardX (skipped, saying so, without).
#
#   bash bench/device_check.sh [--no-compare] [OUT_DIR]   # <= 8 minutes on an H200; results in OUT_DIR
#                                                          # (default $OUT or /tmp)
#   DEVICE_CHECK_DRY_RUN=1 JAX_PLATFORMS=cpu bash bench/device_check.sh DIR   # small CPU run (the test suite's)
#
# Stages, each under its own time limit (seconds, adding up to 480), each merged into
# OUT_DIR/device_check.json as soon as it ends (a stage that times out keeps what it measured):
#   versions  30   jax, jaxlib, CUDA plugin, flax, optax, orbax, the GPU and compute capability; what is missing
#   tests    150   tests/numerics and tests/quant on the GPU: -n workers, --maxfail=50 (a first mismatch hides nothing)
#   bits      40   GPU vs CPU: the same codes, scale bytes and amax for the same inputs, every format
#   bandwidth 30   the NVFP4 quantizer against `x * c`, bytes as XLA's compiled program really moves them
#   train    120   the trainer's own step: tokens/s and MFU, bf16 and emulated nvfp4, 350M shapes, 8 scanned layers
#   compare   95   `fp4lm compare --preset gpu --recipes bf16,nvfp4` shortened to 100 steps per recipe:
#                  records and report in OUT_DIR/compare/, log OUT_DIR/compare.log (--no-compare skips it)
#   summary   15   the table
# Re-balanced after the first H200 run (2026-12-04, BENCHMARKS.md "First GPU run"): the tests took 139 s of
# 170, the train stage was stopped at 75 s compiling emulated NVFP4 (bf16: 18 s), and the compare stage ended
# early (out of memory, since fixed in the gpu preset), so its 95 s is still an estimate. A stage that runs
# out keeps what it measured.
set -uo pipefail
cd "$(dirname "$0")/.."
compare=1
if [[ "${1:-}" == "--no-compare" ]]; then
  compare=
  shift
fi
out=${1:-${OUT:-/tmp}}
mkdir -p "$out"
json="$out/device_check.json"
rm -f "$json"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
dry=()
tests=(tests/numerics tests/quant)
workers=${DEVICE_CHECK_WORKERS:-8}
scale=1
if [[ -n "${DEVICE_CHECK_DRY_RUN:-}" ]]; then
  dry=(--dry-run)
  tests=(tests/numerics/test_numerics_division.py::test_signs_zeros_infinities_and_nan)
  workers=${DEVICE_CHECK_WORKERS:-1}
  scale=${DEVICE_CHECK_TIME_SCALE:-1}
fi
export JAX_PLATFORMS=${JAX_PLATFORMS:-cuda,cpu}

# stage NAME LIMIT_S ARGS...: run one stage of device_check.py; record a timeout if it is stopped.
stage() {
  local name=$1 limit=$(( $2 * scale )) start=$SECONDS
  shift 2
  timeout --kill-after=5 "$limit" "$py" bench/device_check.py --stage "$name" --out "$json" "${dry[@]}" "$@"
  local code=$?
  if [[ $code -eq 124 || $code -eq 137 ]]; then
    echo "stage $name stopped at its limit of ${limit}s"
    "$py" bench/device_check.py --stage note --name "$name" --status timeout --seconds $((SECONDS - start)) \
      --out "$json"
  fi
  return $code
}

summary() { timeout 15 "$py" bench/device_check.py --stage summary --out "$json"; }

# Without a GPU (or with a package missing) nothing below would measure what it claims to: stop here.
stage versions 30 || { echo "the versions stage says what is missing (above); stopping"; summary; exit 2; }

# Without pytest-xdist or pytest-timeout the tests still run (serially, or without per-test limits).
options=(-n "$workers")
"$py" -c "import xdist" 2>/dev/null || { options=(); echo "pytest-xdist missing: tests run in one process"; }
"$py" -c "import pytest_timeout" 2>/dev/null && options+=(--timeout 120)
echo "== tests (numerics + quant on $JAX_PLATFORMS, ${options[*]})"
start=$SECONDS
# -v: one line per test as it ends, so a log cut short by the time limit still holds every outcome so far
timeout --kill-after=10 $((150 * scale)) "$py" -m pytest -v -p no:cacheprovider -o addopts="" -rfE \
  --maxfail=50 "${options[@]}" "${tests[@]}" >"$out/device_tests.log" 2>&1
code=$?
grep -E "^(FAILED|ERROR) " "$out/device_tests.log" | head -n 60
tail -n 3 "$out/device_tests.log"
"$py" bench/device_check.py --stage tests --log "$out/device_tests.log" --exit-code "$code" \
  --seconds $((SECONDS - start)) --out "$json"

stage bits 40
stage bandwidth 30
stage train 120
if [[ -n "$compare" ]]; then
  stage compare 95
else
  echo "== compare skipped (--no-compare)"
fi
summary
