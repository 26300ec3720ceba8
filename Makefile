# Top-level Makefile: builds every chapter that exists, the tests and the benchmarks.
#   make                  every chapter (NN_name/train)
#   make 01_vanilla_dp    one chapter
#   make test             installs what is missing, builds and runs every test: "N passed, M failed"
#   make compare          installs what is missing, trains every chapter, prints a table, writes plots
#   make bench            one rank, one thread: ours vs PyTorch eager at tiny, small, deep (alternated;
#                         installs torch in a venv on first use, BENCH_TORCH=0 skips), CPU matmul vs OpenBLAS
#   make bench-comm       collective benchmark, nccl-tests style: RANKS=2, LINK="--link-gbps 1 --link-latency-us 50"
#   make bench-tp         07 (TP 2, + sequence parallelism, + overlap) next to 03 on three links, one table:
#                         RANKS=2 PRESET=small STEPS=20
#   make bench-pp         08's four schedules at m = 2, 4, 8, 16: bubble measured, simulated, theory:
#                         RANKS=2 PRESET=small

#   make schedules        08's four pipeline schedules, measured next to ideal: results/schedules.png
#                         PP=4 M=8 PRESET=deep STEPS=10
#   make bench-torch      chapter 01 next to PyTorch eager, same model, batch, device and dtype (needs torch):
#                         ARGS="--preset gpt2 --device cuda --dtype bf16 --steps 30"
#   make diffs            writes docs/diffs/: each chapter's train.cpp against the previous one
#   make plan             09's planner: best configurations, Megatron-LM's Table 1, results/plan_heatmap.png
#   make plan-check       09's planner against runs of 04-08 (and 09) on this machine
#   make deps             only installs missing packages (MPICH, GoogleTest, matplotlib)
# Flags: ARCH=-march=x86-64-v2 for binaries that must run on older CPUs of a cluster (default: native).
# A change of flags (ARCH, CXXFLAGS, CUDA_ARCH, ...) rebuilds what they compile (see FLAGS_STAMP).

MPICXX   ?= $(shell command -v mpicxx 2>/dev/null)
NVCC     ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
PYTHON   ?= python3
ARCH     ?= -march=native
# -fno-math-errno and -fno-trapping-math change no result: they free GCC from keeping errno and the
# floating-point exception flags exact (nothing here reads them), so sqrt is inlined and loops with
# comparisons (clamps, selects, as in GELU's tanh and the softmax's exp) are vectorized.
CXXFLAGS ?= -O3 $(ARCH) -fno-math-errno -fno-trapping-math -std=c++17 -Wall -Wextra -MMD -MP
CPPFLAGS += -Icommon -Itests
BUILD    ?= build

CHAPTERS    := $(sort $(patsubst %/train.cpp,%,$(wildcard [0-9][0-9]_*/train.cpp)))
COMMON_SRC  := $(wildcard common/*.cpp)
COMMON_OBJ  := $(COMMON_SRC:%.cpp=$(BUILD)/%.o)
LIBCOMMON   := $(BUILD)/libcommon.a

# Tests: tests/mpi_*.cpp helpers are shared; a test listed in MPI_TESTS uses the MPI-aware gtest main
# and is run under mpiexec by tests/run_tests.sh (see tests/manifest.txt for the rank counts).
TEST_SRC    := $(wildcard tests/test_*.cpp)
TEST_BIN    := $(TEST_SRC:tests/%.cpp=$(BUILD)/tests/%)
TEST_SUPPORT := $(patsubst %.cpp,$(BUILD)/%.o,$(filter-out tests/test_%.cpp tests/mpi_gtest_main.cpp,$(wildcard tests/*.cpp)))
MPI_TESTS   := $(shell sed -n 's/^\([a-z_0-9]*\) .*mpi_main.*/\1/p' tests/manifest.txt 2>/dev/null)
GTEST_LIBS  := -lgtest -pthread

HAVE_GTEST      := $(shell test -f /usr/include/gtest/gtest.h && echo yes)
HAVE_NCCL       := $(shell test -f /usr/local/cuda/include/nccl.h -o -f /usr/include/nccl.h && echo yes)
HAVE_MATPLOTLIB := $(shell $(PYTHON) -c 'import matplotlib' 2>/dev/null && echo yes)

ifeq ($(MAKELEVEL),0)
$(info found: mpicxx=$(or $(MPICXX),MISSING) nvcc=$(or $(NVCC),none) NCCL=$(or $(HAVE_NCCL),no) \
GoogleTest=$(or $(HAVE_GTEST),MISSING) matplotlib=$(or $(HAVE_MATPLOTLIB),MISSING))
$(info building chapters: $(CHAPTERS))
endif

.PHONY: all deps test tests compare bench bench-comm bench-tp bench-pp schedules bench-torch diffs plan plan-check clean $(CHAPTERS)
all: $(CHAPTERS)

$(CHAPTERS): %: %/train

define need_mpicxx
	@test -n "$(MPICXX)" || { echo "mpicxx not found: run 'make deps' (installs MPICH) or apt-get install mpich libmpich-dev"; exit 1; }
endef

# Every object depends on a file that holds the compile flags and changes only when they do
# (written at the end of this file, once cuda.mk has added its flags): a new ARCH rebuilds everything.
FLAGS_STAMP := $(BUILD)/.flags

$(BUILD)/%.o: %.cpp $(FLAGS_STAMP)
	$(need_mpicxx)
	@mkdir -p $(dir $@)
	$(MPICXX) $(CPPFLAGS) $(CXXFLAGS) -c $< -o $@

$(LIBCOMMON): $(COMMON_OBJ)
	@rm -f $@
	ar rcs $@ $^

%/train: $(BUILD)/%/train.o $(LIBCOMMON)
	$(MPICXX) $(CXXFLAGS) $^ -o $@ -pthread

# Tests link the real objects of libcommon.a, never a copy of the code under test.
$(BUILD)/tests/%: $(BUILD)/tests/%.o $(LIBCOMMON) $(BUILD)/tests/mpi_gtest_main.o $(TEST_SUPPORT)
	$(MPICXX) $(CXXFLAGS) $< $(TEST_SUPPORT) $(if $(filter $*,$(MPI_TESTS)),$(BUILD)/tests/mpi_gtest_main.o,-lgtest_main) \
	  $(LIBCOMMON) $(GTEST_LIBS) -o $@

tests: $(TEST_BIN) $(addsuffix /train,$(CHAPTERS)) $(BUILD)/pipeline_ideal $(PLAN)

deps:
	@scripts/ensure_deps.sh

test:
	@scripts/ensure_deps.sh
	@$(MAKE) --no-print-directory tests
	@tests/run_tests.sh

compare:
	@scripts/ensure_deps.sh
	@$(MAKE) --no-print-directory all
	@scripts/compare.sh

# OpenBLAS's own cblas.h and library (pkg-config knows where Debian puts them), not whichever
# cblas.h the system has: the reference BLAS ships one too, without OpenBLAS's library.
OPENBLAS_CFLAGS = $(shell pkg-config --cflags openblas 2>/dev/null)
OPENBLAS_LIBS   = $(or $(shell pkg-config --libs openblas 2>/dev/null),-lopenblas)
$(BUILD)/matmul_bench: scripts/matmul_bench.cpp $(LIBCOMMON)
	$(MPICXX) $(CPPFLAGS) $(OPENBLAS_CFLAGS) $(CXXFLAGS) $^ $(OPENBLAS_LIBS) -o $@

bench:
	@scripts/ensure_deps.sh --bench
	@$(MAKE) --no-print-directory all $(BUILD)/matmul_bench
	@scripts/bench.sh

bench-tp: all
	@scripts/bench_tp.sh

bench-pp: all
	@scripts/bench_pp.sh

# Chapter 08's pipeline diagram: afab, 1f1b, interleaved and zb-h1, each measured and simulated.
schedules:
	@scripts/ensure_deps.sh
	@$(MAKE) --no-print-directory 08_pipeline $(BUILD)/pipeline_ideal
	@scripts/schedules.sh

# make schedules' ideal panels: each schedule simulated with the same measured pass times.
$(BUILD)/pipeline_ideal: $(BUILD)/scripts/pipeline_ideal.o $(LIBCOMMON)
	$(MPICXX) $(CXXFLAGS) $^ -o $@ -pthread

# The collective benchmark links libcommon.a like a chapter; LINK passes emulated-link flags through.
RANKS ?= 2
LINK  ?=
$(BUILD)/comm_bench: $(BUILD)/scripts/comm_bench.o $(LIBCOMMON)
	$(MPICXX) $(CXXFLAGS) $^ -o $@ -pthread

bench-comm:
	@scripts/ensure_deps.sh
	@$(MAKE) --no-print-directory $(BUILD)/comm_bench
	mpiexec -n $(RANKS) $(BUILD)/comm_bench $(LINK)

# PyTorch eager next to chapter 01. TORCH_PYTHON: an interpreter that has torch (a venv, say), kept
# apart from PYTHON, which the build uses to look for matplotlib.
TORCH_PYTHON ?= $(PYTHON)
ARGS ?=
bench-torch:
	@scripts/ensure_deps.sh
	@$(MAKE) --no-print-directory 01_vanilla_dp
	@PYTHON=$(TORCH_PYTHON) scripts/compare_pytorch.sh $(ARGS)

diffs:
	@scripts/diffs.sh

# Chapter 09's planner: a command-line tool over common/planner.*, no MPI job of its own.
PLAN := 09_3d_parallel/plan
$(PLAN): $(BUILD)/09_3d_parallel/plan.o $(LIBCOMMON)
	$(MPICXX) $(CXXFLAGS) $^ -o $@ -pthread

plan: $(PLAN) ## best DP x TP x PP configurations for a model, Megatron-LM's Table 1 against the planner, results/plan_heatmap.png: PLAN_ARGS="--model megatron-146b --cluster dgx-a100 --gpus 1536 --batch 2304"
	@scripts/plan.sh $(PLAN_ARGS)

plan-check: $(PLAN) ## the planner's memory and step time against 04-08 (and 09) run on this machine: RUNS="dp2 tp2 ..." to pick
	@$(MAKE) --no-print-directory all
	@scripts/plan_check.sh

clean:
	rm -rf $(BUILD) $(addsuffix /train,$(CHAPTERS)) $(PLAN)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# CUDA: where nvcc exists, cuda.mk adds the CUDA objects, flags, libraries and lessons (see cuda.mk).
ifneq ($(NVCC),)
include cuda.mk
endif

# The flags stamp (FLAGS_STAMP above): rewritten only when the flags differ from what it holds, so
# that its time tells when they last changed.
FLAGS_NOW := $(MPICXX) $(CPPFLAGS) $(CXXFLAGS) | $(NVCC) $(NVCCFLAGS)
$(shell mkdir -p $(BUILD) && (echo '$(FLAGS_NOW)' | cmp -s - $(FLAGS_STAMP) || echo '$(FLAGS_NOW)' > $(FLAGS_STAMP)))
