// Shared checks for the packer tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "wlb/wlb.hpp"

namespace wlb::testing {

// Iterations of a slow property test: `full`, times WLB_PROPERTY_SCALE when it is set to a number
// in (0, 1], at least 1. scripts/test.sh runs the release build at full counts and the sanitizer
// build (where these tests run 5-20x slower) at a quarter: the same seeded inputs, a prefix of them.
// A malformed scale fails the test that asks, naming the value, instead of silently running all.
inline int PropertyIterations(int full) {
  const char* text = std::getenv("WLB_PROPERTY_SCALE");
  if (text == nullptr || *text == '\0') return full;
  char* end = nullptr;
  const double scale = std::strtod(text, &end);
  if (*end != '\0' || !(scale > 0.0 && scale <= 1.0)) {
    ADD_FAILURE() << "WLB_PROPERTY_SCALE=\"" << text << "\" is not a number in (0, 1]";
    return full;
  }
  return std::max(1, static_cast<int>(std::ceil(full * scale)));
}

// Every token of every input document appears exactly once in `pieces`: per document id, the
// (offset, length) ranges tile [0, length) without gap or overlap.
inline ::testing::AssertionResult CoversExactlyOnce(const std::vector<int64_t>& lengths,
                                                    const std::vector<Document>& pieces) {
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> ranges;
  for (const Document& d : pieces) {
    if (d.id < 0 || d.id >= static_cast<int64_t>(lengths.size())) {
      return ::testing::AssertionFailure() << "unknown document id " << d.id;
    }
    if (d.length <= 0) return ::testing::AssertionFailure() << "empty piece of " << d.id;
    ranges[d.id].push_back({d.offset, d.length});
  }
  for (size_t id = 0; id < lengths.size(); ++id) {
    auto& r = ranges[static_cast<int64_t>(id)];
    std::sort(r.begin(), r.end());
    int64_t next = 0;
    for (const auto& [offset, length] : r) {
      if (offset != next) {
        return ::testing::AssertionFailure()
               << "document " << id << ": expected a piece at offset " << next << ", got "
               << offset << (offset < next ? " (duplicate tokens)" : " (lost tokens)");
      }
      next += length;
    }
    if (next != lengths[id]) {
      return ::testing::AssertionFailure()
             << "document " << id << ": pieces hold " << next << " of " << lengths[id]
             << " tokens";
    }
  }
  return ::testing::AssertionSuccess();
}

// All documents of all steps, then `pending`.
inline std::vector<Document> Collect(const std::vector<StepPlan>& steps,
                                     const std::vector<Document>& pending = {}) {
  std::vector<Document> all;
  for (const StepPlan& s : steps) {
    for (const MicroBatch& mb : s.micro_batches) {
      all.insert(all.end(), mb.documents.begin(), mb.documents.end());
    }
  }
  all.insert(all.end(), pending.begin(), pending.end());
  return all;
}

// Random lengths of one of several shapes: tiny, uniform, heavy-tailed, all-huge, mixed.
inline std::vector<int64_t> RandomLengths(std::mt19937_64& rng, int64_t context, int shape,
                                          int count) {
  std::vector<int64_t> lengths;
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int i = 0; i < count; ++i) {
    switch (shape % 5) {
      case 0: lengths.push_back(uniform(1, 4)); break;
      case 1: lengths.push_back(uniform(1, context)); break;
      case 2: lengths.push_back(uniform(0, 9) == 0 ? uniform(context / 2 + 1, 3 * context)
                                                    : uniform(1, context / 8 + 1)); break;
      case 3: lengths.push_back(uniform(std::max<int64_t>(1, context - 1), 2 * context + 1)); break;
      default: lengths.push_back(uniform(1, 2) == 1 ? 1 : uniform(1, 4 * context)); break;
    }
  }
  return lengths;
}

// A random stream to pack: its config, lengths and arrivals per step.
struct PackingCase {
  PackerConfig config;
  std::vector<int64_t> lengths;
  std::vector<std::vector<Document>> arrivals;
};
struct PackingCaseBounds {
  int64_t min_context = 16;
  int64_t max_context = 512;
  int32_t max_micro_batches = 6;
  int max_docs = 80;
};

// S uniform in [min_context, max_context], S_max = S + S/4, N uniform in [1, max_micro_batches],
// then a count uniform in [1, max_docs] of RandomLengths of `shape`, cut into steps of N x S
// tokens (MakeDocuments, SplitIntoSteps). The draws come in this order, so a seed gives the tests
// that share this helper the streams they had.
inline PackingCase RandomPackingCase(std::mt19937_64& rng, int shape,
                                     const PackingCaseBounds& bounds) {
  PackingCase c;
  c.config.context =
      std::uniform_int_distribution<int64_t>(bounds.min_context, bounds.max_context)(rng);
  c.config.max_tokens = DefaultMaxTokens(c.config.context);
  c.config.micro_batches = std::uniform_int_distribution<int32_t>(1, bounds.max_micro_batches)(rng);
  const int count = std::uniform_int_distribution<int>(1, bounds.max_docs)(rng);
  c.lengths = RandomLengths(rng, c.config.context, shape, count);
  c.arrivals = *SplitIntoSteps(*MakeDocuments(c.lengths, c.config.context),
                               c.config.context * c.config.micro_batches);
  return c;
}

// A micro-batch of whole documents with ids 0, 1, ... and the given lengths (cost 0).
inline MicroBatch MakeMicroBatch(const std::vector<int64_t>& lengths) {
  MicroBatch mb;
  for (size_t i = 0; i < lengths.size(); ++i) {
    mb.documents.push_back(Document{.id = static_cast<int64_t>(i), .length = lengths[i]});
    mb.tokens += lengths[i];
  }
  return mb;
}

}  // namespace wlb::testing
