// The embedded default document-length distribution and a portable seeded sampler.
//
//   std::vector<int64_t> lengths = wlb::SampleDefaultLengths(/*min_total_tokens=*/1 << 24,
//                                                            /*seed=*/1);
//
// The histogram is derived from doc_lengths_wlbllm_like.json of hao-ai-lab/DistCA (commit
// 039f2e40, Apache-2.0), a reconstruction of the WLB-LLM paper's 128K-context distribution:
// ~97% of documents spread over 1..6,250 tokens and a sparse tail up to 131,072 tokens. Regenerate
// with tools/gen_default_distribution.py. Sampling uses std::mt19937_64 (whose output sequence the
// C++ standard fixes) with integer arithmetic only, so a seed gives the same lengths everywhere.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace wlb {

// One histogram bin: lengths first..last (inclusive) occur `count` times in the source.
struct LengthBin {
  int64_t first;
  int64_t last;
  int64_t count;
};

// The embedded default distribution (see the file comment for its source).
inline constexpr LengthBin kDefaultLengthHistogram[] = {
#include "wlb/io/default_histogram.inc"
};

namespace detail {
// Uniform integer in [0, bound) from a 64-bit generator, by rejection (no modulo bias, portable).
inline uint64_t UniformBelow(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do {
    x = rng();
  } while (x >= limit);
  return x % bound;
}
}  // namespace detail

namespace detail {
// Draws lengths from `bins` (a bin by count, then uniform inside it) with a shared generator.
class BinSampler {
 public:
  explicit BinSampler(std::span<const LengthBin> bins) : bins_(bins) {
    for (const LengthBin& b : bins) cumulative_.push_back(total_ += b.count);
  }
  bool empty() const { return total_ <= 0; }
  int64_t Draw(std::mt19937_64& rng) const {
    const int64_t pick = static_cast<int64_t>(UniformBelow(rng, total_));
    const size_t bin =
        std::upper_bound(cumulative_.begin(), cumulative_.end(), pick) - cumulative_.begin();
    const LengthBin& b = bins_[bin];
    return b.first + static_cast<int64_t>(UniformBelow(rng, b.last - b.first + 1));
  }

 private:
  std::span<const LengthBin> bins_;
  std::vector<int64_t> cumulative_;
  int64_t total_ = 0;
};
}  // namespace detail

// Samples document lengths from `bins` (bin by count, then uniform inside the bin) until their sum
// reaches `min_total_tokens`. The same bins, total and seed give the same lengths on every
// platform.
inline std::vector<int64_t> SampleLengths(std::span<const LengthBin> bins, int64_t min_total_tokens,
                                          uint64_t seed) {
  const detail::BinSampler sampler(bins);
  std::vector<int64_t> lengths;
  if (sampler.empty()) return lengths;
  std::mt19937_64 rng(seed);
  for (int64_t total = 0; total < min_total_tokens;) {
    lengths.push_back(sampler.Draw(rng));
    total += lengths.back();
  }
  return lengths;
}

// SampleLengths over the embedded default histogram.
inline std::vector<int64_t> SampleDefaultLengths(int64_t min_total_tokens, uint64_t seed) {
  return SampleLengths(kDefaultLengthHistogram, min_total_tokens, seed);
}

// A heavier-tailed variant of the default distribution, for stress tests of outlier handling:
// each document is, with probability 1/100, uniform in [65536, 131072] (S/2..S at S = 128K) and
// otherwise drawn from the embedded histogram. About 1.5% of its documents are >= 64K tokens (the
// default: 0.5%), and they carry about 45% of the tokens. Portable like SampleLengths().
inline std::vector<int64_t> SampleHeavyTailLengths(int64_t min_total_tokens, uint64_t seed) {
  const detail::BinSampler sampler(kDefaultLengthHistogram);
  std::vector<int64_t> lengths;
  std::mt19937_64 rng(seed);
  for (int64_t total = 0; total < min_total_tokens;) {
    const bool tail = detail::UniformBelow(rng, 100) == 0;
    lengths.push_back(tail ? 65536 + static_cast<int64_t>(detail::UniformBelow(rng, 65537))
                           : sampler.Draw(rng));
    total += lengths.back();
  }
  return lengths;
}

}  // namespace wlb
