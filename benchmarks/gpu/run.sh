#!/usr/bin/env bash
# The last mile on a real GPU (docs/design/gpu.md). On a machine with CUDA: builds the extension
# against this machine's Python and torch, runs the GPU checks (test_on_gpu.py and the fake-CUDA
# tests), then measures the image workload to the device against torch in the same run
# (measure.py). Everything it writes goes to $OUT (or build/gpu-out): gpu.md, the test log, the
# build logs. `run.sh build`, `run.sh test`, `run.sh measure` run one stage (each fits one
# 10-minute device call); no argument runs all three (about 6 minutes on 16 cores).
# Needs: torch with CUDA, numpy, cmake, ninja, a C++20 compiler, Python headers; nanobind and
# pytest (pip-installed when absent and the machine can reach PyPI; else carry them in).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
OUTDIR=${OUT:-build/gpu-out}
STAGE=${1:-all}
mkdir -p "$OUTDIR" build/gpu
export PYTHONPATH="$PWD/python:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"

need() {  # a Python module, installed if it can be
  "$PY" -c "import $1" 2>/dev/null && return 0
  "$PY" -m pip install -q "$1" >"$OUTDIR/pip-$1.log" 2>&1 && return 0
  echo "run.sh: $1 is not installed and pip could not install it (offline?); carry it in" \
       "and put it on PYTHONPATH. See $OUTDIR/pip-$1.log" >&2
  return 1
}

build() {
  "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU here'; \
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" \
    | tee "$OUTDIR/machine.txt" || return 1
  need nanobind || return 1
  if ! cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTOKER_BUILD_TESTS=OFF \
       -DSTOKER_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v "$PY")" \
       >"$OUTDIR/cmake.log" 2>&1; then
    tail -30 "$OUTDIR/cmake.log"; return 1
  fi
  if ! cmake --build build/gpu -j "$(nproc)" >"$OUTDIR/build.log" 2>&1; then
    tail -40 "$OUTDIR/build.log"; return 1
  fi
  cp build/gpu/_stoker*.so python/stoker/
}

tests() {
  need pytest || return 1
  ls python/stoker/_stoker*.so >/dev/null 2>&1 || build || return 1
  timeout 300 "$PY" -m pytest -q -p no:cacheprovider benchmarks/gpu/test_on_gpu.py \
      tests/loader/gpu/test_gpu_last_mile.py -k "not torchs_one_warning" 2>&1 | tee "$OUTDIR/gpu-tests.txt"
}

measure() {
  ls python/stoker/_stoker*.so >/dev/null 2>&1 || build || return 1
  timeout 300 "$PY" benchmarks/gpu/measure.py "$OUTDIR/gpu.md"
}

status=0
case "$STAGE" in
  build) build || status=$? ;;
  test) tests || status=$? ;;
  measure) measure || status=$? ;;
  all) { build && { tests; t=$?; measure; m=$?; [ $t -eq 0 ] && [ $m -eq 0 ]; }; } || status=1 ;;
  *) echo "usage: run.sh [build|test|measure]" >&2; exit 2 ;;
esac
exit $status
