# meshtrain — a thin front over CMake. The targets a user needs:
#   make          Release build into build/
#   make run      install missing packages, build, train the default deck (input/default.toml)
#   make test     install missing packages, build, run every test that applies to this machine
#   make bench    the benchmarks (speed ratios against this machine's own ceilings)
#   make clean
BUILD     ?= build
JOBS      ?= $(shell nproc)
CMAKE_ARGS ?=
# `make run` launches this many local MPI ranks on the default deck's layout.
RANKS     ?= 8
DECK      ?= input/default.toml

.PHONY: all deps deps-test configure build run test bench clean

all: build

deps:
	@scripts/ensure-deps.sh build

deps-test:
	@scripts/ensure-deps.sh test

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

run: build
	scripts/run-local.sh $(RANKS) $(DECK)

test: deps-test configure
	cmake --build $(BUILD) -j $(JOBS)
	cd $(BUILD) && ctest --output-on-failure --timeout 1200 $(CTEST_ARGS)

# Each suite measures its ceiling in the same run; multi-rank suites run on 2 local ranks.
bench: build
	$(BUILD)/meshtrain bench --suite step
	MESHTRAIN_BIN=$(BUILD)/meshtrain scripts/run-local-bench.sh 2 comm
	MESHTRAIN_BIN=$(BUILD)/meshtrain scripts/run-local-bench.sh 2 pipeline
	MESHTRAIN_BIN=$(BUILD)/meshtrain scripts/run-local-bench.sh 2 zero
	MESHTRAIN_BIN=$(BUILD)/meshtrain scripts/run-local-bench.sh 2 checkpoint

clean:
	rm -rf $(BUILD)
