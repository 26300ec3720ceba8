// ops.cpp: the definitions of ops.h. Each op checks its tensors (one device; one dtype for the model
// tensors; fp32 for layernorm's statistics, the losses and the optimizer state; shapes that fit
// together), reads the sizes (B, T, C, ...) from the shapes, and runs the CPU version (namespace cpu,
// ops_cpu.h, fp32 only) or, for CUDA tensors, the CUDA version (namespace cuda, ops_cuda.h), which
// takes the dtype and untyped pointers, since it runs in fp32 and in bf16. Three ops are built from
// others and dispatch through them: the encoder (the token lookup, then the positions) and
// matmul_backward (its input half, then its weight half), so that the tensor-parallel pieces compute
// exactly what the whole ops do.
// The checks are cheap (a few integer comparisons per call) and catch a wrong view at the call that
// made it, instead of as garbage numbers many layers later.
#include "ops/ops.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "ops/bf16.h"     // float_to_bf16, bf16_to_float: convert_tensor on the CPU
#include "base/check.h"    // ENSURE, fatal
#include "ops/matmul_emulation.h"  // cpu_matmul_emulation: low-precision products emulated (chapter 13)
#include "ops/ops_cpu.h"  // cpu::
#ifdef GPT_WITH_CUDA
#include "ops/ops_cuda.h"  // cuda::
#endif

namespace {

// ON_CUDA(ops, call) returns cuda::call when the op's tensors live on the GPU; the CPU call follows
// it in each op. A macro, so that a build without CUDA never names the cuda:: functions: there a
// CUDA tensor stops the program with a message instead.
#ifdef GPT_WITH_CUDA
#define ON_CUDA(ops, call)                                          \
  do {                                                              \
    if ((ops).device == Device::CUDA) return cuda::call;            \
  } while (0)
#else
#define ON_CUDA(ops, call)                                          \
  do {                                                              \
    if ((ops).device == Device::CUDA) built_without_cuda(__func__); \
  } while (0)

[[noreturn]] void built_without_cuda(const char* op) {
  fatal(std::string(op) + ": got a CUDA tensor, but this program was built without CUDA (GPT_WITH_CUDA "
        "undefined); build it on a machine with nvcc");
}
#endif

// Where an op runs, and in which dtype: what operands() found.
struct Operands {
  Device device;
  DType dtype;
};

void check_operand(const char* op, const Tensor& first, const Tensor& t) {
  if (t.empty()) return;  // optional operands (a matmul without bias)
  ENSURE(t.device == first.device, std::string(op) + ": tensors on different devices");
  ENSURE(t.dtype == first.dtype, std::string(op) + ": tensors of different dtypes (" + dtype_name(first.dtype) +
                                     " and " + dtype_name(t.dtype) + "); an op runs in one dtype");
}

// Checks the model tensors of `op` (activations, parameters, gradients): they share one device and
// one dtype (empty ones, i.e. absent optional operands, are skipped), fp32 or bf16, and fp32 on the
// CPU, whose ops are written in fp32 only. Returns that device and dtype.
template <typename... Tensors>
Operands operands(const char* op, const Tensor& first, const Tensors&... rest) {
  ENSURE(!first.empty(), std::string(op) + ": the first operand is empty");
  (check_operand(op, first, rest), ...);
  ENSURE(first.dtype == DType::F32 || first.dtype == DType::BF16,
         std::string(op) + ": takes fp32 or bf16 tensors, not " + dtype_name(first.dtype));
  ENSURE(first.device != Device::CPU || first.dtype == DType::F32,
         std::string(op) + ": got bf16 tensors on the CPU, whose ops are fp32 only; bf16 mixed precision "
                           "needs --device cuda (or use --dtype fp32)");
  return {first.device, first.dtype};
}

// Checks the tensors that are fp32 whatever the op's dtype (layernorm's mean and rstd, the losses,
// AdamW's m, v and master weights): on the op's device, and fp32.
template <typename... Tensors>
void fp32_operands(const char* op, Device device, const Tensors&... tensors) {
  auto check = [&](const Tensor& t) {
    ENSURE(t.device == device, std::string(op) + ": tensors on different devices");
    ENSURE(t.dtype == DType::F32, std::string(op) + ": statistics, losses and optimizer state are fp32, got " +
                                      dtype_name(t.dtype));
  };
  (check(tensors), ...);
}

// A tensor seen as a matrix: its rows are all dimensions but the last, its columns the last one.
int rows(const Tensor& t) {
  ENSURE(t.ndim >= 1 && t.shape[t.ndim - 1] > 0, "a tensor without columns has no rows");
  int64_t n = t.numel() / t.shape[t.ndim - 1];
  ENSURE(n <= INT32_MAX, "more rows than an int holds");
  return int(n);
}
int cols(const Tensor& t) {
  ENSURE(t.ndim >= 1, "a tensor without dimensions has no columns");
  ENSURE(t.shape[t.ndim - 1] <= INT32_MAX, "more columns than an int holds");
  return int(t.shape[t.ndim - 1]);
}
size_t count(const Tensor& t) { return size_t(t.numel()); }

// The data of an optional operand, or nullptr where it is absent (an empty Tensor).
float* optional_f32(const Tensor& t) { return t.empty() ? nullptr : t.f32(); }

// The recipe's products (matmul_emulation.h) for fp32 tensors on a GPU, where the installed emulation
// runs there (LowPrecisionMatmuls in a CUDA build); else nullptr. The CPU's products consult the
// emulation after ON_CUDA, inside their clock.
MatmulEmulation* gpu_emulation_for(const Operands& ops) {
  MatmulEmulation* emulation = cpu_matmul_emulation();
  const bool takes = emulation && ops.device == Device::CUDA && ops.dtype == DType::F32 && emulation->runs_on_gpu();
  return takes ? emulation : nullptr;
}

// An emulation's backward always accumulates into dinp: overwriting is accumulating into zeros.
void emulated_backward_input(MatmulEmulation& emulation, Tensor dinp, Tensor dout, Tensor weight, GradWrite write) {
  if (write == GradWrite::Overwrite) fill_zero(dinp);
  emulation.backward_input(dinp, dout, weight);
}

}  // namespace

// ----------------------------------------------------------------------------------------------------------

// The encoder is the token lookup over the whole table followed by the position embeddings: the
// same additions, in the same order, as the vocabulary- and sequence-parallel ops make.
void encoder_forward(Tensor out, const int* tokens, Tensor wte, Tensor wpe, int B, int T) {
  operands(__func__, out, wte, wpe);
  const int C = cols(out);
  ENSURE(out.numel() == int64_t(B) * T * C, "encoder_forward: out must be (B,T,C)");
  ENSURE(cols(wte) == C && cols(wpe) == C, "encoder_forward: wte, wpe and out differ in C");
  ENSURE(T <= rows(wpe), "encoder_forward: T exceeds the rows of the position table wpe");
  const int V = rows(wte);
  embedding_forward(out, tokens, wte, 0, V);
  position_forward(out, wpe, 0, T);
}

void encoder_backward(Tensor dwte, Tensor dwpe, Tensor dout, const int* tokens, int B, int T) {
  operands(__func__, dwte, dwpe, dout);
  const int C = cols(dout);
  ENSURE(dout.numel() == int64_t(B) * T * C, "encoder_backward: dout must be (B,T,C)");
  ENSURE(cols(dwte) == C && cols(dwpe) == C, "encoder_backward: dwte, dwpe and dout differ in C");
  ENSURE(T <= rows(dwpe), "encoder_backward: T exceeds the rows of dwpe");
  const int V = rows(dwte);
  embedding_backward(dwte, dout, tokens, 0, V);
  position_backward(dwpe, dout, 0, T);
}

namespace {

// The checks of both embedding calls: the table's rows are a slice [vocab_begin, vocab_begin + Vl) of
// the vocabulary and it has the rows' C columns. Returns Vl.
int check_embedding(const char* op, const Tensor& rows_nc, const Tensor& table, int vocab_begin, int vocab_size) {
  const int Vl = rows(table);
  ENSURE(cols(table) == cols(rows_nc), std::string(op) + ": the table and the rows differ in C");
  ENSURE(vocab_begin >= 0 && int64_t(vocab_begin) + Vl <= vocab_size,
         std::string(op) + ": the table's rows [" + std::to_string(vocab_begin) + ", " +
             std::to_string(int64_t(vocab_begin) + Vl) + ") are not a slice of the vocabulary [0, " +
             std::to_string(vocab_size) + ")");
  return Vl;
}

// The checks of both position calls: the rows start at a position >= 0 of sequences of T <= the
// table's rows, and have its C columns.
void check_position(const char* op, const Tensor& rows_nc, const Tensor& wpe, int64_t first_row, int T) {
  ENSURE(cols(wpe) == cols(rows_nc), std::string(op) + ": wpe and the rows differ in C");
  ENSURE(T > 0 && T <= rows(wpe), std::string(op) + ": T must be in [1, the rows of the position table wpe]");
  ENSURE(first_row >= 0, std::string(op) + ": first_row must be >= 0");
}

}  // namespace

void embedding_forward(Tensor out, const int* tokens, Tensor wte, int vocab_begin, int vocab_size) {
  const Operands ops = operands(__func__, out, wte);
  const int N = rows(out), C = cols(out);
  const int Vl = check_embedding(__func__, out, wte, vocab_begin, vocab_size);
  ON_CUDA(ops, embedding_forward(ops.dtype, out.data, tokens, wte.data, N, C, vocab_begin, Vl, vocab_size));
  cpu::embedding_forward(out.f32(), tokens, wte.f32(), N, C, vocab_begin, Vl, vocab_size);
}

void embedding_backward(Tensor dwte, Tensor dout, const int* tokens, int vocab_begin, int vocab_size) {
  const Operands ops = operands(__func__, dwte, dout);
  const int N = rows(dout), C = cols(dout);
  const int Vl = check_embedding(__func__, dout, dwte, vocab_begin, vocab_size);
  ON_CUDA(ops, embedding_backward(ops.dtype, dwte.data, dout.data, tokens, N, C, vocab_begin, Vl, vocab_size));
  cpu::embedding_backward(dwte.f32(), dout.f32(), tokens, N, C, vocab_begin, Vl, vocab_size);
}

void position_forward(Tensor out, Tensor wpe, int64_t first_row, int T) {
  const Operands ops = operands(__func__, out, wpe);
  const int N = rows(out), C = cols(out);
  check_position(__func__, out, wpe, first_row, T);
  ON_CUDA(ops, position_forward(ops.dtype, out.data, wpe.data, N, C, first_row, T));
  cpu::position_forward(out.f32(), wpe.f32(), N, C, first_row, T);
}

void position_backward(Tensor dwpe, Tensor dout, int64_t first_row, int T) {
  const Operands ops = operands(__func__, dwpe, dout);
  const int N = rows(dout), C = cols(dout);
  check_position(__func__, dout, dwpe, first_row, T);
  ON_CUDA(ops, position_backward(ops.dtype, dwpe.data, dout.data, N, C, first_row, T));
  cpu::position_backward(dwpe.f32(), dout.f32(), N, C, first_row, T);
}

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias) {
  const Operands ops = operands(__func__, out, inp, weight, bias);
  fp32_operands(__func__, ops.device, mean, rstd);
  const int N = rows(inp), C = cols(inp);
  ENSURE(out.numel() == inp.numel(), "layernorm_forward: out and inp differ in size");
  ENSURE(mean.numel() == N && rstd.numel() == N, "layernorm_forward: mean and rstd must hold one value per row");
  ENSURE(weight.numel() == C && bias.numel() == C, "layernorm_forward: weight and bias must be (C)");
  ON_CUDA(ops, layernorm_forward(ops.dtype, out.data, mean.f32(), rstd.f32(), inp.data, weight.data, bias.data, N,
                                 C));
  cpu::layernorm_forward(out.f32(), mean.f32(), rstd.f32(), inp.f32(), weight.f32(), bias.f32(), N, C);
}

void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                        Tensor mean, Tensor rstd) {
  const Operands ops = operands(__func__, dinp, dweight, dbias, dout, inp, weight);
  fp32_operands(__func__, ops.device, mean, rstd);
  const int N = rows(inp), C = cols(inp);
  ENSURE(dinp.numel() == inp.numel() && dout.numel() == inp.numel(),
         "layernorm_backward: dinp, dout and inp differ in size");
  ENSURE(mean.numel() == N && rstd.numel() == N, "layernorm_backward: mean and rstd must hold one value per row");
  ENSURE(weight.numel() == C && dweight.numel() == C && dbias.numel() == C,
         "layernorm_backward: weight, dweight and dbias must be (C)");
  ON_CUDA(ops, layernorm_backward(ops.dtype, dinp.data, dweight.data, dbias.data, dout.data, inp.data, weight.data,
                                  mean.f32(), rstd.f32(), N, C));
  cpu::layernorm_backward(dinp.f32(), dweight.f32(), dbias.f32(), dout.f32(), inp.f32(), weight.f32(), mean.f32(),
                          rstd.f32(), N, C);
}

void matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) {
  const Operands ops = operands(__func__, out, inp, weight, bias);
  const int N = rows(inp), C = cols(inp), OC = rows(weight);
  ENSURE(cols(weight) == C, "matmul_forward: inner dimensions differ (inp is (N,C), weight must be (OC,C))");
  ENSURE(rows(out) == N && cols(out) == OC, "matmul_forward: out must be (N,OC)");
  ENSURE(bias.empty() || bias.numel() == OC, "matmul_forward: bias must be (OC)");
  if (MatmulEmulation* emulation = gpu_emulation_for(ops)) return emulation->forward(out, inp, weight, bias);
  ON_CUDA(ops, matmul_forward(ops.dtype, out.data, inp.data, weight.data, bias.data, N, C, OC));
  const MatmulClock clock(N, C, OC);
  if (MatmulEmulation* emulation = cpu_matmul_emulation()) return emulation->forward(out, inp, weight, bias);
  cpu::matmul_forward(out.f32(), inp.f32(), weight.f32(), optional_f32(bias), N, C, OC);
}

// The two halves below, input first: bit for bit what they compute when called apart.
void matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight) {
  operands(__func__, dinp, dweight, dbias, dout, inp, weight);
  const int N = rows(inp), C = cols(inp), OC = rows(weight);
  ENSURE(cols(weight) == C, "matmul_backward: inner dimensions differ (inp is (N,C), weight must be (OC,C))");
  ENSURE(rows(dout) == N && cols(dout) == OC, "matmul_backward: dout must be (N,OC)");
  ENSURE(dinp.numel() == inp.numel(), "matmul_backward: dinp and inp differ in size");
  ENSURE(dweight.numel() == weight.numel(), "matmul_backward: dweight and weight differ in size");
  ENSURE(dbias.empty() || dbias.numel() == OC, "matmul_backward: dbias must be (OC)");
  matmul_backward_input(dinp, dout, weight);
  matmul_backward_weight(dweight, dbias, dout, inp);
}

void matmul_backward_input(Tensor dinp, Tensor dout, Tensor weight, GradWrite write) {
  const Operands ops = operands(__func__, dinp, dout, weight);
  const int N = rows(dout), OC = cols(dout), C = cols(weight);
  ENSURE(rows(weight) == OC, "matmul_backward_input: dout is (N,OC), weight must be (OC,C)");
  ENSURE(dinp.numel() == int64_t(N) * C, "matmul_backward_input: dinp must be (N,C)");
  const bool accumulate = write == GradWrite::Accumulate;
  if (MatmulEmulation* emulation = gpu_emulation_for(ops)) return emulated_backward_input(*emulation, dinp, dout, weight, write);
  ON_CUDA(ops, matmul_backward_input(ops.dtype, dinp.data, dout.data, weight.data, N, C, OC, accumulate));
  const MatmulClock clock(N, C, OC);
  if (MatmulEmulation* emulation = cpu_matmul_emulation()) return emulated_backward_input(*emulation, dinp, dout, weight, write);
  cpu::matmul_backward_input(dinp.f32(), dout.f32(), weight.f32(), N, C, OC, accumulate);
}

void matmul_backward_weight(Tensor dweight, Tensor dbias, Tensor dout, Tensor inp) {
  const Operands ops = operands(__func__, dweight, dbias, dout, inp);
  const int N = rows(inp), C = cols(inp), OC = cols(dout);
  ENSURE(rows(dout) == N, "matmul_backward_weight: dout and inp differ in rows (N)");
  ENSURE(dweight.numel() == int64_t(OC) * C, "matmul_backward_weight: dweight must be (OC,C)");
  ENSURE(dbias.empty() || dbias.numel() == OC, "matmul_backward_weight: dbias must be (OC)");
  if (MatmulEmulation* emulation = gpu_emulation_for(ops)) return emulation->backward_weight(dweight, dbias, dout, inp);
  ON_CUDA(ops, matmul_backward_weight(ops.dtype, dweight.data, dbias.data, dout.data, inp.data, N, C, OC));
  const MatmulClock clock(N, C, OC);
  if (MatmulEmulation* emulation = cpu_matmul_emulation()) return emulation->backward_weight(dweight, dbias, dout, inp);
  cpu::matmul_backward_weight(dweight.f32(), optional_f32(dbias), dout.f32(), inp.f32(), N, C, OC);
}

void add_bias(Tensor out, Tensor bias) {
  const Operands ops = operands(__func__, out, bias);
  const int N = rows(out), C = cols(out);
  ENSURE(bias.numel() == C, "add_bias: bias must be (C), out (N,C)");
  ON_CUDA(ops, add_bias(ops.dtype, out.data, bias.data, N, C));
  cpu::add_bias(out.f32(), bias.f32(), N, C);
}

void bias_backward(Tensor dbias, Tensor dout) {
  const Operands ops = operands(__func__, dbias, dout);
  const int N = rows(dout), C = cols(dout);
  ENSURE(dbias.numel() == C, "bias_backward: dbias must be (C), dout (N,C)");
  ON_CUDA(ops, bias_backward(ops.dtype, dbias.data, dout.data, N, C));
  cpu::bias_backward(dbias.f32(), dout.f32(), N, C);
}

void attention_forward(Tensor out, Tensor preatt, Tensor att, Tensor qkv, int NH) {
  const Operands ops = operands(__func__, out, preatt, att, qkv);
  ENSURE(qkv.ndim == 3 && qkv.shape[2] % 3 == 0, "attention_forward: qkv must be (B,T,3C)");
  const int B = int(qkv.shape[0]), T = int(qkv.shape[1]), C = int(qkv.shape[2] / 3);
  ENSURE(NH > 0 && C % NH == 0, "attention_forward: C must divide into NH heads");
  ENSURE(out.numel() == int64_t(B) * T * C, "attention_forward: out must be (B,T,C)");
  ENSURE(att.numel() == int64_t(B) * NH * T * T && (preatt.empty() || preatt.numel() == att.numel()),
         "attention_forward: preatt and att must be (B,NH,T,T)");
  ENSURE(!preatt.empty() || ops.device == Device::CPU, "attention_forward: preatt may be empty only on the CPU");
  ON_CUDA(ops, attention_forward(ops.dtype, out.data, preatt.data, att.data, qkv.data, B, T, C, NH));
  cpu::attention_forward(out.f32(), optional_f32(preatt), att.f32(), qkv.f32(), B, T, C, NH);
}

void attention_backward(Tensor dqkv, Tensor dpreatt, Tensor datt, Tensor dout, Tensor qkv, Tensor att,
                        int NH, GradWrite write) {
  const Operands ops = operands(__func__, dqkv, dpreatt, datt, dout, qkv, att);
  ENSURE(qkv.ndim == 3 && qkv.shape[2] % 3 == 0, "attention_backward: qkv must be (B,T,3C)");
  const int B = int(qkv.shape[0]), T = int(qkv.shape[1]), C = int(qkv.shape[2] / 3);
  ENSURE(NH > 0 && C % NH == 0, "attention_backward: C must divide into NH heads");
  ENSURE(dqkv.numel() == qkv.numel(), "attention_backward: dqkv and qkv differ in size");
  ENSURE(dout.numel() == int64_t(B) * T * C, "attention_backward: dout must be (B,T,C)");
  const int64_t scores = int64_t(B) * NH * T * T;
  ENSURE(att.numel() == scores && datt.numel() == scores && dpreatt.numel() == scores,
         "attention_backward: att, datt and dpreatt must be (B,NH,T,T)");
  const bool accumulate = write == GradWrite::Accumulate;
  if (!accumulate && ops.device == Device::CUDA) fill_zero(dqkv);  // the CUDA kernels accumulate
  ON_CUDA(ops, attention_backward(ops.dtype, dqkv.data, dpreatt.data, datt.data, dout.data, qkv.data, att.data, B,
                                  T, C, NH));
  cpu::attention_backward(dqkv.f32(), dpreatt.f32(), datt.f32(), dout.f32(), qkv.f32(), att.f32(), B, T, C, NH,
                          accumulate);
}

bool flash_attention_available(DType dtype, Device device, int C, int NH) {
#ifdef GPT_WITH_CUDA
  return device == Device::CUDA && cuda::flash_attention_supported(dtype, C, NH);
#else
  (void)dtype, (void)device, (void)C, (void)NH;
  return false;
#endif
}

namespace {

// The checks of both FlashAttention calls: qkv is (B,T,3C), lse (B,NH,T) fp32, and the kernels exist
// for this dtype, device and head size. Returns B, T and C through the references.
void check_flash(const char* op, const Operands& ops, const Tensor& qkv, const Tensor& lse, int NH, int& B, int& T,
                 int& C) {
  fp32_operands(op, ops.device, lse);
  ENSURE(qkv.ndim == 3 && qkv.shape[2] % 3 == 0, std::string(op) + ": qkv must be (B,T,3C)");
  B = int(qkv.shape[0]), T = int(qkv.shape[1]), C = int(qkv.shape[2] / 3);
  ENSURE(NH > 0 && C % NH == 0, std::string(op) + ": C must divide into NH heads");
  ENSURE(lse.numel() == int64_t(B) * NH * T, std::string(op) + ": lse must be (B,NH,T)");
  ENSURE(flash_attention_available(ops.dtype, ops.device, C, NH),
         std::string(op) + ": FlashAttention runs in bf16 on CUDA with a head size C/NH of 16, 32, 64 or 128; got " +
             dtype_name(ops.dtype) + ", head size " + std::to_string(C / NH) +
             " (ask flash_attention_available first)");
  // The kernels read a head's row in 16-byte vectors: every row of q, k, v (and of the output and
  // its gradient) must start 16 bytes aligned, as the model's 64-byte aligned buffers do.
  ENSURE(reinterpret_cast<uintptr_t>(qkv.data) % 16 == 0,
         std::string(op) + ": qkv must start 16-byte aligned");
}

}  // namespace

void attention_forward_flash(Tensor out, Tensor lse, Tensor qkv, int NH) {
  const Operands ops = operands(__func__, out, qkv);
  int B = 0, T = 0, C = 0;
  check_flash(__func__, ops, qkv, lse, NH, B, T, C);
  ENSURE(out.numel() == int64_t(B) * T * C, "attention_forward_flash: out must be (B,T,C)");
#ifdef GPT_WITH_CUDA  // check_flash made sure that this is a CUDA build and these are CUDA tensors
  cuda::attention_forward_flash(out.data, lse.f32(), qkv.data, B, T, C, NH);
#endif
}

void attention_backward_flash(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int NH) {
  const Operands ops = operands(__func__, dqkv, dout, qkv, out);
  int B = 0, T = 0, C = 0;
  check_flash(__func__, ops, qkv, lse, NH, B, T, C);
  ENSURE(reinterpret_cast<uintptr_t>(dout.data) % 16 == 0, "attention_backward_flash: dout must start 16-byte aligned");
  ENSURE(dqkv.numel() == qkv.numel(), "attention_backward_flash: dqkv and qkv differ in size");
  ENSURE(dout.numel() == int64_t(B) * T * C && out.numel() == dout.numel(),
         "attention_backward_flash: dout and out must be (B,T,C)");
#ifdef GPT_WITH_CUDA  // as in the forward
  cuda::attention_backward_flash(dqkv.data, dout.data, qkv.data, out.data, lse.f32(), B, T, C, NH);
#endif
}

void gelu_forward(Tensor out, Tensor inp) {
  const Operands ops = operands(__func__, out, inp);
  ENSURE(out.numel() == inp.numel(), "gelu_forward: out and inp differ in size");
  ON_CUDA(ops, gelu_forward(ops.dtype, out.data, inp.data, count(inp)));
  cpu::gelu_forward(out.f32(), inp.f32(), count(inp));
}

void gelu_backward(Tensor dinp, Tensor inp, Tensor dout, GradWrite write) {
  const Operands ops = operands(__func__, dinp, inp, dout);
  ENSURE(dinp.numel() == inp.numel() && dout.numel() == inp.numel(), "gelu_backward: sizes differ");
  const bool accumulate = write == GradWrite::Accumulate;
  ON_CUDA(ops, gelu_backward(ops.dtype, dinp.data, inp.data, dout.data, count(inp), accumulate));
  cpu::gelu_backward(dinp.f32(), inp.f32(), dout.f32(), count(inp), accumulate);
}

void matmul_forward_gelu(Tensor out, Tensor out_gelu, Tensor inp, Tensor weight, Tensor bias) {
  const Operands ops = operands(__func__, out, out_gelu, inp, weight, bias);
  if (ops.device != Device::CPU || cpu_matmul_emulation()) {
    matmul_forward(out, inp, weight, bias);
    return gelu_forward(out_gelu, out);
  }
  const int N = rows(inp), C = cols(inp), OC = rows(weight);
  ENSURE(cols(weight) == C, "matmul_forward_gelu: inner dimensions differ (inp is (N,C), weight must be (OC,C))");
  ENSURE(rows(out) == N && cols(out) == OC, "matmul_forward_gelu: out must be (N,OC)");
  ENSURE(out_gelu.numel() == out.numel(), "matmul_forward_gelu: out_gelu and out differ in size");
  ENSURE(bias.empty() || bias.numel() == OC, "matmul_forward_gelu: bias must be (OC)");
  const MatmulClock clock(N, C, OC);
  cpu::matmul_forward_gelu(out.f32(), out_gelu.f32(), inp.f32(), weight.f32(), optional_f32(bias), N, C, OC);
}

void matmul_backward_input_gelu(Tensor dinp, Tensor dout, Tensor weight, Tensor gelu_inp) {
  const Operands ops = operands(__func__, dinp, dout, weight, gelu_inp);
  if (ops.device != Device::CPU || cpu_matmul_emulation()) {
    // dinp holds dout @ weight, then its GELU backward in place (each element read, then written).
    matmul_backward_input(dinp, dout, weight, GradWrite::Overwrite);
    return gelu_backward(dinp, gelu_inp, dinp, GradWrite::Overwrite);
  }
  const int N = rows(dout), OC = cols(dout), C = cols(weight);
  ENSURE(rows(weight) == OC, "matmul_backward_input_gelu: dout is (N,OC), weight must be (OC,C)");
  ENSURE(dinp.numel() == int64_t(N) * C, "matmul_backward_input_gelu: dinp must be (N,C)");
  ENSURE(gelu_inp.numel() == dinp.numel(), "matmul_backward_input_gelu: gelu_inp and dinp differ in size");
  const MatmulClock clock(N, C, OC);
  cpu::matmul_backward_input_gelu(dinp.f32(), dout.f32(), weight.f32(), gelu_inp.f32(), N, C, OC);
}

void residual_forward(Tensor out, Tensor a, Tensor b) {
  const Operands ops = operands(__func__, out, a, b);
  ENSURE(a.numel() == out.numel() && b.numel() == out.numel(), "residual_forward: sizes differ");
  ON_CUDA(ops, residual_forward(ops.dtype, out.data, a.data, b.data, count(out)));
  cpu::residual_forward(out.f32(), a.f32(), b.f32(), count(out));
}

void residual_layernorm_forward(Tensor out, Tensor ln, Tensor mean, Tensor rstd, Tensor a, Tensor b, Tensor weight,
                                Tensor bias) {
  const Operands ops = operands(__func__, out, ln, a, b, weight, bias);
  if (ops.device != Device::CPU) {
    residual_forward(out, a, b);
    return layernorm_forward(ln, mean, rstd, out, weight, bias);
  }
  fp32_operands(__func__, ops.device, mean, rstd);
  const int N = rows(out), C = cols(out);
  ENSURE(a.numel() == out.numel() && b.numel() == out.numel() && ln.numel() == out.numel(),
         "residual_layernorm_forward: out, ln, a and b differ in size");
  ENSURE(mean.numel() == N && rstd.numel() == N,
         "residual_layernorm_forward: mean and rstd must hold one value per row");
  ENSURE(weight.numel() == C && bias.numel() == C, "residual_layernorm_forward: weight and bias must be (C)");
  cpu::residual_layernorm_forward(out.f32(), ln.f32(), mean.f32(), rstd.f32(), a.f32(), b.f32(), weight.f32(),
                                  bias.f32(), N, C);
}

void residual_backward(Tensor da, Tensor db, Tensor dout) {
  const Operands ops = operands(__func__, da, db, dout);
  ENSURE(da.numel() == dout.numel() && db.numel() == dout.numel(), "residual_backward: sizes differ");
  ON_CUDA(ops, residual_backward(ops.dtype, da.data, db.data, dout.data, count(dout)));
  cpu::residual_backward(da.f32(), db.f32(), dout.f32(), count(dout));
}

void softmax_crossentropy_forward(Tensor losses, Tensor probs, Tensor logits, const int* targets) {
  const Operands ops = operands(__func__, probs, logits);
  fp32_operands(__func__, ops.device, losses);
  const int N = rows(logits), V = cols(logits);
  ENSURE(probs.numel() == logits.numel(), "softmax_crossentropy_forward: probs and logits differ in size");
  ENSURE(losses.numel() == N, "softmax_crossentropy_forward: losses must hold one value per position (B,T)");
  ON_CUDA(ops, softmax_crossentropy_forward(ops.dtype, losses.f32(), probs.data, logits.data, targets, N, V));
  cpu::softmax_crossentropy_forward(losses.f32(), probs.f32(), logits.f32(), targets, N, V);
}

void softmax_crossentropy_backward(Tensor dlogits, Tensor probs, const int* targets, float dloss, int vocab_begin) {
  const Operands ops = operands(__func__, dlogits, probs);
  const int N = rows(probs), V = cols(probs);
  ENSURE(dlogits.numel() == probs.numel(), "softmax_crossentropy_backward: dlogits and probs differ in size");
  ENSURE(vocab_begin >= 0, "softmax_crossentropy_backward: vocab_begin must be >= 0");
  ON_CUDA(ops, softmax_crossentropy_backward(ops.dtype, dlogits.data, probs.data, targets, dloss, N, V, vocab_begin));
  cpu::softmax_crossentropy_backward(dlogits.f32(), probs.f32(), targets, dloss, N, V, vocab_begin);
}

void crossentropy_shard_max(Tensor row_max, Tensor target_logit, Tensor logits, const int* targets,
                            int vocab_begin) {
  const Operands ops = operands(__func__, logits);
  fp32_operands(__func__, ops.device, row_max, target_logit);
  const int N = rows(logits), Vl = cols(logits);
  ENSURE(row_max.numel() == N && target_logit.numel() == N,
         "crossentropy_shard_max: row_max and target_logit must hold one value per row of logits");
  ENSURE(vocab_begin >= 0, "crossentropy_shard_max: vocab_begin must be >= 0");
  ON_CUDA(ops, crossentropy_shard_max(ops.dtype, row_max.f32(), target_logit.f32(), logits.data, targets, N, Vl,
                                      vocab_begin));
  cpu::crossentropy_shard_max(row_max.f32(), target_logit.f32(), logits.f32(), targets, N, Vl, vocab_begin);
}

void crossentropy_shard_exp(Tensor probs, Tensor row_sum, Tensor logits, Tensor row_max) {
  const Operands ops = operands(__func__, probs, logits);
  fp32_operands(__func__, ops.device, row_sum, row_max);
  const int N = rows(logits), Vl = cols(logits);
  ENSURE(probs.numel() == logits.numel(), "crossentropy_shard_exp: probs and logits differ in size");
  ENSURE(row_sum.numel() == N && row_max.numel() == N,
         "crossentropy_shard_exp: row_sum and row_max must hold one value per row of logits");
  ON_CUDA(ops, crossentropy_shard_exp(ops.dtype, probs.data, row_sum.f32(), logits.data, row_max.f32(), N, Vl));
  cpu::crossentropy_shard_exp(probs.f32(), row_sum.f32(), logits.f32(), row_max.f32(), N, Vl);
}

void crossentropy_shard_finish(Tensor losses, Tensor probs, Tensor row_max, Tensor row_sum, Tensor target_logit) {
  const Operands ops = operands(__func__, probs);
  fp32_operands(__func__, ops.device, losses, row_max, row_sum, target_logit);
  const int N = rows(probs), Vl = cols(probs);
  ENSURE(losses.numel() == N && row_max.numel() == N && row_sum.numel() == N && target_logit.numel() == N,
         "crossentropy_shard_finish: losses, row_max, row_sum and target_logit must hold one value per row of probs");
  ON_CUDA(ops, crossentropy_shard_finish(ops.dtype, losses.f32(), probs.data, row_max.f32(), row_sum.f32(),
                                         target_logit.f32(), N, Vl));
  cpu::crossentropy_shard_finish(losses.f32(), probs.f32(), row_max.f32(), row_sum.f32(), target_logit.f32(), N,
                                 Vl);
}

void fill_zero(Tensor t) {
  const Operands ops = operands(__func__, t);
  ON_CUDA(ops, fill_zero(ops.dtype, t.data, count(t)));
  cpu::fill_zero(t.f32(), count(t));
}

void copy_tensor(Tensor dst, Tensor src) {
  const Operands ops = operands(__func__, dst, src);
  ENSURE(dst.numel() == src.numel(), "copy_tensor: dst and src differ in size");
  ON_CUDA(ops, copy_tensor(ops.dtype, dst.data, src.data, count(src)));
  cpu::copy_tensor(dst.f32(), src.f32(), count(src));
}

void add_inplace(Tensor dst, Tensor src) {
  const Operands ops = operands(__func__, dst, src);
  ENSURE(dst.numel() == src.numel(), "add_inplace: dst and src differ in size");
  ON_CUDA(ops, add_inplace(ops.dtype, dst.data, src.data, count(src)));
  cpu::add_inplace(dst.f32(), src.f32(), count(src));
}

void scale_inplace(Tensor t, float factor) {
  const Operands ops = operands(__func__, t);
  ON_CUDA(ops, scale_inplace(ops.dtype, t.data, factor, count(t)));
  cpu::scale_inplace(t.f32(), factor, count(t));
}

// Not through operands(): the two sides differ in dtype by design, and the CPU converts bf16 too (a
// checkpoint, say, is read and written in fp32 while the model's parameters are bf16).
void convert_tensor(Tensor dst, Tensor src) {
  const char* op = __func__;
  ENSURE(!dst.empty() && !src.empty(), std::string(op) + ": an operand is empty");
  ENSURE(dst.device == src.device, std::string(op) + ": tensors on different devices (copy between devices first)");
  for (const Tensor* t : {&dst, &src}) {
    ENSURE(t->dtype == DType::F32 || t->dtype == DType::BF16,
           std::string(op) + ": converts between fp32 and bf16, not " + dtype_name(t->dtype));
  }
  ENSURE(dst.numel() == src.numel(), std::string(op) + ": dst and src differ in size");
  const size_t n = count(src);
  const Operands ops{dst.device, dst.dtype};
  ON_CUDA(ops, convert(dst.dtype, dst.data, src.dtype, src.data, n));
  if (dst.dtype == src.dtype) {
    if (dst.data != src.data) std::memmove(dst.data, src.data, src.bytes());
  } else if (dst.dtype == DType::BF16) {
    bf16_bits* to = static_cast<bf16_bits*>(dst.data);
    const float* from = src.f32();
    for (size_t i = 0; i < n; i++) to[i] = float_to_bf16(from[i]);
  } else {
    float* to = dst.f32();
    const bf16_bits* from = static_cast<const bf16_bits*>(src.data);
    for (size_t i = 0; i < n; i++) to[i] = bf16_to_float(from[i]);
  }
}

double sum_of_squares(Tensor t) {
  const Operands ops = operands(__func__, t);
  ON_CUDA(ops, sum_of_squares(ops.dtype, t.data, count(t)));
  return cpu::sum_of_squares(t.f32(), count(t));
}

double mean_of(Tensor t) {
  const Operands ops = operands(__func__, t);
  ON_CUDA(ops, mean_of(ops.dtype, t.data, count(t)));
  return cpu::mean_of(t.f32(), count(t));
}

void adamw_update(Tensor param, Tensor master, Tensor grad, Tensor m, Tensor v, int step, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale) {
  const Operands ops = operands(__func__, param, grad);
  fp32_operands(__func__, ops.device, m, v);
  const int64_t n = param.numel();
  ENSURE(grad.numel() == n && m.numel() == n && v.numel() == n, "adamw_update: param, grad, m and v differ in size");
  // The weight AdamW updates is fp32: param itself in fp32, the master copy when param is bf16.
  if (ops.dtype == DType::F32) {
    ENSURE(master.empty(), "adamw_update: fp32 parameters are their own master weights; pass an empty master");
  } else {
    ENSURE(!master.empty(), "adamw_update: bf16 parameters need fp32 master weights");
    fp32_operands(__func__, ops.device, master);
    ENSURE(master.numel() == n, "adamw_update: master and param differ in size");
  }
  ON_CUDA(ops, adamw_update(ops.dtype, param.data, master.empty() ? nullptr : master.f32(), grad.data, m.f32(),
                            v.f32(), count(param), step, lr, beta1, beta2, eps, weight_decay, grad_scale));
  cpu::adamw_update(param.f32(), grad.f32(), m.f32(), v.f32(), count(param), step, lr, beta1, beta2, eps,
                    weight_decay, grad_scale);
}
