// weight_gather.cpp: ZeRO-3's gather in the recipe's formats (weight_gather.h).
#include "parallel/weight_gather.h"

#include <algorithm>
#include <cmath>

#include "ops/quantize.h"  // power_of_two_scale: the products' per-tensor scale

bool is_product_weight(const ParamInfo& p) {
  return p.ndim == 2 && p.name != "wte" && p.name != "wpe" && p.expert < 0;
}

std::vector<WireSegment> weight_segments(const ParamLayout& layout, int u, const CollectiveFormats& formats,
                                         Tensor piece, Communicator& group) {
  const FlatRange unit{layout.unit_begin[size_t(u)], layout.unit_begin[size_t(u) + 1]};
  return weight_segments(layout, unit, formats, piece, group);
}

std::vector<WireSegment> weight_segments(const ParamLayout& layout, FlatRange range, const CollectiveFormats& formats,
                                         Tensor piece, Communicator& group) {
  std::vector<WireSegment> segments;
  if (formats.weights.fp32) return segments;
  const int64_t piece_begin = range.begin + group.rank() * piece.numel(), piece_end = piece_begin + piece.numel();
  for (const ParamInfo& p : layout.params) {
    if (p.offset < range.begin || p.offset + p.size > range.end || !p.held() || !is_product_weight(p)) continue;
    WireSegment s{p.offset - range.begin, p.size, formats.weights};
    if (formats.weight_scale_per_tensor) {
      float amax = 0;
      const int64_t begin = std::max(p.offset, piece_begin), end = std::min(p.offset + p.size, piece_end);
      for (int64_t i = begin; i < end; i++) amax = std::max(amax, std::fabs(piece.f32()[i - piece_begin]));
      amax = float(group.all_reduce_scalar(amax, ReduceOp::Max));  // a scalar: not the gather's bytes
      s.wire.scale = power_of_two_scale(s.wire.format, amax);
    }
    segments.push_back(s);
  }
  std::sort(segments.begin(), segments.end(),  // in flat order, as the gather walks them
            [](const WireSegment& a, const WireSegment& b) { return a.begin < b.begin; });
  return segments;
}

CommHandle gather_unit_async(Communicator& group, const ParamLayout& layout, int u, Tensor piece, Tensor full) {
  const CollectiveFormats& formats = collective_formats(group);
  if (formats.weights.fp32 || group.size() == 1) return group.all_gather_async(piece, full);
  return wire_all_gather_segments_async(group, piece, full, weight_segments(layout, u, formats, piece, group));
}

CommHandle gather_updated_async(Communicator& group, const ParamLayout& layout, FlatRange range, Tensor piece,
                                Tensor params) {
  const Tensor full = params.slice1d(range.begin, range.size());
  const CollectiveFormats& formats = collective_formats(group);
  if (formats.weights.fp32 || group.size() == 1) return group.all_gather_async(piece, full);
  return wire_all_gather_segments_async(group, piece, full, weight_segments(layout, range, formats, piece, group),
                                        /*keep_own=*/true);
}
