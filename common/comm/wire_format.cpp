// wire_format.cpp: the collectives in a format (wire_format.h): codes staged beside the caller's fp32
// tensors in the communicator's reused staging buffer, the communicator's own collective over the
// codes, and the decoding when the caller waits.
#include "comm/wire_format.h"
#include "comm/wire_p2p.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "base/check.h"
#include "ops/memory.h"  // Buffer: the staging, counted as communication buffers

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

// A communicator's staging (Communicator::wire_staging): one block of bytes in which every call in
// flight stages its codes, each region at the lowest offset free for it (first fit), given back when
// the caller waits. A region past the block's end spills into a buffer of its own, freed when given
// back; once nothing is in flight the block grows, once, to the furthest end a region took.
// So a run allocates in its first step only (its calls come in the same order every step), and from
// then on the block holds what the communicator's calls in flight at once stage (docs/theory.md,
// section 3). Its bytes count as communication buffers.
class Staging {
 public:
  unsigned char* take(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    bytes = std::max<int64_t>(2, bytes + bytes % 2);  // 16-bit codes stay aligned; no two regions share an offset
    int64_t at = 0;
    for (const auto& [begin, size] : regions_) {  // in offset order: the first gap that fits
      if (begin - at >= bytes) break;
      at = std::max(at, begin + size);
    }
    regions_[at] = bytes;
    furthest_ = std::max(furthest_, at + bytes);
    if (at + bytes <= block_.count()) return static_cast<unsigned char*>(block_.data()) + at;
    Buffer& spill = spills_[at] = Buffer(bytes, MemCategory::CommBuffers, DType::U8);
    return static_cast<unsigned char*>(spill.data());
  }
  uint16_t* take16(int64_t codes) { return reinterpret_cast<uint16_t*>(take(2 * codes)); }
  void give_back(const void* region) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto* p = static_cast<const unsigned char*>(region);
    const auto* base = static_cast<const unsigned char*>(block_.data());
    auto spill = std::find_if(spills_.begin(), spills_.end(), [&](const auto& s) { return s.second.data() == region; });
    if (spill != spills_.end()) {
      regions_.erase(spill->first);
      spills_.erase(spill);
    } else {
      ENSURE(base && p >= base && p < base + block_.count(), "wire staging: a region given back twice");
      regions_.erase(p - base);
    }
    if (regions_.empty()) grow();
  }
  int64_t bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    int64_t total = block_.count();
    for (const auto& [at, b] : spills_) total += b.count();
    return total;
  }

 private:
  void grow() {
    if (furthest_ <= block_.count()) return;
    block_ = Buffer();  // freed before the larger one is counted
    block_ = Buffer(furthest_, MemCategory::CommBuffers, DType::U8);
  }
  std::mutex mutex_;
  Buffer block_;
  std::map<int64_t, int64_t> regions_;  // in flight: offset -> bytes
  std::map<int64_t, Buffer> spills_;    // regions past the block's end, by offset
  int64_t furthest_ = 0;                // the furthest end a region took
};

std::shared_ptr<Staging> staging_of(Communicator& comm) {
  static std::mutex creating;  // two lanes may issue through one communicator (lanes.h)
  std::lock_guard<std::mutex> lock(creating);
  std::shared_ptr<void>& slot = comm.wire_staging();
  if (!slot) slot = std::make_shared<Staging>();
  return std::static_pointer_cast<Staging>(slot);
}

// The 16-bit codes of n values times `multiplier`.
void encode16(const float* x, int64_t n, uint16_t* codes, NumberFormat f, float multiplier) {
  const Overflow o = overflow_of(f);
  for (int64_t i = 0; i < n; i++) codes[i] = encode_float(f, x[i] * multiplier, o);
}

void decode16(const uint16_t* codes, int64_t n, float* out, NumberFormat f, float scale) {
  const float inverse = 1.0f / scale;  // exact: a power of two
  for (int64_t i = 0; i < n; i++) out[i] = decode_code(f, codes[i]) * inverse;
}

Tensor view_of(uint16_t* codes, int64_t n, NumberFormat f) { return make_view(codes, {n}, code_dtype(f)); }

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
  const std::shared_ptr<Staging> staging = staging_of(comm);
  const int64_t n = buf.numel();
  uint16_t* codes = staging->take16(n);
  encode16(buf.f32(), n, codes, w.format, premultiplier(comm, op, w));
  CommHandle inner = comm.all_reduce_async(view_of(codes, n, w.format), on_codes(op));
  return then(inner, [staging, codes, n, buf, w] {
    decode16(codes, n, buf.f32(), w.format, w.scale);
    staging->give_back(codes);
  });
}

void wire_all_reduce(Communicator& comm, Tensor buf, ReduceOp op, const Wire& w) {
  if (w.fp32 || comm.size() == 1) return comm.all_reduce(buf, op);
  wire_all_reduce_async(comm, buf, op, w).wait();
}

namespace {

// A collective that sends one buffer and receives another, through staged codes: send encoded (times
// `multiplier`), `call` started on the two codes' views, recv decoded when it ends.
template <class Call>
CommHandle through_codes(Communicator& comm, Tensor send, Tensor recv, const Wire& w, float multiplier, Call call) {
  check_wire(w);
  const std::shared_ptr<Staging> staging = staging_of(comm);
  const int64_t sent_n = send.numel(), received_n = recv.numel();
  uint16_t* sent = staging->take16(sent_n);
  uint16_t* received = staging->take16(received_n);
  encode16(send.f32(), sent_n, sent, w.format, multiplier);
  CommHandle inner = call(view_of(sent, sent_n, w.format), view_of(received, received_n, w.format));
  return then(inner, [staging, sent, received, received_n, recv, w] {
    decode16(received, received_n, recv.f32(), w.format, w.scale);
    staging->give_back(sent);
    staging->give_back(received);
  });
}

}  // namespace

CommHandle wire_reduce_scatter_async(Communicator& comm, Tensor send, Tensor recv, ReduceOp op, const Wire& w) {
  if (w.fp32 || comm.size() == 1) return comm.reduce_scatter_async(send, recv, op);
  return through_codes(comm, send, recv, w, premultiplier(comm, op, w),
                       [&](Tensor sent, Tensor received) { return comm.reduce_scatter_async(sent, received, on_codes(op)); });
}

CommHandle wire_all_to_all_v_async(Communicator& comm, Tensor send, const std::vector<int64_t>& send_counts, Tensor recv,
                                   const std::vector<int64_t>& recv_counts, const Wire& w) {
  if (w.fp32 || comm.size() == 1) return comm.all_to_all_v_async(send, send_counts, recv, recv_counts);
  return through_codes(comm, send, recv, w, w.scale, [&](Tensor sent, Tensor received) {
    return comm.all_to_all_v_async(sent, send_counts, received, recv_counts);
  });
}

void wire_all_to_all_v(Communicator& comm, Tensor send, const std::vector<int64_t>& send_counts, Tensor recv,
                       const std::vector<int64_t>& recv_counts, const Wire& w) {
  if (w.fp32 || comm.size() == 1) return comm.all_to_all_v(send, send_counts, recv, recv_counts);
  wire_all_to_all_v_async(comm, send, send_counts, recv, recv_counts, w).wait();
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
                                          const std::vector<WireSegment>& segments, bool keep_own) {
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
  const std::shared_ptr<Staging> staging = staging_of(comm);
  unsigned char* sent = staging->take(counts[size_t(me)]);
  unsigned char* received = staging->take(total);
  const float* x = send.f32();
  unsigned char* out = sent;
  for_each_run(segments, me * n, n, [&](int64_t begin, int64_t count, const Wire& w) {
    for (int64_t i = 0; i < count; i++) out += put(w, x[begin - me * n + i], out);
  });
  const Tensor send_bytes = make_view(sent, {counts[size_t(me)]}, DType::U8);
  const Tensor recv_bytes = make_view(received, {total}, DType::U8);
  CommHandle inner = comm.all_gather_v_async(send_bytes, recv_bytes, counts);
  return then(inner, [staging, sent, received, recv, segments, n, N, me, keep_own, counts] {
    const unsigned char* in = received;
    float* y = recv.f32();
    for (int r = 0; r < N; r++) {
      if (keep_own && r == me) {
        in += counts[size_t(r)];
        continue;
      }
      for_each_run(segments, r * n, n, [&](int64_t begin, int64_t count, const Wire& w) {
        for (int64_t i = 0; i < count; i++) in += get(w, in, &y[begin + i]);
      });
    }
    staging->give_back(sent);
    staging->give_back(received);
  });
}

const CollectiveFormats& collective_formats(const Communicator& comm) { return comm.formats(); }
void set_collective_formats(Communicator& comm, const CollectiveFormats& formats) { comm.formats() = formats; }

CommHandle wire_send_recv_async(Communicator& comm, const std::vector<Communicator::PointToPoint>& ops,
                                const std::vector<Wire>& wires) {
  ENSURE(ops.size() == wires.size(), "wire_send_recv_async: one wire per message");
  bool plain = true;
  for (const Wire& w : wires) plain = plain && w.fp32;
  if (plain) return comm.send_recv_async(ops);
  const std::shared_ptr<Staging> staging = staging_of(comm);
  std::vector<Communicator::PointToPoint> coded = ops;
  struct Arrival {
    uint16_t* codes;
    Tensor into;
    Wire wire;
  };
  std::vector<uint16_t*> regions;
  std::vector<Arrival> arrivals;
  for (size_t i = 0; i < ops.size(); i++) {
    const Wire& w = wires[i];
    if (w.fp32) continue;
    check_wire(w);
    const int64_t n = ops[i].buf.numel();
    uint16_t* codes = staging->take16(n);
    regions.push_back(codes);
    if (ops[i].send) {
      encode16(ops[i].buf.f32(), n, codes, w.format, w.scale);
    } else {
      arrivals.push_back({codes, ops[i].buf, w});
    }
    coded[i].buf = view_of(codes, n, w.format);
  }
  CommHandle inner = comm.send_recv_async(coded);
  return then(inner, [staging, regions, arrivals] {
    for (const Arrival& a : arrivals) decode16(a.codes, a.into.numel(), a.into.f32(), a.wire.format, a.wire.scale);
    for (uint16_t* r : regions) staging->give_back(r);
  });
}

CommHandle wire_send_async(Communicator& comm, Tensor buf, int peer, int tag, const Wire& w) {
  if (w.fp32) return comm.send_async(buf, peer, tag);
  return wire_send_recv_async(comm, {{true, buf, peer, tag}}, {w});
}

CommHandle wire_recv_async(Communicator& comm, Tensor buf, int peer, int tag, const Wire& w) {
  if (w.fp32) return comm.recv_async(buf, peer, tag);
  return wire_send_recv_async(comm, {{false, buf, peer, tag}}, {w});
}

int64_t wire_staging_bytes(Communicator& comm) { return comm.wire_staging() ? staging_of(comm)->bytes() : 0; }

