# cuda.mk: the CUDA part of the build. The top-level Makefile includes it where nvcc exists, at its
# end (after its own rules and variables: this file adds to them). It
#   - defines GPT_WITH_CUDA (and GPT_WITH_NCCL where nccl.h exists) for every host object, so ops.cpp
#     dispatches CUDA tensors to ops_cuda.cu and memory.cpp allocates them with cudaMalloc;
#   - compiles common/*/*.cu with nvcc into libcommon.a, next to the common/*/*.cpp objects;
#   - links the CUDA libraries into every program that links libcommon.a (CUDA_LINKED below; cuBLAS
#     is opened at its first call instead, common/ops/cublas_on_demand.cpp);
#   - builds the kernel lessons (lessons/matmul/matmul_lesson) and, with the tests, the kernel
#     variants' benchmark (build/kernel_variants) and fp8's products against bf16's
#     (build/fp8_products); test_cuda_ops comes with the other tests
#     (tests/test_*.cpp) and skips its tests where no GPU is present.
# Nothing here needs a GPU: the build runs anywhere nvcc does.

CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# The GPU code nvcc writes. Each architecture costs a pass of nvcc's device compiler and of ptxas over
# every .cu file, so the build makes only what this machine needs: where a GPU answers nvidia-smi,
# its own compute capability (every distinct one of its GPUs); where none does (CI, a login node),
# sm_80 plus its PTX, which proves the code compiles and which the driver of any newer GPU compiles
# for itself at the first launch. Two architectures cost a third more nvcc time than one.
# CUDA_ARCH="-gencode arch=compute_90,code=sm_90 ..." builds for the GPUs of another machine.
ifeq ($(origin CUDA_ARCH),undefined)
GPU_CAPABILITIES := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d '. ' | grep -x '[0-9][0-9]*' | sort -u)
CUDA_ARCH := $(strip $(if $(GPU_CAPABILITIES),$(foreach cc,$(GPU_CAPABILITIES),-gencode arch=compute_$(cc),code=sm_$(cc)),\
               -gencode arch=compute_80,code=sm_80 -gencode arch=compute_80,code=compute_80))
endif
NVCCFLAGS ?= -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -Wall,-Wextra

CPPFLAGS += -DGPT_WITH_CUDA -I$(CUDA_HOME)/include
ifeq ($(HAVE_NCCL),yes)
CPPFLAGS   += -DGPT_WITH_NCCL
CUDA_NCCL  := -lnccl
endif

# Link flags. They reach the link lines through CXXFLAGS, which those lines place before the objects,
# so --no-as-needed keeps the libraries even where the linker defaults to --as-needed (Ubuntu's gcc),
# which would otherwise drop a library named before the objects that use it. The rpath lets the
# programs find the libraries at run time without LD_LIBRARY_PATH. cuBLAS and cuBLASLt are not linked:
# common/ops/cublas_on_demand.cpp opens them (through the same rpath) at their first call, so that a
# rank that trains on the CPU does not spend 0.15 s of CPU time loading them.
CUDA_LDFLAGS := -Wl,--no-as-needed -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart $(CUDA_NCCL) -ldl

CUDA_SRC := $(wildcard common/*/*.cu)
CUDA_OBJ := $(CUDA_SRC:%.cu=$(BUILD)/%.o)

ifneq ($(SHOW_FOUND),)
$(info CUDA build: nvcc=$(NVCC) ($(CUDA_ARCH)), NCCL=$(or $(HAVE_NCCL),no: CUDA collectives go through host memory over MPI))
endif

# Like the host objects, they depend on the flags stamp (Makefile): new flags, or the first CUDA
# build after a CPU one (-DGPT_WITH_CUDA), rebuild them.
$(BUILD)/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(call say,NVCC,$<)$(NVCC) $(CPPFLAGS) $(NVCCFLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

$(LIBCOMMON): $(CUDA_OBJ)

# Every program that links libcommon.a: ops.o and memory.o now call CUDA. `private` keeps the flags
# on the link step (a target-specific variable would otherwise also reach the compiles of the
# target's prerequisites, where -l flags only draw warnings). A new program that links libcommon.a
# belongs in this list.
CUDA_LINKED := $(addsuffix /train,$(CHAPTERS)) $(COLLECTIVES_PROGRAM) $(TEST_BIN) $(BUILD)/matmul_bench \
               $(BUILD)/pipeline_ideal $(PLAN) $(BUILD)/kernel_variants $(CONVERT) $(BUILD)/checkpoint_scale \
               $(BUILD)/sync_probe $(BUILD)/core_speed $(BUILD)/fp8_products
$(CUDA_LINKED): private CXXFLAGS += $(CUDA_LDFLAGS)

# Kernel lessons: standalone programs (no libcommon, no MPI), built with the chapters.
CUDA_LESSONS := lessons/matmul/matmul_lesson

lessons/matmul/matmul_lesson: lessons/matmul/matmul_lesson.cu
	$(call say,NVCC,$<)$(NVCC) $(NVCCFLAGS) $< -o $@ -L$(CUDA_HOME)/lib64 -Xlinker -rpath -Xlinker $(CUDA_HOME)/lib64 -lcublas

# Version 1 against version 2 of each kernel that has both, checked then timed on a GPU (it says why
# and stops without one): scripts/gpu/gpu_check.sh runs it, so it is built with the tests.
# ($< and the library by name, not $^: -MMD's dependency file adds the headers as prerequisites.)
$(BUILD)/kernel_variants: scripts/bench/kernel_variants.cpp $(LIBCOMMON)
	$(call say,LINK,$@)$(MPICXX) $(CPPFLAGS) $(CXXFLAGS) $< $(LIBCOMMON) -o $@

# fp8 against bf16 products through cuBLASLt, timed on a GPU (it says why and stops without one):
# scripts/gpu/gpu_check.sh runs it too.
$(BUILD)/fp8_products: scripts/bench/fp8_products.cpp $(LIBCOMMON)
	$(call say,LINK,$@)$(MPICXX) $(CPPFLAGS) $(CXXFLAGS) $< $(LIBCOMMON) -o $@

all tests: $(CUDA_LESSONS)
tests: $(BUILD)/kernel_variants $(BUILD)/fp8_products

.PHONY: clean-cuda
clean: clean-cuda
clean-cuda: ## removes the CUDA lessons' programs (make clean does too)
	rm -f $(CUDA_LESSONS)
