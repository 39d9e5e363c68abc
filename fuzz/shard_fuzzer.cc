// Fuzzes CP shard planning: the input picks a CP size, a strategy, a link, a layer mix, whether the
// key copy is priced, the memory cap, and the micro-batch's document lengths. Every strategy must
// plan every such micro-batch: a complete plan (ValidateShardPlan: every token once, keys the
// piece's prefix, consistent cu_seqlens), the same plan twice, a finite prediction, and for the
// strategies that cap memory (uses.memory_cap: adaptive, doc-degree, balanced-chunks, contiguous)
// no rank above CpRankTokenCap at that cap; the plan as a placement (PredictCpOfPlacement) holds
// the same pairs per rank.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "fuzz_check.hpp"
#include "wlb/wlb.hpp"

namespace {

// Reads the input front to back; past its end every read is 0.
struct Bytes {
  const uint8_t* data;
  size_t size;
  size_t at = 0;
  uint32_t Next(int bytes) {
    uint32_t v = 0;
    for (int i = 0; i < bytes; ++i) v = v << 8 | (at < size ? data[at++] : 0);
    return v;
  }
  bool done() const { return at >= size; }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in{data, size};
  // CP size 1..64, or with the first byte's top two bits set 128, 256 or 512 (the large-C paths:
  // rows summed from sorted ends, per-rank rows of cut documents only) over smaller micro-batches.
  // Planning grows with C^2 where the memory cap is a few tokens (every chunk spilled over many
  // ranks): one 64K-token document at C = 2048 plans in 0.3 s, 30x that under the fuzzer's
  // sanitizers, past its 10 s timeout; at C = 512, 25 ms.
  const uint32_t c_byte = in.Next(1);
  const int cp = c_byte >= 0xc0 ? 128 << (c_byte % 3) : 1 + static_cast<int>(c_byte % 64);
  const size_t max_docs = cp > 64 ? 64 : 4096;
  const int64_t max_tokens = cp > 64 ? int64_t{1} << 16 : int64_t{1} << 21;
  constexpr auto all = wlb::ShardStrategy::All();
  const wlb::ShardStrategy strategy = all[in.Next(1) % all.size()];
  const double links[] = {450.0, 25.0, 1e-3, 1e6};
  const uint32_t knobs = in.Next(1);
  wlb::CpPlanOptions options{.comm = {.link_gbps = links[knobs % 4]}};
  if (knobs & 4) options.comm.gather_gbps = 3350.0;
  const int64_t window = 1 + in.Next(2);
  if (knobs & 8) options.mix = *wlb::LayerMix::Parse(absl::StrFormat("window:%dx3,causal", window));
  if (knobs & 16) options.mix = *wlb::LayerMix::Parse(absl::StrFormat("chunk:%dx2,causal", window));
  static const wlb::KernelModel analytic = wlb::KernelModel::DefaultAnalytic();
  const wlb::KernelModel& model = knobs & 32 ? wlb::KernelModel::Default() : analytic;
  // The memory cap: the default, the tightest, a loose one, or none.
  const int64_t caps[] = {wlb::kDefaultCpMemoryCapPercent, 100, 150, wlb::kMaxCpMemoryCapPercent};
  options.memory_cap_percent = caps[knobs >> 6];
  // Lengths: 2 bytes each (1..65535 tokens; 0xffff means 2^20), at most max_tokens in all.
  wlb::MicroBatch mb;
  while (!in.done() && mb.documents.size() < max_docs) {
    int64_t length = 1 + in.Next(2);
    if (length == 1 + 0xffff) length = int64_t{1} << 20;
    if (mb.tokens + length > max_tokens) break;
    mb.documents.push_back(
        wlb::Document{.id = static_cast<int64_t>(mb.documents.size()), .length = length});
    mb.tokens += length;
  }
  absl::StatusOr<wlb::ShardPlan> plan = wlb::PlanShards(mb, cp, strategy, model, options);
  if (!plan.ok()) std::fprintf(stderr, "%s\n", plan.status().ToString().c_str());
  WLB_FUZZ_CHECK(plan.ok());
  WLB_FUZZ_CHECK(wlb::ValidateShardPlan(*plan, mb).ok());
  absl::StatusOr<wlb::ShardPlan> again = wlb::PlanShards(mb, cp, strategy, model, options);
  WLB_FUZZ_CHECK(again.ok() && *again == *plan);
  const wlb::CpPrediction p = wlb::PredictCp(*plan, model, options);
  WLB_FUZZ_CHECK(std::isfinite(p.max_ms) && p.max_ms >= 0.0);
  // The plan as a placement (a rank per packed token, PredictCpOfPlacement) holds the same
  // (query, key) pairs per rank: only adjacent segments of a document may merge.
  std::vector<int64_t> owner(static_cast<size_t>(mb.tokens), -1);
  for (const wlb::RankShard& r : plan->ranks) {
    for (const wlb::Segment& s : r.segments) {
      std::fill(owner.begin() + s.q_pos, owner.begin() + s.q_pos + s.q_len(), r.rank);
    }
  }
  const absl::StatusOr<wlb::CpPrediction> placed =
      wlb::PredictCpOfPlacement(mb, cp, owner, model, options);
  WLB_FUZZ_CHECK(placed.ok() && placed->rank_pairs == p.rank_pairs &&
                 std::isfinite(placed->max_ms) && placed->max_ms >= 0.0);
  if (wlb::ShardStrategyRow(strategy).uses.memory_cap) {
    WLB_FUZZ_CHECK(plan->rank_capacity <=
                   wlb::CpRankTokenCap(mb.tokens, cp, options.memory_cap_percent));
  }
  return 0;
}
