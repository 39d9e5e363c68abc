// The index map between cuDNN's token-major softmax statistics (total_q, heads) and wlb's
// head-major LSE (heads, total_q); plain code shared by the device conversion kernels and the
// host conversion (cudnn_layout.h), so both move the same element to the same place.
//
//   wlb::cuda::LsePair p = wlb::cuda::LseLayoutPair(i, heads, total_q);  // stats[p.stats] <->
//   lse[p.lse]
#ifndef WLB_CUDA_LSE_LAYOUT_H_
#define WLB_CUDA_LSE_LAYOUT_H_

#include <cstdint>

#include "wlb/cuda/attention_tiles.h"  // WLB_CUDA_HOST_DEVICE

namespace wlb::cuda {

struct LsePair {
  int64_t stats;  // index into the (total_q, heads) statistics
  int64_t lse;    // index into the (heads, total_q) LSE
};

// Element i (0 <= i < heads * total_q) of the statistics, in statistics order.
WLB_CUDA_HOST_DEVICE inline LsePair LseLayoutPair(int64_t i, int heads, int64_t total_q) {
  const int64_t token = i / heads;
  const int64_t head = i - token * heads;
  return {i, head * total_q + token};
}

}  // namespace wlb::cuda

#endif  // WLB_CUDA_LSE_LAYOUT_H_
