# moestream front door. `make demo` and `make test` do all set-up themselves.
#   make build   set-up (private llama.cpp prefix + Debian 12 packages), configure, compile
#   make test    build + every test (unit, gates against llama.cpp, sanitizers, the app page in
#                Debian's chromium: scripts/setup-browser.sh installs it and playwright-core)
#   make demo    build + synthesize a small model + stream it and print the stats
#   make format  clang-format the sources
# Env knobs (read here): JOBS (parallel compile/test jobs, default nproc),
#   BUILD_DIR (default build), DEMO_MODEL (a GGUF to run instead of the synth one).
JOBS      ?= $(shell nproc)
BUILD_DIR ?= build
CMAKE     ?= cmake
DEMO_DIR  ?= $(BUILD_DIR)/demo

.PHONY: all setup build test demo format clean

all: build

setup:
	@scripts/setup-deps.sh

$(BUILD_DIR)/CMakeCache.txt: | setup
	$(CMAKE) -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: setup $(BUILD_DIR)/CMakeCache.txt
	$(CMAKE) --build $(BUILD_DIR) -j $(JOBS)

test: build
	scripts/setup-browser.sh
	scripts/run-tests.sh $(BUILD_DIR)

demo: build
	scripts/demo.sh $(BUILD_DIR)

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h')

clean:
	rm -rf $(BUILD_DIR)
