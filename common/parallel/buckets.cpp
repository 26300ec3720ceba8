// buckets.cpp: see buckets.h.
#include "parallel/buckets.h"

#include <cstdio>

#include "base/check.h"

GradientBuckets::GradientBuckets(const ParamLayout& layout, double bucket_bytes, size_t element_bytes,
                                 BucketCut cut, bool experts_apart)
    : layout_(&layout) {
  const int n = int(layout.params.size());
  bucket_of_.assign(n, -1);
  int first_held = 0;  // parameters of other pipeline stages (size 0) belong to no bucket
  while (first_held < n && !layout.params[first_held].held()) first_held++;
  int64_t end = layout.padded_size;
  double filled = 0;
  for (int p = n - 1; p >= first_held; p--) {  // backward order: last parameter first
    const ParamInfo& info = layout.params[p];
    if (!info.held()) continue;
    bucket_of_[p] = count();
    filled += double(element_bytes) * double(info.size);
    // A unit's first parameter starts where the unit does (param_layout.h).
    const bool may_cut = cut == BucketCut::AtTensors || info.offset == layout.unit_begin[info.unit];
    // Under a pipeline, the tied wte's bucket is wte alone (param_layout.h, tied_wte_end).
    const bool after_wte = layout.tied_wte_end > 0 && info.offset == layout.tied_wte_end;
    // The next held parameter (backward order) is of the other kind: expert or not.
    int next = p - 1;
    while (next >= first_held && !layout.params[size_t(next)].held()) next--;
    const bool kind_changes =
        experts_apart && next >= first_held && (layout.params[size_t(next)].expert >= 0) != (info.expert >= 0);
    if ((filled >= bucket_bytes && may_cut) || after_wte || kind_changes || p == first_held) {
      const int64_t begin = p == first_held ? 0 : layout.params[p].offset;
      begin_.push_back(begin);
      end_.push_back(end);
      experts_.push_back(info.expert >= 0);
      end = begin;
      filled = 0;
    }
  }
  params_in_.assign(count(), 0);
  for (int b : bucket_of_)
    if (b >= 0) params_in_[b]++;
  reset();
}

int GradientBuckets::mark_ready(int param) {
  const int b = bucket_of_[param];
  ENSURE(b >= 0, "mark_ready: a parameter this pipeline stage does not hold");
  ENSURE(pending_[b] > 0, "a gradient was marked ready twice in one backward");
  return --pending_[b] == 0 ? b : -1;
}

void GradientBuckets::reset() { pending_ = params_in_; }

std::vector<FlatRange> GradientBuckets::ranges_in_flat_order() const {
  std::vector<FlatRange> ranges;
  for (int b = count() - 1; b >= 0; b--) ranges.push_back(range(b));
  return ranges;
}

double default_bucket_bytes(const ParamLayout& layout, size_t element_bytes) {
  return double(layout.padded_size) * double(element_bytes) / 8;
}

std::string GradientBuckets::describe(double bucket_bytes) const {
  char text[96];
  std::snprintf(text, sizeof(text), "%d buckets of about %.3g MB, in the order backward fills them:", count(),
                bucket_bytes / 1e6);
  std::string out = text;
  for (int b = 0; b < count(); b++) {
    std::snprintf(text, sizeof(text), " [%lld, %lld)", (long long)begin(b), (long long)end(b));
    out += text;
  }
  return out;
}

std::vector<int64_t> GradientBuckets::expert_sizes() const {
  std::vector<int64_t> sizes;
  for (int b = 0; b < count(); b++)
    if (holds_experts(b)) sizes.push_back(size(b));
  return sizes;
}

std::vector<int64_t> GradientBuckets::sizes(bool without_experts) const {
  std::vector<int64_t> sizes;
  for (int b = 0; b < count(); b++)
    if (!(without_experts && holds_experts(b))) sizes.push_back(size(b));
  return sizes;
}
