#!/usr/bin/env bash
# The last mile on a real GPU (docs/design/gpu.md): builds the extension against this machine's
# Python and torch, runs the GPU checks (test_on_gpu.py), then measures the image workload to
# the device against torch in the same run (measure.py). Writes $OUT/gpu.md (or build/gpu.md).
# Needs: a CUDA GPU, torch with CUDA, cmake, ninja, nanobind (pip-installed if absent). < 8 min.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
OUTDIR=${OUT:-build}
mkdir -p "$OUTDIR" build/gpu
"$PY" -c "import torch, sys; assert torch.cuda.is_available(), 'no CUDA GPU here'; \
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
"$PY" -c "import nanobind" 2>/dev/null || "$PY" -m pip install -q nanobind
"$PY" -c "import pytest" 2>/dev/null || "$PY" -m pip install -q pytest
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTOKER_BUILD_TESTS=OFF \
      -DSTOKER_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v "$PY")" > build/gpu/cmake.log
cmake --build build/gpu -j "$(nproc)" > build/gpu/build.log
cp build/gpu/_stoker*.so python/stoker/
export PYTHONPATH="$PWD/python:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
status=0
timeout 240 "$PY" -m pytest -q -p no:cacheprovider benchmarks/gpu/test_on_gpu.py \
    tests/test_gpu_last_mile.py -k "not torchs_one_warning" 2>&1 | tee "$OUTDIR/gpu-tests.txt" || status=$?
timeout 240 "$PY" benchmarks/gpu/measure.py "$OUTDIR/gpu.md" || status=$?
rm -f python/stoker/_stoker*.so
exit $status
