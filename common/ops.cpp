// ops.cpp: the definitions of ops.h. Each op checks that its tensors' shapes fit together, reads the
// sizes (B, T, C, ...) from those shapes, and runs the CPU version (namespace cpu, ops_cpu.h) or, for
// CUDA tensors, the CUDA version (namespace cuda, ops_cuda.h), which takes the same raw-pointer arguments.
// The checks are cheap (a few integer comparisons per call) and catch a wrong view at the call that
// made it, instead of as garbage numbers many layers later.
#include "ops.h"

#include <cstdint>
#include <string>

#include "check.h"    // ENSURE, fatal
#include "ops_cpu.h"  // cpu::
#ifdef GPT_WITH_CUDA
#include "ops_cuda.h"  // cuda::, the same signatures as cpu::
#endif

namespace {

// Runs `op` from namespace cuda or cpu with the given arguments and returns its result. A macro, so
// that one line per op names the function in both namespaces and returns void and double alike.
#ifdef GPT_WITH_CUDA
#define RUN_OP(device, op, ...)                                  \
  do {                                                           \
    if ((device) == Device::CUDA) return cuda::op(__VA_ARGS__);  \
    return cpu::op(__VA_ARGS__);                                 \
  } while (0)
#else
#define RUN_OP(device, op, ...)                                  \
  do {                                                           \
    if ((device) == Device::CUDA) built_without_cuda(#op);       \
    return cpu::op(__VA_ARGS__);                                 \
  } while (0)

[[noreturn]] void built_without_cuda(const char* op) {
  fatal(std::string(op) + ": got a CUDA tensor, but this program was built without CUDA (GPT_WITH_CUDA "
        "undefined); build it on a machine with nvcc");
}
#endif

void check_operand(const char* op, Device device, const Tensor& t) {
  if (t.empty()) return;  // optional operands (a matmul without bias)
  ENSURE(t.device == device, std::string(op) + ": tensors on different devices");
  // Only fp32 exists on the CPU; a CUDA version checks its own dtypes.
  ENSURE(device != Device::CPU || t.dtype == DType::F32, std::string(op) + ": CPU ops take fp32 tensors");
}

// Checks that the operands of `op` share one device (empty ones, i.e. absent optional operands, are
// skipped) and, on the CPU, are fp32. Returns that device.
template <typename... Tensors>
Device operands(const char* op, const Tensor& first, const Tensors&... rest) {
  ENSURE(!first.empty(), std::string(op) + ": the first operand is empty");
  check_operand(op, first.device, first);
  (check_operand(op, first.device, rest), ...);
  return first.device;
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

}  // namespace

// ----------------------------------------------------------------------------------------------------------

void encoder_forward(Tensor out, const int* tokens, Tensor wte, Tensor wpe, int B, int T) {
  Device device = operands(__func__, out, wte, wpe);
  const int C = cols(out), V = rows(wte);
  ENSURE(out.numel() == int64_t(B) * T * C, "encoder_forward: out must be (B,T,C)");
  ENSURE(cols(wte) == C && cols(wpe) == C, "encoder_forward: wte, wpe and out differ in C");
  ENSURE(T <= rows(wpe), "encoder_forward: T exceeds the rows of the position table wpe");
  RUN_OP(device, encoder_forward, out.f32(), tokens, wte.f32(), wpe.f32(), B, T, C, V);
}

void encoder_backward(Tensor dwte, Tensor dwpe, Tensor dout, const int* tokens, int B, int T) {
  Device device = operands(__func__, dwte, dwpe, dout);
  const int C = cols(dout), V = rows(dwte);
  ENSURE(dout.numel() == int64_t(B) * T * C, "encoder_backward: dout must be (B,T,C)");
  ENSURE(cols(dwte) == C && cols(dwpe) == C, "encoder_backward: dwte, dwpe and dout differ in C");
  ENSURE(T <= rows(dwpe), "encoder_backward: T exceeds the rows of dwpe");
  RUN_OP(device, encoder_backward, dwte.f32(), dwpe.f32(), dout.f32(), tokens, B, T, C, V);
}

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias) {
  Device device = operands(__func__, out, mean, rstd, inp, weight, bias);
  const int N = rows(inp), C = cols(inp);
  ENSURE(out.numel() == inp.numel(), "layernorm_forward: out and inp differ in size");
  ENSURE(mean.numel() == N && rstd.numel() == N, "layernorm_forward: mean and rstd must hold one value per row");
  ENSURE(weight.numel() == C && bias.numel() == C, "layernorm_forward: weight and bias must be (C)");
  RUN_OP(device, layernorm_forward, out.f32(), mean.f32(), rstd.f32(), inp.f32(), weight.f32(), bias.f32(), N,
         C);
}

void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                        Tensor mean, Tensor rstd) {
  Device device = operands(__func__, dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  const int N = rows(inp), C = cols(inp);
  ENSURE(dinp.numel() == inp.numel() && dout.numel() == inp.numel(),
         "layernorm_backward: dinp, dout and inp differ in size");
  ENSURE(mean.numel() == N && rstd.numel() == N, "layernorm_backward: mean and rstd must hold one value per row");
  ENSURE(weight.numel() == C && dweight.numel() == C && dbias.numel() == C,
         "layernorm_backward: weight, dweight and dbias must be (C)");
  RUN_OP(device, layernorm_backward, dinp.f32(), dweight.f32(), dbias.f32(), dout.f32(), inp.f32(),
         weight.f32(), mean.f32(), rstd.f32(), N, C);
}

void matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) {
  Device device = operands(__func__, out, inp, weight, bias);
  const int N = rows(inp), C = cols(inp), OC = rows(weight);
  ENSURE(cols(weight) == C, "matmul_forward: inner dimensions differ (inp is (N,C), weight must be (OC,C))");
  ENSURE(rows(out) == N && cols(out) == OC, "matmul_forward: out must be (N,OC)");
  ENSURE(bias.empty() || bias.numel() == OC, "matmul_forward: bias must be (OC)");
  RUN_OP(device, matmul_forward, out.f32(), inp.f32(), weight.f32(), optional_f32(bias), N, C, OC);
}

void matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight) {
  Device device = operands(__func__, dinp, dweight, dbias, dout, inp, weight);
  const int N = rows(inp), C = cols(inp), OC = rows(weight);
  ENSURE(cols(weight) == C, "matmul_backward: inner dimensions differ (inp is (N,C), weight must be (OC,C))");
  ENSURE(rows(dout) == N && cols(dout) == OC, "matmul_backward: dout must be (N,OC)");
  ENSURE(dinp.numel() == inp.numel(), "matmul_backward: dinp and inp differ in size");
  ENSURE(dweight.numel() == weight.numel(), "matmul_backward: dweight and weight differ in size");
  ENSURE(dbias.empty() || dbias.numel() == OC, "matmul_backward: dbias must be (OC)");
  RUN_OP(device, matmul_backward, dinp.f32(), dweight.f32(), optional_f32(dbias), dout.f32(), inp.f32(),
         weight.f32(), N, C, OC);
}

void attention_forward(Tensor out, Tensor preatt, Tensor att, Tensor qkv, int NH) {
  Device device = operands(__func__, out, preatt, att, qkv);
  ENSURE(qkv.ndim == 3 && qkv.shape[2] % 3 == 0, "attention_forward: qkv must be (B,T,3C)");
  const int B = int(qkv.shape[0]), T = int(qkv.shape[1]), C = int(qkv.shape[2] / 3);
  ENSURE(NH > 0 && C % NH == 0, "attention_forward: C must divide into NH heads");
  ENSURE(out.numel() == int64_t(B) * T * C, "attention_forward: out must be (B,T,C)");
  ENSURE(preatt.numel() == int64_t(B) * NH * T * T && att.numel() == preatt.numel(),
         "attention_forward: preatt and att must be (B,NH,T,T)");
  RUN_OP(device, attention_forward, out.f32(), preatt.f32(), att.f32(), qkv.f32(), B, T, C, NH);
}

void attention_backward(Tensor dqkv, Tensor dpreatt, Tensor datt, Tensor dout, Tensor qkv, Tensor att,
                        int NH) {
  Device device = operands(__func__, dqkv, dpreatt, datt, dout, qkv, att);
  ENSURE(qkv.ndim == 3 && qkv.shape[2] % 3 == 0, "attention_backward: qkv must be (B,T,3C)");
  const int B = int(qkv.shape[0]), T = int(qkv.shape[1]), C = int(qkv.shape[2] / 3);
  ENSURE(NH > 0 && C % NH == 0, "attention_backward: C must divide into NH heads");
  ENSURE(dqkv.numel() == qkv.numel(), "attention_backward: dqkv and qkv differ in size");
  ENSURE(dout.numel() == int64_t(B) * T * C, "attention_backward: dout must be (B,T,C)");
  const int64_t scores = int64_t(B) * NH * T * T;
  ENSURE(att.numel() == scores && datt.numel() == scores && dpreatt.numel() == scores,
         "attention_backward: att, datt and dpreatt must be (B,NH,T,T)");
  RUN_OP(device, attention_backward, dqkv.f32(), dpreatt.f32(), datt.f32(), dout.f32(), qkv.f32(), att.f32(), B,
         T, C, NH);
}

void gelu_forward(Tensor out, Tensor inp) {
  Device device = operands(__func__, out, inp);
  ENSURE(out.numel() == inp.numel(), "gelu_forward: out and inp differ in size");
  RUN_OP(device, gelu_forward, out.f32(), inp.f32(), count(inp));
}

void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) {
  Device device = operands(__func__, dinp, inp, dout);
  ENSURE(dinp.numel() == inp.numel() && dout.numel() == inp.numel(), "gelu_backward: sizes differ");
  RUN_OP(device, gelu_backward, dinp.f32(), inp.f32(), dout.f32(), count(inp));
}

void residual_forward(Tensor out, Tensor a, Tensor b) {
  Device device = operands(__func__, out, a, b);
  ENSURE(a.numel() == out.numel() && b.numel() == out.numel(), "residual_forward: sizes differ");
  RUN_OP(device, residual_forward, out.f32(), a.f32(), b.f32(), count(out));
}

void residual_backward(Tensor da, Tensor db, Tensor dout) {
  Device device = operands(__func__, da, db, dout);
  ENSURE(da.numel() == dout.numel() && db.numel() == dout.numel(), "residual_backward: sizes differ");
  RUN_OP(device, residual_backward, da.f32(), db.f32(), dout.f32(), count(dout));
}

void softmax_crossentropy_forward(Tensor losses, Tensor probs, Tensor logits, const int* targets) {
  Device device = operands(__func__, losses, probs, logits);
  const int N = rows(logits), V = cols(logits);
  ENSURE(probs.numel() == logits.numel(), "softmax_crossentropy_forward: probs and logits differ in size");
  ENSURE(losses.numel() == N, "softmax_crossentropy_forward: losses must hold one value per position (B,T)");
  RUN_OP(device, softmax_crossentropy_forward, losses.f32(), probs.f32(), logits.f32(), targets, N, V);
}

void softmax_crossentropy_backward(Tensor dlogits, Tensor probs, const int* targets, float dloss) {
  Device device = operands(__func__, dlogits, probs);
  const int N = rows(probs), V = cols(probs);
  ENSURE(dlogits.numel() == probs.numel(), "softmax_crossentropy_backward: dlogits and probs differ in size");
  RUN_OP(device, softmax_crossentropy_backward, dlogits.f32(), probs.f32(), targets, dloss, N, V);
}

void fill_zero(Tensor t) {
  Device device = operands(__func__, t);
  RUN_OP(device, fill_zero, t.f32(), count(t));
}

void copy_tensor(Tensor dst, Tensor src) {
  Device device = operands(__func__, dst, src);
  ENSURE(dst.numel() == src.numel(), "copy_tensor: dst and src differ in size");
  RUN_OP(device, copy_tensor, dst.f32(), src.f32(), count(src));
}

void add_inplace(Tensor dst, Tensor src) {
  Device device = operands(__func__, dst, src);
  ENSURE(dst.numel() == src.numel(), "add_inplace: dst and src differ in size");
  RUN_OP(device, add_inplace, dst.f32(), src.f32(), count(src));
}

void scale_inplace(Tensor t, float factor) {
  Device device = operands(__func__, t);
  RUN_OP(device, scale_inplace, t.f32(), factor, count(t));
}

double sum_of_squares(Tensor t) {
  Device device = operands(__func__, t);
  RUN_OP(device, sum_of_squares, t.f32(), count(t));
}

double mean_of(Tensor t) {
  Device device = operands(__func__, t);
  RUN_OP(device, mean_of, t.f32(), count(t));
}

void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, int step, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale) {
  Device device = operands(__func__, param, grad, m, v);
  ENSURE(grad.numel() == param.numel() && m.numel() == param.numel() && v.numel() == param.numel(),
         "adamw_update: param, grad, m and v differ in size");
  RUN_OP(device, adamw_update, param.f32(), grad.f32(), m.f32(), v.f32(), count(param), step, lr, beta1, beta2,
         eps, weight_decay, grad_scale);
}
