#include "wlb/cuda/cudnn_layout.h"

#include <algorithm>
#include <bit>
#include <limits>

#include "absl/strings/str_format.h"

namespace wlb::cuda {

std::string CudnnShapeClass::ToString() const {
  return absl::StrFormat("b%d sq%d sk%d tq%d tk%d h%d hk%d d%d %s scale=%a", batch, max_seqlen_q,
                         max_seqlen_k, total_q, total_k, num_heads, num_kv_heads, head_dim,
                         !causal           ? "full"
                         : causal_top_left ? "causal-top-left"
                                           : "causal",
                         softmax_scale);
}

int64_t CudnnBucket(int64_t n, int64_t floor) {
  const uint64_t x = static_cast<uint64_t>(std::max<int64_t>({n, floor, 1}));
  return static_cast<int64_t>(std::bit_ceil(x));
}

int64_t CudnnTokenBucket(int64_t n) {
  const uint64_t x = static_cast<uint64_t>(std::max<int64_t>(n, 1));
  const uint64_t step = std::max<uint64_t>(std::bit_floor(x) / 8, 1);
  return static_cast<int64_t>((x + step - 1) / step * step);
}

namespace {

// One slot of a ragged layout: a segment's rows in the problem's packed tensors.
struct CudnnSegmentPart {
  int32_t segment = 0;  // the problem's segment
  // Rows of the problem's packed tensors: queries [q_begin, q_begin + q_len) (and their O and
  // statistics rows), keys and values [k_begin, k_begin + k_len).
  int32_t q_begin = 0;
  int32_t q_len = 0;
  int32_t k_begin = 0;
  int32_t k_len = 0;
};

// The class of `batch` slots of at most max_q queries and max_k keys over the rows of `p`.
CudnnShapeClass ClassOfSlots(const AttentionProblem& p, int64_t batch, int64_t max_q, int64_t max_k,
                             bool causal, bool top_left) {
  CudnnShapeClass c;
  if (batch > 0) {
    c.batch = CudnnBucket(batch);
    c.max_seqlen_q = CudnnBucket(max_q, kCudnnMinSeqBucket);
    c.max_seqlen_k = CudnnBucket(max_k, kCudnnMinSeqBucket);
  }
  c.total_q = CudnnTokenBucket(p.total_q());
  c.total_k = CudnnTokenBucket(p.total_k());
  c.num_heads = p.num_heads;
  c.num_kv_heads = p.num_kv_heads;
  c.head_dim = p.head_dim;
  c.causal = causal;
  c.causal_top_left = causal && top_left;
  c.softmax_scale = p.softmax_scale;
  return c;
}

}  // namespace

CudnnShapeClass CudnnShapeClassOf(const AttentionProblem& p) {
  int64_t batch = 0, max_q = 0, max_k = 0;
  bool square = true;
  for (int b = 0; b < p.batch(); ++b) {
    if (p.seqlen_q(b) == 0) continue;  // no query, no work: dropped from the cuDNN batch
    ++batch;
    square = square && p.seqlen_q(b) == p.seqlen_k(b);
    max_q = std::max<int64_t>(max_q, p.seqlen_q(b));
    max_k = std::max<int64_t>(max_k, p.seqlen_k(b));
  }
  return ClassOfSlots(p, batch, max_q, max_k, p.causal, square);
}

namespace {

// rows * row_elements as an int32 element offset, or OutOfRange naming the tensor.
absl::StatusOr<int32_t> ElementOffset(int64_t rows, int64_t row_elements, const char* tensor) {
  const int64_t max = std::numeric_limits<int32_t>::max();
  if (row_elements > 0 && rows > max / row_elements) {
    return absl::OutOfRangeError(absl::StrFormat(
        "%s offset %d rows x %d elements exceeds cuDNN's int32 ragged offsets (max %d)", tensor,
        rows, row_elements, max));
  }
  return static_cast<int32_t>(rows * row_elements);
}

absl::Status CheckFits(int64_t need, int64_t have, const char* what) {
  if (need > have) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the problem needs %s = %d but the shape class has %d", what, need, have));
  }
  return absl::OkStatus();
}

// The layout of `slots` (rows of the problem's packed tensors) padded to `batch` slots with
// zero-length slots at the end of the tensors. OutOfRange when an end offset exceeds int32.
absl::StatusOr<CudnnRaggedLayout> LayoutOfSlots(const AttentionProblem& p,
                                                absl::Span<const CudnnSegmentPart> slots,
                                                int64_t batch) {
  const int64_t q_row = int64_t{p.num_heads} * p.head_dim;
  const int64_t kv_row = int64_t{p.num_kv_heads} * p.head_dim;
  // The end offsets bound every other offset, so checking them checks all.
  auto q_end = ElementOffset(p.total_q(), q_row, "q/out");
  if (!q_end.ok()) return q_end.status();
  auto kv_end = ElementOffset(p.total_k(), kv_row, "k/v");
  if (!kv_end.ok()) return kv_end.status();
  auto stats_end = ElementOffset(p.total_q(), p.num_heads, "stats");
  if (!stats_end.ok()) return stats_end.status();
  CudnnRaggedLayout l;
  for (const CudnnSegmentPart& slot : slots) {
    l.segments.push_back(slot.segment);
    l.seq_len_q.push_back(slot.q_len);
    l.seq_len_k.push_back(slot.k_len);
    // Rows inside the problem's tensors, below the checked end offsets: no overflow.
    l.q_offsets.push_back(static_cast<int32_t>(slot.q_begin * q_row));
    l.kv_offsets.push_back(static_cast<int32_t>(slot.k_begin * kv_row));
    l.stats_offsets.push_back(static_cast<int32_t>(int64_t{slot.q_begin} * p.num_heads));
  }
  // Padding slots: zero lengths, starting at the end of the packed tensors.
  while (static_cast<int64_t>(l.seq_len_q.size()) < batch) {
    l.seq_len_q.push_back(0);
    l.seq_len_k.push_back(0);
    l.q_offsets.push_back(*q_end);
    l.kv_offsets.push_back(*kv_end);
    l.stats_offsets.push_back(*stats_end);
  }
  l.q_offsets.push_back(*q_end);
  l.kv_offsets.push_back(*kv_end);
  l.stats_offsets.push_back(*stats_end);
  return l;
}

// OK when `shape` is at least `need` in batch and maximum lengths and holds the problem's
// packed totals; InvalidArgument naming the dimension otherwise.
absl::Status CheckClassFits(const AttentionProblem& p, const CudnnShapeClass& need,
                            const CudnnShapeClass& shape) {
  if (auto s = CheckFits(need.batch, shape.batch, "batch"); !s.ok()) return s;
  if (auto s = CheckFits(need.max_seqlen_q, shape.max_seqlen_q, "max_seqlen_q"); !s.ok()) return s;
  if (auto s = CheckFits(need.max_seqlen_k, shape.max_seqlen_k, "max_seqlen_k"); !s.ok()) return s;
  if (auto s = CheckFits(p.total_q(), shape.total_q, "total_q"); !s.ok()) return s;
  return CheckFits(p.total_k(), shape.total_k, "total_k");
}

}  // namespace

absl::StatusOr<CudnnRaggedLayout> BuildCudnnRaggedLayout(const AttentionProblem& p,
                                                         const CudnnShapeClass& shape) {
  if (shape.num_heads != p.num_heads || shape.num_kv_heads != p.num_kv_heads ||
      shape.head_dim != p.head_dim || shape.causal != p.causal ||
      shape.softmax_scale != p.softmax_scale) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shape class %s does not match the problem's heads %d, kv_heads %d, head_dim %d, %s, "
        "scale %a",
        shape.ToString(), p.num_heads, p.num_kv_heads, p.head_dim, p.causal ? "causal" : "full",
        p.softmax_scale));
  }
  const CudnnShapeClass need = CudnnShapeClassOf(p);
  if (shape.causal_top_left && !need.causal_top_left) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shape class %s uses the top-left causal mask, but the problem has a segment with more "
        "keys than queries (it needs the bottom-right mask)",
        shape.ToString()));
  }
  if (absl::Status s = CheckClassFits(p, need, shape); !s.ok()) return s;
  std::vector<CudnnSegmentPart> slots;
  bool unvisited = false;
  for (int b = 0; b < p.batch(); ++b) {
    if (p.seqlen_q(b) == 0) {
      unvisited = unvisited || p.seqlen_k(b) > 0;
      continue;
    }
    slots.push_back({.segment = b,
                     .q_begin = p.cu_seqlens_q[b],
                     .q_len = p.seqlen_q(b),
                     .k_begin = p.cu_seqlens_k[b],
                     .k_len = p.seqlen_k(b)});
  }
  auto l = LayoutOfSlots(p, slots, shape.batch);
  if (!l.ok()) return l.status();
  l->has_unvisited_keys = unvisited;
  return l;
}

namespace {

absl::Status CheckLseSizes(size_t from, size_t to, int heads, int64_t total_q) {
  if (heads <= 0 || total_q < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "heads = %d, total_q = %d; need heads > 0 and total_q >= 0", heads, total_q));
  }
  const uint64_t n = uint64_t(heads) * uint64_t(total_q);
  if (from != n || to != n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "LSE conversion of %d heads x %d tokens needs %d elements on both sides; got %d and %d",
        heads, total_q, n, from, to));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CudnnStatsToLse(absl::Span<const float> stats, int heads, int64_t total_q,
                             absl::Span<float> lse) {
  if (auto s = CheckLseSizes(stats.size(), lse.size(), heads, total_q); !s.ok()) return s;
  for (int64_t i = 0; i < static_cast<int64_t>(stats.size()); ++i) {
    const LsePair pair = LseLayoutPair(i, heads, total_q);
    lse[pair.lse] = stats[pair.stats];
  }
  return absl::OkStatus();
}

absl::Status LseToCudnnStats(absl::Span<const float> lse, int heads, int64_t total_q,
                             absl::Span<float> stats) {
  if (auto s = CheckLseSizes(lse.size(), stats.size(), heads, total_q); !s.ok()) return s;
  for (int64_t i = 0; i < static_cast<int64_t>(stats.size()); ++i) {
    const LsePair pair = LseLayoutPair(i, heads, total_q);
    stats[pair.stats] = lse[pair.lse];
  }
  return absl::OkStatus();
}

}  // namespace wlb::cuda
