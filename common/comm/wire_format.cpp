// wire_format.cpp: the collectives in a format (wire_format.h): codes staged beside the caller's fp32
// tensors, the communicator's own collective over the codes, and the decoding when the caller waits.
#include "comm/wire_format.h"

#include <cmath>
#include <cstring>
#include <memory>

#include "base/check.h"

namespace {

Overflow overflow_of(NumberFormat f) {
  // fp8 saturates as the recipes' quantization does; bf16 and fp16 overflow to infinity, so that an
  // fp16 sum too large for the format reaches the loss scaler as the products' overflows do.
  return f == NumberFormat::E4M3 || f == NumberFormat::E5M2 ? Overflow::Saturate : Overflow::Ieee;
}

void check_wire(const Wire& w) {
  int exponent = 0;
  ENSURE(w.scale > 0 && std::frexp(w.scale, &exponent) == 0.5f, "a wire's scale must be a power of two");
}

DType code_dtype(NumberFormat f) {
  ENSURE(f == NumberFormat::BF16 || f == NumberFormat::FP16, "a reduction on the wire takes bf16 or fp16");
  return f == NumberFormat::BF16 ? DType::BF16 : DType::F16;
}

// The 16-bit codes of n values times `multiplier`.
std::shared_ptr<std::vector<uint16_t>> encode16(const float* x, int64_t n, NumberFormat f, float multiplier) {
  auto codes = std::make_shared<std::vector<uint16_t>>(size_t(n));
  const Overflow o = overflow_of(f);
  for (int64_t i = 0; i < n; i++) (*codes)[size_t(i)] = encode_float(f, x[i] * multiplier, o);
  return codes;
}

void decode16(const std::vector<uint16_t>& codes, float* out, NumberFormat f, float scale) {
  const float inverse = 1.0f / scale;  // exact: a power of two
  for (size_t i = 0; i < codes.size(); i++) out[i] = decode_code(f, codes[i]) * inverse;
}

Tensor view_of(std::vector<uint16_t>& codes, NumberFormat f) {
  return make_view(codes.data(), {int64_t(codes.size())}, code_dtype(f));
}

// A handle that waits for the collective over the codes, then decodes them, once.
CommHandle then(CommHandle inner, std::function<void()> decode) {
  auto done = std::make_shared<bool>(false);
  return CommHandle([inner, decode = std::move(decode), done]() mutable {
    if (*done) return;
    inner.wait();
    decode();
    *done = true;
  });
}

float premultiplier(const Communicator& comm, ReduceOp op, const Wire& w) {
  return op == ReduceOp::Avg ? w.scale / float(comm.size()) : w.scale;
}

ReduceOp on_codes(ReduceOp op) { return op == ReduceOp::Avg ? ReduceOp::Sum : op; }  // averaged before the send

// Calls fn(begin, count, wire) for the runs of [begin, begin + count) that travel in one format.
template <typename Fn>
void for_each_run(const std::vector<WireSegment>& segments, int64_t begin, int64_t count, Fn fn) {
  const int64_t end = begin + count;
  int64_t at = begin;
  const Wire fp32;
  for (const WireSegment& s : segments) {
    const int64_t s_begin = std::max(s.begin, at), s_end = std::min(s.begin + s.count, end);
    if (s_end <= s_begin) continue;
    if (s_begin > at) fn(at, s_begin - at, fp32);
    fn(s_begin, s_end - s_begin, s.wire);
    at = s_end;
  }
  if (at < end) fn(at, end - at, fp32);
}

// Element x's code at `out`, in w's bytes (fp32: its own 4 bytes); returns the bytes written.
int64_t put(const Wire& w, float x, unsigned char* out) {
  if (w.fp32) {
    std::memcpy(out, &x, 4);
    return 4;
  }
  const uint16_t code = encode_float(w.format, x * w.scale, overflow_of(w.format));
  if (w.element_bytes() == 1) {
    *out = static_cast<unsigned char>(code);
  } else {
    std::memcpy(out, &code, 2);
  }
  return w.element_bytes();
}

int64_t get(const Wire& w, const unsigned char* in, float* x) {
  if (w.fp32) {
    std::memcpy(x, in, 4);
    return 4;
  }
  uint16_t code = 0;
  if (w.element_bytes() == 1) {
    code = *in;
  } else {
    std::memcpy(&code, in, 2);
  }
  *x = decode_code(w.format, code) * (1.0f / w.scale);
  return w.element_bytes();
}

}  // namespace

Wire Wire::in(NumberFormat format, float scale) {
  Wire w;
  w.fp32 = false;
  w.format = format;
  w.scale = scale;
  return w;
}

std::string Wire::name() const {
  if (fp32) return "fp32";
  std::string s = format_name(format);
  if (scale != 1) s += " x 2^" + std::to_string(std::ilogb(scale));
  return s;
}

CommHandle wire_all_reduce_async(Communicator& comm, Tensor buf, ReduceOp op, const Wire& w) {
  if (w.fp32 || comm.size() == 1) return comm.all_reduce_async(buf, op);
  check_wire(w);
  auto codes = encode16(buf.f32(), buf.numel(), w.format, premultiplier(comm, op, w));
  CommHandle inner = comm.all_reduce_async(view_of(*codes, w.format), on_codes(op));
  return then(inner, [codes, buf, w] { decode16(*codes, buf.f32(), w.format, w.scale); });
}

void wire_all_reduce(Communicator& comm, Tensor buf, ReduceOp op, const Wire& w) {
  if (w.fp32 || comm.size() == 1) return comm.all_reduce(buf, op);
  wire_all_reduce_async(comm, buf, op, w).wait();
}

CommHandle wire_reduce_scatter_async(Communicator& comm, Tensor send, Tensor recv, ReduceOp op, const Wire& w) {
  if (w.fp32 || comm.size() == 1) return comm.reduce_scatter_async(send, recv, op);
  check_wire(w);
  auto sent = encode16(send.f32(), send.numel(), w.format, premultiplier(comm, op, w));
  auto received = std::make_shared<std::vector<uint16_t>>(size_t(recv.numel()));
  CommHandle inner = comm.reduce_scatter_async(view_of(*sent, w.format), view_of(*received, w.format), on_codes(op));
  return then(inner, [sent, received, recv, w] { decode16(*received, recv.f32(), w.format, w.scale); });
}

CommHandle wire_all_gather_async(Communicator& comm, Tensor send, Tensor recv, const Wire& w) {
  if (w.fp32 || comm.size() == 1) return comm.all_gather_async(send, recv);
  return wire_all_gather_segments_async(comm, send, recv, {WireSegment{0, recv.numel(), w}});
}

int64_t wire_bytes_of_range(const std::vector<WireSegment>& segments, int64_t begin, int64_t count) {
  int64_t bytes = 0;
  for_each_run(segments, begin, count, [&](int64_t, int64_t n, const Wire& w) { bytes += n * w.element_bytes(); });
  return bytes;
}

CommHandle wire_all_gather_segments_async(Communicator& comm, Tensor send, Tensor recv,
                                          const std::vector<WireSegment>& segments) {
  const int N = comm.size();
  if (N == 1) return comm.all_gather_async(send, recv);
  const int64_t n = recv.numel() / N;
  ENSURE(recv.numel() == n * N && send.numel() == n, "wire_all_gather: send must hold recv's size / ranks elements");
  for (const WireSegment& s : segments)
    if (!s.wire.fp32) check_wire(s.wire);
  std::vector<int64_t> counts(static_cast<size_t>(N), 0);
  int64_t total = 0;
  for (int r = 0; r < N; r++) total += counts[size_t(r)] = wire_bytes_of_range(segments, r * n, n);
  const int me = comm.rank();
  auto sent = std::make_shared<std::vector<unsigned char>>(size_t(counts[size_t(me)]));
  auto received = std::make_shared<std::vector<unsigned char>>(size_t(total));
  const float* x = send.f32();
  unsigned char* out = sent->data();
  for_each_run(segments, me * n, n, [&](int64_t begin, int64_t count, const Wire& w) {
    for (int64_t i = 0; i < count; i++) out += put(w, x[begin - me * n + i], out);
  });
  const Tensor send_bytes = make_view(sent->data(), {int64_t(sent->size())}, DType::U8);
  const Tensor recv_bytes = make_view(received->data(), {total}, DType::U8);
  CommHandle inner = comm.all_gather_v_async(send_bytes, recv_bytes, counts);
  return then(inner, [sent, received, recv, segments, n, N] {
    const unsigned char* in = received->data();
    float* y = recv.f32();
    for (int r = 0; r < N; r++)
      for_each_run(segments, r * n, n, [&](int64_t begin, int64_t count, const Wire& w) {
        for (int64_t i = 0; i < count; i++) in += get(w, in, &y[begin + i]);
      });
  });
}

const CollectiveFormats& collective_formats(const Communicator& comm) { return comm.formats(); }
void set_collective_formats(Communicator& comm, const CollectiveFormats& formats) { comm.formats() = formats; }
