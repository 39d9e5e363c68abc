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

// Samples document lengths from `bins` (bin by count, then uniform inside the bin) until their sum
// reaches `min_total_tokens`. The same bins, total and seed give the same lengths on every platform.
inline std::vector<int64_t> SampleLengths(std::span<const LengthBin> bins, int64_t min_total_tokens,
                                          uint64_t seed) {
  std::vector<int64_t> cumulative;
  int64_t running = 0;
  for (const LengthBin& b : bins) cumulative.push_back(running += b.count);
  std::vector<int64_t> lengths;
  if (running <= 0) return lengths;
  std::mt19937_64 rng(seed);
  for (int64_t total = 0; total < min_total_tokens;) {
    const int64_t pick = static_cast<int64_t>(detail::UniformBelow(rng, running));
    const size_t bin = std::upper_bound(cumulative.begin(), cumulative.end(), pick) -
                       cumulative.begin();
    const LengthBin& b = bins[bin];
    const int64_t length =
        b.first + static_cast<int64_t>(detail::UniformBelow(rng, b.last - b.first + 1));
    lengths.push_back(length);
    total += length;
  }
  return lengths;
}

// SampleLengths over the embedded default histogram.
inline std::vector<int64_t> SampleDefaultLengths(int64_t min_total_tokens, uint64_t seed) {
  return SampleLengths(kDefaultLengthHistogram, min_total_tokens, seed);
}

}  // namespace wlb
