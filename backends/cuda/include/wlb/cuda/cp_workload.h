// Micro-batches of the WLB-LLM-like document mix, for the CP tests, benchmark and example.
//
//   wlb::MicroBatch mb = wlb::cuda::WlbLikeMicroBatch(/*tokens=*/131072, /*seed=*/1);
#ifndef WLB_CUDA_CP_WORKLOAD_H_
#define WLB_CUDA_CP_WORKLOAD_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "wlb/core/document.hpp"
#include "wlb/io/default_distribution.hpp"

namespace wlb::cuda {

// Documents drawn from the embedded WLB-LLM-like length distribution in order until they hold
// `tokens` tokens; the last one is cut to fit. Same seed, same micro-batch.
inline MicroBatch WlbLikeMicroBatch(int64_t tokens, uint64_t seed) {
  MicroBatch mb;
  for (int64_t length : SampleDefaultLengths(tokens, seed)) {
    const int64_t take = std::min(length, tokens - mb.tokens);
    if (take <= 0) break;
    mb.documents.push_back(
        Document{.id = static_cast<int64_t>(mb.documents.size()), .length = take});
    mb.tokens += take;
  }
  return mb;
}

}  // namespace wlb::cuda

#endif  // WLB_CUDA_CP_WORKLOAD_H_
