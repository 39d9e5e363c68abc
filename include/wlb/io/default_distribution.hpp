// The embedded default document-length distribution, generated shapes, and a portable seeded
// sampler.
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
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
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

// Generated shapes the repository's data does not have, for benches and tests that must hold on
// streams they were not tuned on (bench/model_error_table). Each is a histogram sampled as
// SampleLengths samples (portable). They are synthetic, chosen to stress outlier handling at
// S = 128K, not measured from any corpus:
//   rare-long     a sea of short documents (64..4K) with 1 in 1,000 at 96K..128K: a lone very
//                 long document rarely has a partner of its length within a step or two
//   bimodal       98% short (256..2K), 2% at 24K..56K: about N = 4 outliers above S/4 a step
//                 (many more makes wlb's queues grow without bound at the default thresholds)
//   pile-like     a log-spread web/books mix: most documents under 8K, 1.5% from 32K up to 512K
//                 (longer than S: pieces of at most S), which carry about 40% of the tokens
//   prolong-like  a long-context training mix: 3% of the documents at 64K..512K (books, code
//                 repositories, cut into pieces of S) carry about 60% of the tokens
inline constexpr LengthBin kRareLongHistogram[] = {{64, 4096, 999}, {98304, 131072, 1}};
inline constexpr LengthBin kBimodalHistogram[] = {{256, 2048, 98}, {24576, 57344, 2}};
inline constexpr LengthBin kPileLikeHistogram[] = {{16, 512, 400},      {513, 2048, 350},
                                                   {2049, 8192, 180},   {8193, 32768, 55},
                                                   {32769, 131072, 12}, {131073, 524288, 3}};
inline constexpr LengthBin kProlongLikeHistogram[] = {{32, 1024, 450},      {1025, 8192, 450},
                                                      {8193, 65536, 70},    {65537, 131072, 10},
                                                      {131073, 262144, 10}, {262145, 524288, 10}};

// The distributions a stream can be sampled from, by name (wlb-plan --distribution).
struct NamedDistribution {
  std::string_view name;
  std::span<const LengthBin> bins;  // empty: the heavy-tail variant of the default
};
inline constexpr NamedDistribution kDistributions[] = {
    {"default", kDefaultLengthHistogram}, {"heavy-tail", {}},
    {"rare-long", kRareLongHistogram},    {"bimodal", kBimodalHistogram},
    {"pile-like", kPileLikeHistogram},    {"prolong-like", kProlongLikeHistogram}};

// "default, heavy-tail, ...": the names of kDistributions, for messages and help.
inline std::string DistributionNames() {
  std::string names;
  for (const NamedDistribution& d : kDistributions) {
    if (!names.empty()) names += ", ";
    names += d.name;
  }
  return names;
}

// Samples the distribution named `name` until `min_total_tokens`; nullopt for an unknown name.
inline std::optional<std::vector<int64_t>> SampleNamedLengths(std::string_view name,
                                                              int64_t min_total_tokens,
                                                              uint64_t seed) {
  for (const NamedDistribution& d : kDistributions) {
    if (d.name != name) continue;
    if (d.bins.empty()) return SampleHeavyTailLengths(min_total_tokens, seed);
    return SampleLengths(d.bins, min_total_tokens, seed);
  }
  return std::nullopt;
}

}  // namespace wlb
