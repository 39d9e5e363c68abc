// The row-exact K/V exchange of a shard plan under one mask: which local rows every CP rank sends
// to which other rank, in what order they arrive, and where each of a rank's key rows lies among
// its own and its received rows. The CUDA executor (backends/cuda cp_executor.h) runs it; its row
// counts are the planner's (ExchangedKvRows in cp_prediction.hpp), which tests check.
//
//   absl::StatusOr<wlb::ShardMaps> maps = wlb::BuildShardMaps(plan, mask);
//   wlb::RowExchange x = wlb::BuildRowExchange(*maps, plan.rank_capacity);
//   // rank r, forward:  send   = kv_local[x.ranks[r].send_rows]   (grouped by destination)
//   //                   recv   = all_to_all_v(send, send_counts, recv_counts)
//   //                   buffer = concat(kv_local[0 : tokens], recv)
//   //                   kv_keys = buffer[x.ranks[r].key_rows]     (maps' cu_seqlens_k layout)
//   //          backward: d_buffer = rows of d_kv_keys summed per buffer row
//   //                   back   = all_to_all_v(d_buffer[tokens :], recv_counts, send_counts)
//   //                   d_kv_local = d_buffer[0 : tokens] + back summed into rows send_rows
//
// Order: rank r's received rows are grouped by source rank (ascending) and, within a source, by
// the source's local row (ascending), as an all-to-all-v concatenates them; a rank's send_rows
// are grouped by destination the same way, so rank s's block for rank d is exactly rank d's block
// from rank s. A rank never sends to itself. A local row needed by several ranks is sent to each.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "wlb/shard/shard_maps.hpp"

namespace wlb {

// One rank's part of the row-exact exchange.
struct RankRowExchange {
  int64_t tokens = 0;                // own rows, the head of the rank's buffer
  std::vector<int32_t> send_rows;    // local rows sent, grouped by destination (file comment)
  std::vector<int64_t> send_counts;  // per destination rank: rows sent (0 to itself)
  std::vector<int64_t> recv_counts;  // per source rank: rows received (0 from itself)
  // rank key row -> buffer row: [0, tokens) its own rows, [tokens, buffer_rows()) the received
  // ones in arrival order. Same length and order as RankMaps::key_rows.
  std::vector<int32_t> key_rows;

  int64_t received() const {
    return std::reduce(recv_counts.begin(), recv_counts.end(), int64_t{0});
  }
  int64_t sent() const { return static_cast<int64_t>(send_rows.size()); }
  int64_t buffer_rows() const { return tokens + received(); }
};

// Every rank's part.
struct RowExchange {
  std::vector<RankRowExchange> ranks;  // ranks[r] for maps.ranks[r]

  // Whether any rank sends a row (else an executor issues no collective at all).
  bool moves() const {
    return std::any_of(ranks.begin(), ranks.end(),
                       [](const RankRowExchange& r) { return !r.send_rows.empty(); });
  }
};

// The row-exact exchange of `maps` (BuildShardMaps of a plan whose buffers hold rank_capacity
// rows). The maps' key rows index gathered rows owner * rank_capacity + local row, so every
// index below stays within the maps' int32 bounds.
inline RowExchange BuildRowExchange(const ShardMaps& maps, int64_t rank_capacity) {
  const size_t cp = maps.ranks.size();
  RowExchange x;
  x.ranks.resize(cp);
  for (size_t r = 0; r < cp; ++r) {
    x.ranks[r].tokens = static_cast<int64_t>(maps.ranks[r].local_to_packed.size());
    x.ranks[r].send_counts.assign(cp, 0);
    x.ranks[r].recv_counts.assign(cp, 0);
  }
  // Destinations in ascending order, so every sender's rows come out grouped by destination.
  for (size_t d = 0; d < cp; ++d) {
    RankRowExchange& dst = x.ranks[d];
    std::vector<int32_t> needed = maps.ranks[d].key_rows;
    std::sort(needed.begin(), needed.end());
    needed.erase(std::unique(needed.begin(), needed.end()), needed.end());
    // Gathered rows are owner-major, so `needed` is grouped by source and ascending within one.
    std::vector<int32_t> buffer_row(needed.size());
    int64_t next = dst.tokens;
    for (size_t i = 0; i < needed.size(); ++i) {
      const size_t owner = static_cast<size_t>(needed[i] / rank_capacity);
      const int32_t local = static_cast<int32_t>(needed[i] % rank_capacity);
      if (owner == d) {
        buffer_row[i] = local;
        continue;
      }
      buffer_row[i] = static_cast<int32_t>(next++);
      ++dst.recv_counts[owner];
      ++x.ranks[owner].send_counts[d];
      x.ranks[owner].send_rows.push_back(local);
    }
    dst.key_rows.reserve(maps.ranks[d].key_rows.size());
    for (const int32_t g : maps.ranks[d].key_rows) {
      const auto at = std::lower_bound(needed.begin(), needed.end(), g);
      dst.key_rows.push_back(buffer_row[static_cast<size_t>(at - needed.begin())]);
    }
  }
  return x;
}

}  // namespace wlb
