# moestream front door. `make demo` and `make test` do all set-up themselves.
#   make build   set-up (private llama.cpp prefix + Debian 12 packages), configure, compile
#   make test    build + every test (unit, gates against llama.cpp, the app page in Debian's
#                chromium: scripts/setup-browser.sh installs it and playwright-core; the API
#                through the openai npm SDK: scripts/setup-api-tests.sh), then
#                the sanitizer builds (ASan+UBSan, TSan), a libFuzzer smoke run
#                (docs/reliability.md) and the arm64 gates (a cross build run under
#                qemu-user, docs/arm64.md)
#   make test-asan / test-tsan / fuzz-smoke / test-arm64   one of those steps alone
#   make fuzz-long [FUZZ_SECONDS=900]          the documented long fuzz run (nice 19)
#   make demo    build + stream the trained demo model (models/, tools/train) and print the stats
#   make format  clang-format the sources
# Env knobs (read here): JOBS (parallel compile/test jobs, default nproc),
#   BUILD_DIR (default build), BUILD_ARM64 (the arm64 cross build, default build-arm64),
#   DEMO_MODEL (the GGUF `make demo` runs; default the trained byte-level MoE in models/;
#   empty = a random-weight `moestream synth` model).
JOBS      ?= $(shell nproc)
BUILD_DIR ?= build
CMAKE     ?= cmake
BUILD_ARM64 ?= build-arm64
DEMO_DIR  ?= $(BUILD_DIR)/demo
DEMO_MODEL ?= models/moestream-linuxdoc-4l32e-q4_k_m.gguf
export DEMO_MODEL

FUZZ_SECONDS ?= 900

.PHONY: all setup build test test-unit test-asan test-tsan test-arm64 fuzz-smoke fuzz-long demo format clean

all: build

setup:
	@scripts/setup-deps.sh

# -O2 with line tables only (-g1: backtraces and profiles keep file:line; a third less compile
# time than -g, docs/reliability.md "CI time"). Configure your own tree with -g to debug.
$(BUILD_DIR)/CMakeCache.txt: | setup
	$(CMAKE) -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"

build: setup $(BUILD_DIR)/CMakeCache.txt
	$(CMAKE) --build $(BUILD_DIR) -j $(JOBS)

test: test-unit test-asan test-tsan fuzz-smoke test-arm64

test-unit: build
	scripts/setup-browser.sh
	scripts/setup-api-tests.sh
	bench/setup.sh
	scripts/run-tests.sh $(BUILD_DIR)

test-asan: setup
	JOBS=$(JOBS) scripts/sanitize.sh asan

test-tsan: setup
	JOBS=$(JOBS) scripts/sanitize.sh tsan

test-arm64:
	JOBS=$(JOBS) BUILD_ARM64=$(BUILD_ARM64) scripts/arm64-gates.sh

fuzz-smoke: build
	JOBS=$(JOBS) MOESTREAM_BIN=$(CURDIR)/$(BUILD_DIR)/bin/moestream scripts/fuzz.sh smoke

fuzz-long: build
	JOBS=$(JOBS) MOESTREAM_BIN=$(CURDIR)/$(BUILD_DIR)/bin/moestream scripts/fuzz.sh long $(FUZZ_SECONDS)

demo: build
	scripts/demo.sh $(BUILD_DIR)

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h')

clean:
	rm -rf $(BUILD_DIR) $(BUILD_ARM64) build-asan build-tsan build-fuzz
