#!/usr/bin/env bash
# The Python extension (python/stoker/_ext: reference counts, slot lifetimes, the buffers handed
# to torch and NumPy) under AddressSanitizer + UndefinedBehaviorSanitizer, driven by the pytest
# files that use it hardest: `make sanitize-extension`, run by CI. A report from the sanitizers
# is a bug. So is a hang, but for one known to be libasan's: GCC 12's libasan installs no fork
# handler, so a worker forked while another thread of its parent held one of libasan's own locks
# waits on it forever (fixed in LLVM's compiler-rt by llvm/llvm-project#75290, after GCC 12).
# Once in eight CI runs a loader's workers hung so in test_compat. tests/sanitize_watch.py runs
# pytest and, when it stalls, looks where every process waits: a wait made from inside
# libasan's own code is that deadlock and the run goes again (three runs in all); any other
# hang fails it, with every process's stacks in the log. tests/sanitize_fork_stress.py
# reproduces the deadlock in seconds (the child waits in SizeClassAllocator64's region lock).
#
# The instrumented module goes into a copy of the package (build/asan-py/pkg), never into
# python/stoker, so nothing else can import it by accident. ASan's runtime is preloaded into
# every Python process the tests start (workers inherit it). A report fails the run (ASan's:
# one log per process under build/asan-py/logs; UBSan's: see below).
#
# Not run here, because they cannot pass under ASan by design: the tests that measure memory
# growth (ASan keeps freed memory in quarantine) and the fault tests that kill a worker with
# SIGBUS on purpose (ASan's handler answers the signal first).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}  # (make sanitize-extension VENV=... passes its own)
B=build/asan-py
if [ "$VENV" != .venv ]; then  # another interpreter (3.14t's .venv-ft): a build of its own
  B=$B-$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("SOABI"))')
fi
"$VENV/bin/cmake" -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTOKER_BUILD_TESTS=OFF \
  -DSTOKER_BUILD_PYTHON=ON -DSTOKER_SANITIZE=address,undefined \
  -Dnanobind_DIR="$("$VENV/bin/python" -m nanobind --cmake_dir)" \
  -DPython_EXECUTABLE="$(cd "$VENV" && pwd)/bin/python" > /dev/null
"$VENV/bin/cmake" --build "$B" -j "${JOBS:-2}"

rm -rf "$B/pkg" "$B/logs"
mkdir -p "$B/pkg" "$B/logs"
cp -r python/stoker "$B/pkg/stoker"
rm -f "$B/pkg/stoker/"_stoker*.so
cp "$B"/_stoker*.so "$B/pkg/stoker/"

# The runtimes the instrumented module was linked with (whatever compiler CMake chose).
libasan=$(ldd "$B"/_stoker*.so | awk '/libasan/ {print $3}')
libubsan=$(ldd "$B"/_stoker*.so | awk '/libubsan/ {print $3}')
for lib in "$libasan" "$libubsan"; do
  [ -f "$lib" ] || { echo "sanitize_extension: ASan/UBSan runtime not found (ldd: '$lib')" >&2; exit 2; }
done
logs=$PWD/$B/logs
# -s: a report must reach this log even from the pytest process itself (pytest's capture would
# swallow it with the process). ASan writes each process's report to its own file, whatever
# process it is in. UBSan's go to stderr (it ignores log_path next to ASan's runtime): pytest's
# and its workers' reach this log; in a subprocess a test starts with its output captured, the
# report makes that process exit 1, which fails the test unless the test expects that process
# to die.
status=0
# py-spy: the watch's stacks of a hung process (native and Python); optional.
"$VENV/bin/python" -m pip install -q py-spy > /dev/null 2>&1 || true
: > "$B/pytest.log"
PYTHONPATH="$PWD/$B/pkg:$PWD/tests" \
LD_PRELOAD="$libasan $libubsan" \
ASAN_OPTIONS="detect_leaks=0:handle_segv=0:handle_sigbus=0:handle_abort=0:log_path=$logs/asan" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
STOKER_TEST_TIMEOUT_S=0 \
  "$VENV/bin/python" tests/sanitize_watch.py "$B/pytest.log" "${SANITIZE_STALL_S:-240}" -- \
    "$VENV/bin/python" -m pytest -q -s -p no:cacheprovider \
    ${SANITIZE_TESTS:-tests/wire/test_values.py tests/loader/test_compat.py tests/wire/test_fidelity.py \
    tests/datasets/test_shared_list.py tests/wire/test_spawn_start.py tests/loader/gpu/test_gpu_last_mile.py \
    tests/loader/test_errors.py tests/test_bindings_under_threads.py} -k "not SIGBUS" || status=$?
tail -3 "$B/pytest.log"

pattern="runtime error:|ERROR: AddressSanitizer|ERROR: LeakSanitizer"
if grep -qlE "$pattern" "$logs"/* "$B/pytest.log" 2> /dev/null; then
  echo "sanitizer reports from the extension:" >&2
  grep -B2 -A30 -E "$pattern" "$B/pytest.log" | head -80 >&2 || true
  for f in "$logs"/*; do [ -e "$f" ] && { echo "== $f" >&2; head -40 "$f" >&2; }; done
  exit 1
fi
[ "$status" -eq 0 ] || echo "pytest failed under the sanitizers: $B/pytest.log" >&2
exit "$status"
