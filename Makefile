# Top-level Makefile: builds every chapter that exists, the tests and the benchmarks.
# `make help` lists the targets: each target's line ends with a "## what it does" comment, and the
# lines that start with "## " follow the list as they are (the options below). A new target gets one too.
## Options: V=1 prints whole compiler commands; -j1 builds one file at a time (default: all cores).
##   ARCH=-march=x86-64-v2 for programs that must run on older CPUs of a cluster (default: native).
##   CUDA_ARCH="-gencode arch=compute_90,code=sm_90" for the GPUs of another machine (default: the GPUs
##   nvidia-smi lists here, each at its compute capability; without a GPU, sm_80 and its PTX, see cuda.mk).
##   A change of flags (ARCH, CXXFLAGS, CUDA_ARCH, ...) rebuilds what they compile.

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
CPU_BUILD = $(BUILD)/cpu

# Parallel by default: one compiler per core. A -j on the command line wins (make -j1: one at a time);
# sub-makes share the top one's jobs.
ifeq ($(MAKELEVEL),0)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)
endif

# One short line per file ("  CXX   common/ops/ops.cpp"); V=1 prints the whole commands instead.
ifeq ($(V),1)
say =
else
say = @printf '  %-5s %s\n' '$(1)' '$(2)';
endif

CHAPTERS    := $(sort $(patsubst %/train.cpp,%,$(wildcard [0-9][0-9]_*/train.cpp)))
PLAN        := 09_3d_parallel/plan
# The checkpoint converter (scripts/checkpoint/convert.cpp).
CONVERT     := $(BUILD)/checkpoint_convert
# Chapter 00 is no trainer: its program times the collectives built from send and receive.
COLLECTIVES_PROGRAM := 00_collectives/collectives
# Chapter 13's check of the number formats from outside: fp32 bit patterns in, each format's code out.
FORMATS_PROGRAM := 13_mixed_precision/formats
# The CPU kernel lesson (lessons/matmul/matmul_cpu_lesson.cpp), built with the chapters.
CPU_LESSONS := lessons/matmul/matmul_cpu_lesson
COMMON_SRC  := $(wildcard common/*/*.cpp)
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

# What was found, said once per command (not by sub-makes, nor for make help).
SHOW_FOUND := $(and $(filter 0,$(MAKELEVEL)),$(filter-out help,$(or $(MAKECMDGOALS),all)))
ifneq ($(SHOW_FOUND),)
$(info found: mpicxx=$(or $(MPICXX),MISSING) nvcc=$(or $(NVCC),none) NCCL=$(or $(HAVE_NCCL),no) \
GoogleTest=$(or $(HAVE_GTEST),MISSING) matplotlib=$(or $(HAVE_MATPLOTLIB),MISSING))
$(info building chapters: $(CHAPTERS))
endif

.PHONY: all deps test tests test-busy checkpoint-convert bench-checkpoint elastic compare bench profile bench-attention bench-comm bench-tp bench-pp schedules cp-balance bench-torch diffs plan plan-check core-speed clean \
  cluster-up cluster-down cluster-status cluster-check cluster-lessons \
  help $(CHAPTERS) 00_collectives collectives precision
all: 00_collectives $(CHAPTERS) $(FORMATS_PROGRAM) $(CPU_LESSONS) ## every chapter's program (00_collectives/collectives, NN_name/train); the default

00_collectives: $(COLLECTIVES_PROGRAM) ## chapter 00: all-reduce, reduce-scatter, all-gather from send and receive

$(CHAPTERS): %: %/train ## one chapter: make 01_vanilla_dp, ...

help: ## this list
	@awk '/^## / { notes = notes substr($$0, 4) "\n"; next } \
	  /^[^#\t=]*:.*## / { split($$0, at, ":"); name = at[1]; sub(/.*## /, ""); \
	    if (name == "$$(CHAPTERS)") name = "NN_name"; printf "  make %-13s %s\n", name, $$0 } \
	  END { printf "%s", notes }' \
	  $(filter-out %.d,$(MAKEFILE_LIST))

define need_mpicxx
	@test -n "$(MPICXX)" || { echo "mpicxx not found: run 'make deps' (installs MPICH) or apt-get install mpich libmpich-dev"; exit 1; }
endef

# Every object depends on a file that holds the compile flags and changes only when they do
# (written at the end of this file, once cuda.mk has added its flags): a new ARCH rebuilds everything.
FLAGS_STAMP := $(BUILD)/.flags

$(BUILD)/%.o: %.cpp $(FLAGS_STAMP)
	$(need_mpicxx)
	@mkdir -p $(dir $@)
	$(call say,CXX,$<)$(MPICXX) $(CPPFLAGS) $(CXXFLAGS) -c $< -o $@

$(LIBCOMMON): $(COMMON_OBJ)
	@rm -f $@
	$(call say,AR,$@)ar rcs $@ $^

# The chapters' programs live outside the build folder, and two builds link them: $(BUILD) and make
# compare's CPU-only one (COMPARE_BUILD below). This file names the build that linked them last; it
# changes when the other one links, and then the programs are linked again from that one's objects.
CHAPTERS_LINKED_FROM := build/.chapters_linked_from
$(CHAPTERS_LINKED_FROM): FORCE
	@mkdir -p $(dir $@); echo '$(BUILD)' | cmp -s - $@ || echo '$(BUILD)' > $@
# Phony, so that .SECONDARY below cannot take it for an intermediate file that need not exist (which
# would skip the rule above, and a switch of builds would keep the other build's programs).
.PHONY: FORCE
FORCE:

%/train: $(BUILD)/%/train.o $(LIBCOMMON) $(CHAPTERS_LINKED_FROM)
	$(call say,LINK,$@)$(MPICXX) $(CXXFLAGS) $(filter-out $(CHAPTERS_LINKED_FROM),$^) -o $@ -pthread

$(FORMATS_PROGRAM): $(BUILD)/13_mixed_precision/formats.o $(BUILD)/common/ops/float_formats.o
	$(call say,LINK,$@)$(MPICXX) $(CXXFLAGS) $^ -o $@

$(COLLECTIVES_PROGRAM): $(BUILD)/00_collectives/collectives.o $(BUILD)/00_collectives/communicator_bench.o \
                        $(LIBCOMMON) $(CHAPTERS_LINKED_FROM)
	$(call say,LINK,$@)$(MPICXX) $(CXXFLAGS) $(filter-out $(CHAPTERS_LINKED_FROM),$^) -o $@ -pthread

# The CPU kernel lesson: a standalone program (no MPI) whose fastest version is the framework's own
# sgemm_cpu, linked from its object.
lessons/matmul/matmul_cpu_lesson: $(BUILD)/lessons/matmul/matmul_cpu_lesson.o $(BUILD)/common/ops/matmul_cpu.o \
                                  $(CHAPTERS_LINKED_FROM)
	$(call say,LINK,$@)$(MPICXX) $(CXXFLAGS) $(filter-out $(CHAPTERS_LINKED_FROM),$^) -o $@

# Tests link the real objects of libcommon.a, never a copy of the code under test.
$(BUILD)/tests/%: $(BUILD)/tests/%.o $(LIBCOMMON) $(BUILD)/tests/mpi_gtest_main.o $(TEST_SUPPORT)
	$(call say,LINK,$@)$(MPICXX) $(CXXFLAGS) $< $(TEST_SUPPORT) \
	  $(if $(filter $*,$(MPI_TESTS)),$(BUILD)/tests/mpi_gtest_main.o,-lgtest_main) $(LIBCOMMON) $(GTEST_LIBS) -o $@

# The tests' own files compile at TEST_OPT, after CXXFLAGS (the last -O wins): what they run
# themselves is assertions and small references, while the code they test, libcommon.a, keeps
# CXXFLAGS' -O3. -O1 nearly halves their compile (tests/test_comm.cpp: 13.9 CPU s at -O3, 7.7 at -O1),
# and -O0 takes another quarter off (test_refusals.cpp 10.9 -> 7.6 CPU s, test_planner.cpp 9.0 -> 6.6).
TEST_OPT ?= -O0
$(BUILD)/tests/%.o: CXXFLAGS += $(TEST_OPT)

# GoogleTest's header, parsed once for all the tests' files: a precompiled header (GCC's .gch, used
# where a file's -include names the header beside it), compiled with the very flags of the tests'
# objects, since GCC uses it only then (-Winvalid-pch says so if not). It saves about a second of
# CPU per test file, about 1.2 s of the 2 s that <gtest/gtest.h> alone costs to compile at TEST_OPT.
TEST_PCH := $(BUILD)/tests/pch/gtest.h
$(TEST_PCH).gch: CXXFLAGS += $(TEST_OPT)
$(TEST_PCH).gch: $(FLAGS_STAMP)
	$(need_mpicxx)
	@mkdir -p $(dir $@)
	@echo '#include <gtest/gtest.h>  // the tests precompiled header, written by the Makefile' > $(TEST_PCH)
	$(call say,PCH,<gtest/gtest.h>)$(MPICXX) $(CPPFLAGS) $(CXXFLAGS) -c -x c++-header $(TEST_PCH) -o $@
$(BUILD)/tests/%.o: CPPFLAGS += -include $(TEST_PCH) -Winvalid-pch
$(TEST_SRC:tests/%.cpp=$(BUILD)/tests/%.o) $(TEST_SUPPORT) $(BUILD)/tests/mpi_gtest_main.o: $(TEST_PCH).gch

# Objects that pattern rules make on the way to a program (a chapter's train.o, the tests' objects)
# are intermediate files to make, which it deletes after the build: kept, so that the next build
# does not compile them again.
.SECONDARY:

tests: $(TEST_BIN) $(COLLECTIVES_PROGRAM) $(FORMATS_PROGRAM) $(addsuffix /train,$(CHAPTERS)) $(BUILD)/pipeline_ideal $(BUILD)/sync_probe $(BUILD)/core_speed $(PLAN) $(CPU_LESSONS) $(CONVERT) ## builds every test and chapter, runs nothing

deps: ## only installs missing packages (MPICH, GoogleTest, matplotlib)
	@scripts/setup/ensure_deps.sh

test: ## installs what is missing, builds and runs every test: "N passed, M failed"
	@scripts/setup/ensure_deps.sh
	@$(MAKE) --no-print-directory tests
	@tests/run_tests.sh

# The tests beside a load: they must pass on a machine whose cores are all busy (scripts/checks/test_busy.sh).
test-busy: ## make test twice in a row beside 2 CPU-bound processes: LOAD=2 RUNS=2
	@scripts/setup/ensure_deps.sh
	@$(MAKE) --no-print-directory tests
	@scripts/checks/test_busy.sh

# Where nvcc exists but no GPU does (nvidia-smi absent or failing), the chapters would train on the
# CPU anyway: make compare then builds them without CUDA, skipping the slow nvcc compiles, in a
# folder of its own, so that the CUDA build in $(BUILD) stays as make test made it.
NO_GPU_NOTE = no GPU: the chapters are built for the CPU only, in $(COMPARE_BUILD) (make test builds CUDA)
COMPARE_BUILD = $(if $(NVCC),$(if $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu),,$(CPU_BUILD)))
compare: ## installs what is missing, trains every chapter, prints a table, writes plots
	@scripts/setup/ensure_deps.sh
	@$(if $(COMPARE_BUILD),echo "$(NO_GPU_NOTE)")
	@$(MAKE) --no-print-directory $(if $(COMPARE_BUILD),NVCC= BUILD=$(COMPARE_BUILD)) all
	@scripts/compare/compare.sh

# OpenBLAS's own cblas.h and library (pkg-config knows where Debian puts them), not whichever
# cblas.h the system has: the reference BLAS ships one too, without OpenBLAS's library.
OPENBLAS_CFLAGS = $(shell pkg-config --cflags openblas 2>/dev/null)
OPENBLAS_LIBS   = $(or $(shell pkg-config --libs openblas 2>/dev/null),-lopenblas)
$(BUILD)/matmul_bench: scripts/bench/matmul_bench.cpp $(LIBCOMMON)
	$(call say,LINK,$@)$(MPICXX) $(CPPFLAGS) $(OPENBLAS_CFLAGS) $(CXXFLAGS) $^ $(OPENBLAS_LIBS) -o $@

bench: ## one rank, one thread: ours vs PyTorch eager at tiny, small, deep, alternated (installs torch in a venv on first use; BENCH_TORCH=0 skips), then the CPU matmul vs OpenBLAS
	@scripts/setup/ensure_deps.sh --bench
	@$(MAKE) --no-print-directory all $(BUILD)/matmul_bench
	@scripts/bench/bench.sh

profile: 01_vanilla_dp ## where a step's CPU time goes, per op (matmul, attention, layernorm, ...), at small and deep, 1 rank, 1 thread (needs perf)
	@scripts/bench/profile_ops.sh

# The CPU attention alone (scripts/bench/attention_bench.cpp): forward and backward at the presets' shapes.
$(BUILD)/attention_bench: $(BUILD)/scripts/bench/attention_bench.o $(LIBCOMMON)
	$(call say,LINK,$@)$(MPICXX) $(CXXFLAGS) $^ -o $@ -pthread
bench-attention: $(BUILD)/attention_bench ## the CPU attention alone at tiny, small and deep: ms and GFLOP/s, forward and backward
	@$(BUILD)/attention_bench

# make bench in seconds, what make test runs (tests/manifest.txt), so that a change that breaks the
# benchmark cannot land: the same script and targets, one round of 3 steps at tiny, without PyTorch,
# its results in $(BUILD)/bench-short rather than over a real bench's.
.PHONY: bench-short
bench-short: ## make bench in seconds (tiny, 1 round of 3 steps, no PyTorch): what make test runs
	@ROUNDS=1 STEPS=3 PRESETS=tiny BENCH_TORCH=0 BENCH_OUT=$(BUILD)/bench-short $(MAKE) --no-print-directory bench

bench-tp: all ## 07 (TP 2, + sequence parallelism, + overlap) next to 03 on three links: RANKS=2 PRESET=small STEPS=20
	@scripts/bench/bench_tp.sh

bench-pp: all ## 08's six schedules at m = 2, 4, 8, 16, bubble measured, simulated, theory: RANKS=2 PRESET=small
	@scripts/bench/bench_pp.sh

# Chapter 10's balance under the causal mask: each rank's attention work and idle time in the ring.
cp-balance: 10_context_parallel ## 10's ring at --cp 2 and 4, contiguous vs zigzag, results/cp_balance.png: CPS="2 4" PRESET=long STEPS=4
	@scripts/bench/cp_balance.sh

# Chapter 13's recipes side by side: the lesson of mixed precision, measured (scripts/bench/precision.sh).
precision: 13_mixed_precision ## 13 under fp32, bf16, fp16, fp8 (4 scalings) and two failing recipes, a table and docs/images/precision.png, about 2 min on 2 cores: STEPS=100 JOBS=2
	@scripts/bench/precision.sh

# Chapter 08's pipeline diagram: afab, 1f1b, interleaved and zb-h1, each measured and simulated.
schedules: ## 08's schedules measured next to ideal, results/schedules.png: PP=4 M=8 PRESET=deep STEPS=10
	@scripts/setup/ensure_deps.sh
	@$(MAKE) --no-print-directory 08_pipeline $(BUILD)/pipeline_ideal
	@scripts/bench/schedules.sh

# Chapter 00's algorithms against the alpha-beta model and the library's own, over MPI's shared
# memory and over the emulated link, then the plot (scripts/bench/collectives.sh).
collectives: ## 00's four algorithms at 2, 4, 8 ranks, 4 B to 64 MB, both links, results/collectives.png: COLL_RANKS="2 4 8" COLL_MAX=67108864 COLL_LINK="--link-gbps 10 --link-latency-us 20"
	@scripts/setup/ensure_deps.sh
	@$(MAKE) --no-print-directory $(COLLECTIVES_PROGRAM)
	@scripts/bench/collectives.sh

# make bench-comm's ranks; LINK passes emulated-link flags through.
RANKS ?= 2
LINK  ?=
# make schedules' ideal panels: each schedule simulated with the same measured pass times.
$(BUILD)/pipeline_ideal: $(BUILD)/scripts/bench/pipeline_ideal.o $(LIBCOMMON)
	$(call say,LINK,$@)$(MPICXX) $(CXXFLAGS) $^ -o $@ -pthread

# Chapter 00's program with --communicator (00_collectives/communicator_bench.cpp).
bench-comm: ## our Communicator against raw MPI, nccl-tests style (chapter 00 --communicator): RANKS=2 LINK="--link-gbps 1 --link-latency-us 50"
	@scripts/setup/ensure_deps.sh
	@$(MAKE) --no-print-directory $(COLLECTIVES_PROGRAM)
	mpiexec -n $(RANKS) ./$(COLLECTIVES_PROGRAM) --communicator --min-bytes 4096 $(LINK)

# A cluster on this machine (docs/cluster.md): network namespaces as nodes, tbf-shaped links, a hostfile.
NODES ?= 2
GBPS ?= 1
cluster-up: ## root: NODES (2..4) namespaces as nodes, links shaped to GBPS Gbit/s, build/cluster/hostfile: NODES=2 GBPS=1
	@scripts/cluster/cluster.sh up $(NODES) $(GBPS)

cluster-down: ## removes the cluster: namespaces, links, processes in them, files
	@scripts/cluster/cluster.sh down

cluster-status: ## the cluster's nodes, addresses, link rates and processes
	@scripts/cluster/cluster.sh status

cluster-check: all ## every chapter across the nodes (2x1, 2x2) against one host: losses and counters equal (cluster up)
	@scripts/cluster/cluster_equivalence.sh

cluster-lessons: all $(PLAN) ## placement (TP inside vs across nodes) and the link model against the shaped link, the planner beside them (cluster up)
	@scripts/cluster/cluster_lessons.sh

# PyTorch eager next to chapter 01. TORCH_PYTHON: an interpreter that has torch (a venv, say), kept
# apart from PYTHON, which the build uses to look for matplotlib.
TORCH_PYTHON ?= $(PYTHON)
ARGS ?=
bench-torch: ## chapter 01 next to PyTorch eager (needs torch): ARGS="--preset gpt2 --device cuda --steps 30"
	@scripts/setup/ensure_deps.sh
	@$(MAKE) --no-print-directory 01_vanilla_dp
	@PYTHON=$(TORCH_PYTHON) scripts/pytorch/compare_pytorch.sh $(ARGS)

diffs: ## writes docs/diffs/: each chapter's train.cpp against its base chapter (the previous one; 03 for 07, 08, 10, 11, 13)
	@scripts/checks/diffs.sh

# Chapter 09's planner (PLAN, defined with the chapters above): a command-line tool over
# common/planner/planner.*, no MPI job of its own.
$(PLAN): $(patsubst %.cpp,$(BUILD)/%.o,$(wildcard 09_3d_parallel/plan*.cpp)) $(LIBCOMMON)
	$(call say,LINK,$@)$(MPICXX) $(CXXFLAGS) $^ -o $@ -pthread

plan: $(PLAN) ## 09's planner: best TP x CP x PP x DP (x EP) configurations, Megatron-LM's Table 1, the published runs (--published), results/plan_heatmap.png: PLAN_ARGS="--model llama3-405b --nodes 2048 --seq-len 131072 --tokens-per-batch 16777216"
	@scripts/plan/plan.sh $(PLAN_ARGS)

plan-check: $(PLAN) $(BUILD)/sync_probe ## 09's planner against runs of 03-12 on this machine, each timed row in 3 rounds between calibrations (each with a sync probe; more, up to MAX_ROUNDS=6, while its verdict is in doubt), the load beside each, about 6.5 min on 2 quiet cores, 13 to 20 under load: RUNS="dp2 tp2 ..." ROUNDS=N to pick
	@$(MAKE) --no-print-directory all
	@scripts/plan/plan_check.sh

# How fast each core computes now, sample by sample: why plan-check runs a timed row in rounds.
core-speed: $(BUILD)/core_speed ## what a second of each core computes every 100 ms for 6 s (our product, a register loop, a cache-sized loop): why plan-check runs rounds
	@$(BUILD)/core_speed $(CORE_SPEED_ARGS)

$(BUILD)/core_speed: $(BUILD)/scripts/plan/core_speed.o $(LIBCOMMON)
	$(call say,LINK,$@)$(MPICXX) $(CXXFLAGS) $^ -o $@ -pthread

# What one synchronization between 2 ranks costs now, which plan-check measures beside each calibration.
$(BUILD)/sync_probe: $(BUILD)/scripts/plan/sync_probe.o $(LIBCOMMON)
	$(call say,LINK,$@)$(MPICXX) $(CXXFLAGS) $^ -o $@ -pthread

# The checkpoint converter: a single file to a sharded folder and back, one process (scripts/checkpoint/convert.cpp).
$(CONVERT): $(BUILD)/scripts/checkpoint/convert.o $(LIBCOMMON)
	$(call say,LINK,$@)$(MPICXX) $(CXXFLAGS) $^ -o $@ -pthread

$(BUILD)/checkpoint_scale: $(BUILD)/scripts/bench/checkpoint_scale.o $(LIBCOMMON)
	$(call say,LINK,$@)$(MPICXX) $(CXXFLAGS) $^ -o $@ -pthread

bench-checkpoint: all $(CONVERT) $(BUILD)/checkpoint_scale ## checkpoints: save/load time and peak memory per rank at 2, 4, 8 ranks, file vs folder; step time with an async save; time from a killed rank to training again; the estimate at scale
	@scripts/bench/checkpoint_bench.sh

elastic: all ## a run that survives a lost rank: 04_zero1 on 4 ranks, one killed mid-run, restarted on 2 (scripts/elastic/elastic.sh)
	@scripts/bench/checkpoint_bench.sh --elastic-only

checkpoint-convert: $(CONVERT) ## builds build/checkpoint_convert FROM TO: a checkpoint file to a sharded folder (TO ending in '/') or back

clean: ## removes the build folder and the programs
	rm -rf $(BUILD) $(addsuffix /train,$(CHAPTERS)) $(PLAN) $(COLLECTIVES_PROGRAM) $(FORMATS_PROGRAM) $(CPU_LESSONS)

-include $(shell find $(BUILD) -path '$(CPU_BUILD)' -prune -o -name '*.d' -print 2>/dev/null)

# CUDA: where nvcc exists, cuda.mk adds the CUDA objects, flags, libraries and lessons (see cuda.mk).
ifneq ($(NVCC),)
include cuda.mk
endif

# The flags stamp (FLAGS_STAMP above): rewritten only when the flags differ from what it holds, so
# that its time tells when they last changed.
FLAGS_NOW := $(MPICXX) $(CPPFLAGS) $(CXXFLAGS) $(TEST_OPT) | $(NVCC) $(NVCCFLAGS)
$(shell mkdir -p $(BUILD) && (echo '$(FLAGS_NOW)' | cmp -s - $(FLAGS_STAMP) || echo '$(FLAGS_NOW)' > $(FLAGS_STAMP)))
