# meshtrain — a thin front over CMake. The targets a user needs:
#   make          Release build into build/
#   make run      install missing packages, build the meshtrain binary only, train the default deck
#                 (input/default.toml)
#   make test     install missing packages, build everything, run every test that applies here
#   make bench    the benchmarks (speed ratios against this machine's own ceilings)
#   make fuzz     the libFuzzer harnesses (clang, ASan + UBSan) for FUZZ_SECONDS each
#   make clean
# MPI=mpich (or openmpi) on any of them builds against that MPI and its parallel HDF5; MPICH
# builds into build-mpich/ (CUDA off), beside the default Open MPI build.
BUILD     ?= build
JOBS      ?= $(shell nproc)
CMAKE_ARGS ?=
# `make run` launches this many local MPI ranks on the default deck's layout.
RANKS     ?= 8
DECK      ?= input/default.toml
# `make test SANITIZE=address,undefined`: a separate build (CPU only) with those sanitizers.
SANITIZE  ?=
ifneq ($(SANITIZE),)
BUILD     := build-sanitize
CMAKE_ARGS += -DMESHTRAIN_SANITIZERS=$(SANITIZE) -DMESHTRAIN_CUDA=OFF
# Memory errors and UB end a test; leaks are not checked here: Open MPI's components, loaded and
# unloaded at run time, leave allocations no suppression can name. The fuzz harnesses (no MPI)
# run with LeakSanitizer on.
export ASAN_OPTIONS = detect_leaks=0:abort_on_error=1
export UBSAN_OPTIONS = print_stacktrace=1:halt_on_error=1
endif
# `make MPI=mpich ...`: a separate build against MPICH. Empty: the system's default mpicxx.
MPI       ?=
ifneq ($(MPI),)
CMAKE_ARGS += -DMESHTRAIN_MPI=$(MPI)
endif
ifeq ($(MPI),mpich)
BUILD     := $(BUILD)-mpich
CMAKE_ARGS += -DMESHTRAIN_CUDA=OFF
endif
# CUDA=AUTO|ON|OFF: the CUDA backend (empty: AUTO, built wherever nvcc, cuDNN and NCCL are found).
# `make run` configures a new build directory without it when no GPU is visible (nvidia-smi lists
# none): the run could not use it, and nvcc compiling every kernel was most of a fresh `make run`.
# It marks that choice in $(BUILD)/.cuda-off-for-run, so that `make test` and `make` (which build
# everything) turn the backend back on; CUDA=AUTO (or ON) on `make run` builds it anyway.
CUDA      ?=
GPU_VISIBLE := $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo yes)
CUDA_RUN_OFF := $(BUILD)/.cuda-off-for-run
# `make fuzz`: a separate clang build with sanitizers; seconds each harness runs.
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_HARNESSES := $(patsubst fuzz/%_fuzz.cpp,%,$(wildcard fuzz/*_fuzz.cpp))

.PHONY: all deps deps-test deps-fuzz configure configure-run build run test bench fuzz clean

all: build

deps:
	@scripts/ensure-deps.sh build $(MPI)

# The tests' packages, then the judges' pinned Python environment (scripts/judges.py: made once
# per machine, in a cache folder every clone reuses).
deps-test:
	@scripts/ensure-deps.sh test $(MPI)
	@python3 scripts/judges.py ensure

deps-fuzz:
	@scripts/ensure-deps.sh fuzz

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(if $(CUDA),-DMESHTRAIN_CUDA=$(CUDA)) $(CMAKE_ARGS)

# Everything (tests and, where nvcc is, the CUDA backend): a build directory that `make run`
# configured without CUDA is configured again with it, unless CUDA= says otherwise.
configure: deps
	@if [ -f $(CUDA_RUN_OFF) ] && [ -z "$(CUDA)" ]; then \
	  cmake -S . -B $(BUILD) -DMESHTRAIN_CUDA=AUTO && rm -f $(CUDA_RUN_OFF); fi
	@$(MAKE) --no-print-directory $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Only the binary the run needs; a new build directory without CUDA when no GPU is visible.
configure-run: deps
	@if [ ! -f $(BUILD)/CMakeCache.txt ] && [ -z "$(CUDA)" ] && [ -z "$(GPU_VISIBLE)" ] && \
	    ! echo "$(CMAKE_ARGS)" | grep -q MESHTRAIN_CUDA; then \
	  echo "meshtrain: no GPU visible (nvidia-smi): building without the CUDA backend (CUDA=AUTO builds it)"; \
	  cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_CUDA=OFF $(CMAKE_ARGS) && \
	  touch $(CUDA_RUN_OFF); \
	else $(MAKE) --no-print-directory $(BUILD)/CMakeCache.txt; fi

run: configure-run
	cmake --build $(BUILD) -j $(JOBS) --target meshtrain
	MESHTRAIN_BIN=$(BUILD)/meshtrain scripts/run-local.sh $(RANKS) $(DECK)

# With CTEST_ARGS, only the executables of the tests they select are built (all of them without).
# CTest runs JOBS at once: a multi-rank test declares its ranks (PROCESSORS) and runs alone where
# they fill the machine, while single-process tests share it.
test: deps-test configure
	scripts/build-for-tests.py $(BUILD) $(JOBS) $(CTEST_ARGS)
	cd $(BUILD) && ctest -j $(JOBS) --output-on-failure --timeout 1200 $(CTEST_ARGS)

# Each suite measures its ceiling in the same run; multi-rank suites run on 2 local ranks (the
# pipeline suite also on 4). The step suite runs twice: on one rank at 1 and 2 threads, then data
# parallel on 2 ranks x 1 thread; then Llama 3's block at the same sizes on one rank.
bench: build
	$(BUILD)/meshtrain bench --suite step --threads 2
	$(BUILD)/meshtrain bench --suite step --threads 2 --model llama
	MESHTRAIN_BIN=$(BUILD)/meshtrain scripts/run-local-bench.sh 2 step --threads 1
	MESHTRAIN_BIN=$(BUILD)/meshtrain scripts/run-local-bench.sh 2 comm
	MESHTRAIN_BIN=$(BUILD)/meshtrain scripts/run-local-bench.sh 2 pipeline
	MESHTRAIN_BIN=$(BUILD)/meshtrain scripts/run-local-bench.sh 4 pipeline
	MESHTRAIN_BIN=$(BUILD)/meshtrain scripts/run-local-bench.sh 2 zero
	MESHTRAIN_BIN=$(BUILD)/meshtrain scripts/run-local-bench.sh 2 checkpoint
	MESHTRAIN_BIN=$(BUILD)/meshtrain scripts/run-local-bench.sh 4 hetero
	MESHTRAIN_BIN=$(BUILD)/meshtrain scripts/run-local-bench.sh 5 async
	MESHTRAIN_BIN=$(BUILD)/meshtrain scripts/run-local-bench.sh 2 moe
	scripts/advisor-accuracy.py --ranks 8 --bin $(BUILD)/meshtrain

$(FUZZ_BUILD)/CMakeCache.txt:
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DMESHTRAIN_FUZZ=ON \
	  -DMESHTRAIN_CUDA=OFF -DMESHTRAIN_TESTS=OFF -DMESHTRAIN_NATIVE=OFF

# Fails when any harness finds a crash, leak, UB or hang; the input is kept under
# $(FUZZ_BUILD)/fuzz-artifacts/ (scripts/run-fuzz.sh).
fuzz: deps-fuzz $(FUZZ_BUILD)/CMakeCache.txt
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target $(FUZZ_HARNESSES:%=%_fuzz)
	scripts/run-fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_HARNESSES)

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD)
