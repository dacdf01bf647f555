# Every target creates (or reuses) .venv and installs what it needs: a fresh clone needs only
# python3, a C++20 compiler and (for the C++ tests) Debian's libgtest-dev, which we install on demand.
PYTHON   ?= python3
VENV     := .venv
VPY      := $(VENV)/bin/python
DEPS     := $(VENV)/.deps-stamp
CPPBUILD := build/cpp
JOBS     ?= 2

PY_DEPS := torch==2.13.0 numpy "cloudpickle>=3.0,<4" pytest pytest-timeout hypothesis psutil pillow tqdm prometheus_client nanobind scikit-build-core cmake ninja ruff mypy==2.4.1
# The frameworks the integration tests run (tests/loader/integrations/test_frameworks.py), pinned; torch stays pinned.
FW_REQS  := tests/requirements-frameworks.txt
FW_DEPS  := $(VENV)/.frameworks-stamp
# tests/vision (Mosaic's streaming, which imports torchvision): their own venv, since PyPI's
# torchvision needs its own torch build (tests/requirements-vision.txt).
VVENV    := .venv-vision
VPY_V    := $(VVENV)/bin/python
VISION_REQS := tests/requirements-vision.txt
VISION_DEPS := $(VVENV)/.deps-stamp

# The free-threaded leg (make test-ft): its own venv from FT_PYTHON, a free-threaded CPython.
FT_VENV  := .venv-ft
FT_VPY   := $(FT_VENV)/bin/python
FT_DEPS  := $(FT_VENV)/.deps-stamp
# torch's cp314t wheel (a CUDA build, ~3 GB, that runs on the CPU); no pillow, hypothesis or
# frameworks: the leg's tests need none of them.
FT_PY_DEPS := torch==2.14.1 numpy "cloudpickle>=3.0,<4" pytest pytest-timeout psutil nanobind scikit-build-core cmake ninja

.PHONY: all demo soak test test-quick test-cpp test-py test-vision test-ft bench torch-suite lint format fuzz sanitize sanitize-extension stubs install sysdeps clean mutate

all: install

$(DEPS): pyproject.toml Makefile
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q $(PY_DEPS)
	touch $@

# Debian packages the C++ tests need; installed only when missing.
sysdeps:
	@if [ ! -f /usr/include/gtest/gtest.h ]; then \
	  echo "installing libgtest-dev (GoogleTest) with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev; \
	fi

$(FW_DEPS): $(DEPS) $(FW_REQS)
	$(VPY) -m pip install -q -r $(FW_REQS) torch==2.13.0
	touch $@

install: $(DEPS)
	$(VPY) -m pip install -q --no-build-isolation --no-deps .

test: test-cpp test-py test-vision

# While working: the unit tier (no process started; tests/support/tiers.py), well under a minute
# once the package is built. `make test` runs every tier (unit, scenario, system), as CI does.
test-quick: install
	$(VPY) -m pytest -q -m unit -p no:cacheprovider tests

test-cpp: $(DEPS) sysdeps
	$(VENV)/bin/cmake -S . -B $(CPPBUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTOKER_BUILD_TESTS=ON -DSTOKER_BUILD_PYTHON=OFF
	$(VENV)/bin/cmake --build $(CPPBUILD) -j $(JOBS)
	cd $(CPPBUILD) && ../../$(VENV)/bin/ctest --output-on-failure -j $(JOBS)

test-py: install $(FW_DEPS)
	$(VPY) -m pytest -q tests

$(VISION_DEPS): $(VISION_REQS) pyproject.toml Makefile
	test -x $(VPY_V) || $(PYTHON) -m venv $(VVENV)
	$(VPY_V) -m pip install -q -r $(VISION_REQS) "cloudpickle>=3.0,<4" pytest pytest-timeout psutil nanobind scikit-build-core cmake ninja
	$(VPY_V) -m pip install -q --no-deps mosaicml-streaming==0.13.0
	touch $@

test-vision: $(VISION_DEPS)
	$(VPY_V) -m pip install -q --no-build-isolation --no-deps .
	$(VPY_V) -m pytest -q tests/vision

# The free-threaded leg: the thread, fault, start-method and binding tests (FREE_THREADING in
# tests/support/tiers.py) on a free-threaded Python (3.14t), with the GIL left to the
# interpreter. No registry serves such an interpreter, so CI cannot run this: run it by hand
# before you stop, with FT_PYTHON naming one you built (docs/develop.md says how). About
# 13 minutes on two cores shared with other runs, once .venv-ft exists (FT_PYTEST_ARGS: more
# pytest arguments, -k or -x).
ifneq ($(filter test-ft,$(MAKECMDGOALS)),)
ifeq ($(FT_PYTHON),)
$(error make test-ft needs FT_PYTHON=/path/to/python3.14t, a free-threaded CPython; docs/develop.md says how to build one)
endif
endif
$(FT_DEPS): pyproject.toml Makefile
	test -x $(FT_VPY) || $(FT_PYTHON) -m venv $(FT_VENV)
	$(FT_VPY) -c "import sys, sysconfig; sys.exit(0 if sysconfig.get_config_var('Py_GIL_DISABLED') else 'make test-ft: $(FT_PYTHON) has a GIL by build: FT_PYTHON must name a free-threaded one (configure --disable-gil)')"
	$(FT_VPY) -m pip install -q $(FT_PY_DEPS)
	touch $@

test-ft: $(FT_DEPS)
	$(FT_VPY) -m pip install -q --no-build-isolation --no-deps .
	env -u PYTHON_GIL $(FT_VPY) -m pytest -q -p no:cacheprovider -m "free_threading and not system" $(FT_PYTEST_ARGS) $$($(FT_VPY) tests/support/tiers.py free-threading)

demo: install
	$(VPY) examples/demo.py

# The chaos soak (tests/soak/chaos.py): workers killed at random for SOAK_SECONDS (10 minutes)
# under every phase; a JSON report in build/soak.json. A 20 s run of it is in `make test`. With
# Ray installed, root and `unshare`, a phase with Ray actors too, on a loopback-only cluster
# (tests/soak/with_ray.sh).
soak: install
	mkdir -p build
	if $(VPY) -c "import ray" 2>/dev/null && [ "$$(id -u)" = 0 ] && command -v unshare >/dev/null; then \
	  PY=$(abspath $(VPY)) tests/soak/with_ray.sh --seconds $${SOAK_SECONDS:-600} --json build/soak.json; \
	else \
	  $(VPY) tests/soak/chaos.py --seconds $${SOAK_SECONDS:-600} --json build/soak.json; \
	fi

# Peers are optional: each is installed when PyPI has it for this machine, skipped otherwise.
bench: install
	$(VPY) -m pip install -q matplotlib urllib3 || true
	$(VPY) -m pip install -q --no-deps torchdata || true
	$(VPY) -m pip install -q grain spdl || true
	$(VPY) -m stoker bench --plot docs/throughput.png --json build/bench.json
	$(VPY) -m stoker bench --workloads remote --json build/bench-remote.json

# torch's own test/test_dataloader.py, run once with torch's DataLoader and once with stoker's in
# its place: a yardstick of compatibility, not part of `make test` (tests there fail by design).
# stoker does not ship torch's file: TORCH_TEST_FILE=/path/to/test_dataloader.py names the copy
# you downloaded (benchmarks/torch_suite/README.md: which revision, the curl line).
# Results: build/torch_suite/results.{md,json}. Options: TORCH_SUITE_ARGS="--timeout 120 -k EXPR".
# torch.testing._internal (in the torch wheel) needs expecttest.
ifneq ($(filter torch-suite,$(MAKECMDGOALS)),)
ifeq ($(TORCH_TEST_FILE),)
$(error make torch-suite needs TORCH_TEST_FILE=/path/to/test_dataloader.py, PyTorch's own test file, which stoker does not ship; `python3 benchmarks/torch_suite/run.py` prints where to get it)
endif
endif
torch-suite: install
	$(VPY) -m pip install -q expecttest
	$(VPY) benchmarks/torch_suite/run.py --test-file "$(TORCH_TEST_FILE)" --out build/torch_suite $(TORCH_SUITE_ARGS)

fuzz: $(DEPS) sysdeps
	$(VENV)/bin/cmake -S . -B $(CPPBUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTOKER_BUILD_TESTS=ON -DSTOKER_BUILD_PYTHON=OFF
	$(VENV)/bin/cmake --build $(CPPBUILD) -j $(JOBS)
	STOKER_FUZZ_SECONDS=$${STOKER_FUZZ_SECONDS:-300} $(CPPBUILD)/wire_fuzz_test

# The C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer (with a short run of the wire
# fuzzer), then the threaded tests under ThreadSanitizer. Separate build folders; not part of
# `make test`. STOKER_FUZZ_SECONDS sets the fuzzer's run (default 20 s).
TSAN_TESTS := supervisor_threads_test slot_test slot_pool_test status_test channel_test segment_test
sanitize: $(DEPS) sysdeps
	$(VENV)/bin/cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTOKER_BUILD_TESTS=ON -DSTOKER_BUILD_PYTHON=OFF -DSTOKER_SANITIZE=address,undefined
	$(VENV)/bin/cmake --build build/asan -j $(JOBS)
	cd build/asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 $(abspath $(VENV))/bin/ctest --output-on-failure -j $(JOBS) -E wire_fuzz_test
	ASAN_OPTIONS=detect_leaks=1 STOKER_FUZZ_SECONDS=$${STOKER_FUZZ_SECONDS:-20} build/asan/wire_fuzz_test
	$(VENV)/bin/cmake -S . -B build/tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTOKER_BUILD_TESTS=ON -DSTOKER_BUILD_PYTHON=OFF -DSTOKER_SANITIZE=thread
	$(VENV)/bin/cmake --build build/tsan -j $(JOBS) --target $(TSAN_TESTS)
	for t in $(TSAN_TESTS); do TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build/tsan/$$t || exit 1; done

# The Python extension itself under ASan + UBSan: an instrumented build in build/asan-py, run by
# the pytest files that use it hardest, with the runtime preloaded (tests/sanitize_extension.sh).
# In CI. A hang fails it, but for libasan's own fork deadlock (GCC 12's libasan has no fork
# handler), which tests/sanitize_watch.py tells by where the hung process waits and runs again.
sanitize-extension: $(DEPS)
	JOBS=$(JOBS) tests/sanitize_extension.sh

# Mutation testing of the pure parts (docs/mutation.md): mutmut over the modules that need no
# process, against the unit tier, on a staged copy of the package that the tests import
# (tools/mutate.py); per-module scores in build/mutate/report.md. Not in CI: ~11 minutes on two
# cores. MUTATE_ARGS="--rev HEAD" stages a commit, "--modules loader/resume/order.py" a subset.
mutate: install
	$(VPY) -m pip install -q "mutmut==3.8.1"
	$(VPY) tools/mutate.py --survivors $(MUTATE_ARGS)

# The extension's type stubs (python/stoker/_stoker.pyi), from the built module; a test checks
# that the committed copy is current.
stubs: install
	$(VPY) -m nanobind.stubgen -q -m stoker._stoker -o python/stoker/_stoker.pyi

lint: $(DEPS)
	@command -v clang-format >/dev/null || (apt-get update -qq && apt-get install -y -qq clang-format)
	clang-format --dry-run --Werror cpp/stoker/*.h cpp/stoker/*.cc cpp/tests/*.cc python/stoker/_ext/*.cc
	$(VENV)/bin/ruff check python tests benchmarks examples tools
	$(VPY) tools/typecheck.py

format: $(DEPS)
	clang-format -i cpp/stoker/*.h cpp/stoker/*.cc cpp/tests/*.cc python/stoker/_ext/*.cc
	$(VENV)/bin/ruff check --fix python tests benchmarks examples

clean:
	rm -rf build $(VENV) $(VVENV)
