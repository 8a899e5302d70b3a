# Thin wrapper over CMake. `make` builds, `make test` tests, `make demo` shows it working.
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
PREFIX     ?= /usr/local
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=

MAKEFLAGS += --no-print-directory

C_SOURCES = $(shell find include src tests tools cuda python bench \
                \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null)

.PHONY: all build test demo install asan tsan format clean

all: build

# Configure once; afterwards `cmake --build` re-runs CMake itself when CMakeLists change.
$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) --parallel $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure --parallel $(JOBS)
	@if command -v $(PYTHON) >/dev/null 2>&1; then $(MAKE) python-test; \
	 else echo "*** $(PYTHON) not found: the Python tests were SKIPPED (install python3) ***"; fi

demo: build
	$(BUILD)/flashattn verify
	$(BUILD)/flashattn demo
	$(BUILD)/flashattn bench --quick --csv $(BUILD)/bench-demo.csv --svg $(BUILD)/bench-demo.svg

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# Everything (library, tool, tests) under AddressSanitizer + UndefinedBehaviorSanitizer.
asan:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g" \
	    -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
	    -DFA_SANITIZE=ON -DFA_CUDA=OFF $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) --parallel $(JOBS)
	ctest --test-dir $(ASAN_BUILD) --output-on-failure --parallel $(JOBS)

# The thread pool under ThreadSanitizer: the threaded test suites (contexts of 1 to 8 threads,
# application threads sharing a context, hundreds of short calls, split decode, calls cancelled
# from another thread). test_kvcache runs as two tests there, its determinism group
# (threads x num_splits) beside the others.
tsan:
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g" \
	    -DFA_TSAN=ON -DFA_CUDA=OFF $(CMAKE_ARGS)
	cmake --build $(TSAN_BUILD) --parallel $(JOBS) --target test_threads test_kvcache test_cancel
	ctest --test-dir $(TSAN_BUILD) --output-on-failure --parallel $(JOBS) \
	    -R '^test_(threads|cancel|kvcache_tsan_.*)$$'

format:
	clang-format -i $(C_SOURCES)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) build-aarch64 build-gpu

# ---------------------------------------------------------------------------------------------
# Python package (python/, pyproject.toml). A virtual environment in $(VENV) holds what the
# tests need; `make python-test` (part of `make test`) builds the wheel, installs it there and
# runs pytest against the installed package. `make test-torch` adds PyTorch (a multi-GB
# download) so the torch tests run too; without torch they are skipped.
# ---------------------------------------------------------------------------------------------
PYTHON      ?= python3
VENV        ?= .venv
VENV_PY      = $(VENV)/bin/python
PY_DEPS      = numpy pytest ml_dtypes scikit-build-core
TORCH_SPEC  ?= torch
# clients tested against flashattn in the torch tests (pure Python, no compiled code)
# (transformers and kernels: flashattn.integrations.transformers, python/tests/test_transformers.py)
TORCH_CLIENTS ?= ring-flash-attn==0.1.8 transformers==5.25.0 kernels==0.19.1
PYTEST_ARGS ?=

.PHONY: venv wheel python-test torch-venv test-torch

$(VENV)/.deps-ok:
	$(PYTHON) -m venv $(VENV)
	$(VENV_PY) -m pip install --quiet --disable-pip-version-check $(PY_DEPS)
	@touch $@

venv: $(VENV)/.deps-ok

# dist/flashattn-<version>-py3-none-<platform>.whl, built by scikit-build-core from the venv
# (no build isolation: nothing is downloaded), reusing $(BUILD)/wheel between builds.
wheel: $(VENV)/.deps-ok
	@rm -f dist/flashattn-*.whl
	$(VENV_PY) -m pip wheel --quiet --disable-pip-version-check --no-build-isolation --no-deps \
	    --wheel-dir dist --config-settings=build-dir=$(BUILD)/wheel .
	@ls -l dist/flashattn-*.whl

python-test: wheel
	$(VENV_PY) -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
	    dist/flashattn-*.whl
	env -u FLASHATTN_LIBRARY FLASHATTN_EXPECT_INSTALLED=1 $(VENV_PY) -m pytest python/tests \
	    $(PYTEST_ARGS)

$(VENV)/.torch-ok: $(VENV)/.deps-ok
	$(VENV_PY) -m pip install --quiet --disable-pip-version-check $(TORCH_SPEC) $(TORCH_CLIENTS)
	@touch $@

torch-venv: $(VENV)/.torch-ok

test-torch: $(VENV)/.torch-ok
	@$(MAKE) python-test

# ---------------------------------------------------------------------------------------------
# Fuzzing the doctor's input readers with libFuzzer (clang; not part of `make test`, which
# replays the corpora in test_fuzz_replay). FUZZ_SECONDS per target; new inputs go to
# $(FUZZ_BUILD)/corpus-<target>, crashes to $(FUZZ_BUILD)/crash-*.
# ---------------------------------------------------------------------------------------------
FUZZ_CC      ?= clang
FUZZ_BUILD   ?= $(BUILD)/fuzz
FUZZ_SECONDS ?= 60
FUZZ_FLAGS    = -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude
FUZZ_TOOL     = tools

.PHONY: fuzz fuzz-build

fuzz-build:
	@mkdir -p $(FUZZ_BUILD)/seeds-elf
	$(FUZZ_CC) $(FUZZ_FLAGS) tests/fuzz/fuzz_explain.c $(FUZZ_TOOL)/explain/logclass.c \
	    $(FUZZ_TOOL)/explain/logmsg.c $(FUZZ_TOOL)/explain/logread.c \
	    $(FUZZ_TOOL)/elf/demangle.c $(FUZZ_TOOL)/cli/json.c \
	    $(FUZZ_TOOL)/wheel/releases.c $(FUZZ_TOOL)/probe/envutil.c -ldl \
	    -o $(FUZZ_BUILD)/fuzz_explain
	$(FUZZ_CC) $(FUZZ_FLAGS) tests/fuzz/fuzz_elf.c $(FUZZ_TOOL)/elf/elfread.c \
	    -o $(FUZZ_BUILD)/fuzz_elf
	$(FUZZ_CC) $(FUZZ_FLAGS) tests/fuzz/fuzz_listing.c $(FUZZ_TOOL)/wheel/releases.c \
	    $(FUZZ_TOOL)/probe/envutil.c \
	    -o $(FUZZ_BUILD)/fuzz_listing
	printf 'int f(void){return 0;}\n' | $(FUZZ_CC) -shared -fPIC -x c - -o $(FUZZ_BUILD)/seeds-elf/tiny.so

fuzz: fuzz-build
	@mkdir -p $(FUZZ_BUILD)/corpus-explain $(FUZZ_BUILD)/corpus-elf $(FUZZ_BUILD)/corpus-listing
	cd $(FUZZ_BUILD) && ./fuzz_explain -max_total_time=$(FUZZ_SECONDS) -max_len=65536 \
	    -print_final_stats=1 corpus-explain $(CURDIR)/tests/fuzz/corpus/explain \
	    $(CURDIR)/tests/tools/explain/logs
	cd $(FUZZ_BUILD) && ./fuzz_elf -max_total_time=$(FUZZ_SECONDS) -max_len=16384 \
	    -print_final_stats=1 corpus-elf seeds-elf
	cd $(FUZZ_BUILD) && ./fuzz_listing -max_total_time=$(FUZZ_SECONDS) -max_len=65536 \
	    -print_final_stats=1 corpus-listing $(CURDIR)/tests/tools/wheel

# ---------------------------------------------------------------------------------------------
# AArch64: cross-build with Debian's gcc-aarch64-linux-gnu and run the C tests under qemu-user,
# NEON kernels in use (scripts/test-aarch64.sh says which packages; FULL=1 adds the FA_CPU_ISA
# ref and neon reruns, about 2.5x the time).
# ---------------------------------------------------------------------------------------------
AARCH64_BUILD ?= build-aarch64

.PHONY: test-aarch64

test-aarch64:
	JOBS=$(JOBS) scripts/test-aarch64.sh $(AARCH64_BUILD)

# ---------------------------------------------------------------------------------------------
# GPU (a machine with an NVIDIA GPU, nvcc and PyTorch): build the CUDA plug-in for this GPU in
# build-gpu/, run the GPU tests and benchmark the forward against torch SDPA (flash, cuDNN).
# ---------------------------------------------------------------------------------------------
.PHONY: gpu-check

gpu-check:
	scripts/gpu-check.sh
