# Thin wrapper over CMake. `make` builds, `make test` tests, `make demo` shows it working.
BUILD      ?= build
ASAN_BUILD ?= build-asan
PREFIX     ?= /usr/local
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=

MAKEFLAGS += --no-print-directory

C_SOURCES = $(shell find include src tests tools cuda python bench \
                \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null)

.PHONY: all build test demo install asan format clean

all: build

# Configure once; afterwards `cmake --build` re-runs CMake itself when CMakeLists change.
$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) --parallel $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure --parallel $(JOBS)

demo: build
	$(BUILD)/flashattn verify
	$(BUILD)/flashattn demo

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# Everything (library, tool, tests) under AddressSanitizer + UndefinedBehaviorSanitizer.
asan:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g" \
	    -DFA_SANITIZE=ON $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) --parallel $(JOBS)
	ctest --test-dir $(ASAN_BUILD) --output-on-failure --parallel $(JOBS)

format:
	clang-format -i $(C_SOURCES)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
