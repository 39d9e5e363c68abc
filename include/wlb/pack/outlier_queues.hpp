// Multi-level outlier queues (the paper's Algorithm 1), the one component every packer that
// queues outliers uses: wlb and wlb-refine, wlb-lookahead's holding, and the wlb rule that
// wlb-lookahead follows alongside to measure its delay (lookahead/delay_account.hpp).
//
//   wlb::OutlierQueues<wlb::Document> queues({32768, 65536}, 131072);
//   std::vector<wlb::Document> fresh;
//   for (const wlb::Document& d : arrivals) {
//     if (!queues.Enqueue(d)) fresh.push_back(d);       // not an outlier
//   }
//   std::vector<wlb::Document> released;
//   queues.ReleaseFull(n, released);                   // wlb's rule: N oldest of each full level
//
// Thresholds L_1 < ... < L_n define n levels: an entry with L_i <= length < L_{i+1} (L_{n+1} =
// S + 1) waits in level i, in arrival order. An entry is a Document, or ArrivedTokens where only
// the arrival step and the length matter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "wlb/core/document.hpp"
#include "wlb/core/limits.hpp"
#include "wlb/core/step_plan.hpp"
#include "wlb/pack/packer.hpp"

namespace wlb {

// Checks outlier thresholds: at most kMaxOutlierQueues, strictly increasing, each in [1, S].
inline absl::Status ValidateThresholds(const std::vector<int64_t>& thresholds, int64_t context) {
  if (thresholds.size() > static_cast<size_t>(kMaxOutlierQueues)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d outlier thresholds, at most %d are allowed", thresholds.size(), kMaxOutlierQueues));
  }
  for (size_t i = 0; i < thresholds.size(); ++i) {
    if (thresholds[i] < 1 || thresholds[i] > context) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "outlier threshold %d is outside [1, %d] (the context window)", thresholds[i], context));
    }
    if (i > 0 && thresholds[i] <= thresholds[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("outlier thresholds must be strictly increasing, got %s",
                          absl::StrJoin(thresholds, ",")));
    }
  }
  return absl::OkStatus();
}

// Tokens that arrived with one step, without their documents: a queued outlier's length, or
// carried-over tokens (wlb-lookahead's delay account follows wlb's queues with these).
struct ArrivedTokens {
  int64_t arrival_step = 0;
  int64_t length = 0;
};

namespace detail {

// An ArrivedTokens entry of a state blob: a pair [arrival step, length] with the length in
// [lo, hi]; `owner` names the state that holds it in errors, `what` its length.
inline ArrivedTokens ArrivedTokensFromState(const nlohmann::json& e, int64_t lo, int64_t hi,
                                            const std::string& owner, const std::string& what) {
  if (!e.is_array() || e.size() != 2) {
    throw nlohmann::json::type_error::create(302, owner + " entry is not a pair", &e);
  }
  return {
      .arrival_step = StateInteger(e[0], 0, kMaxStateCounter, (owner + " arrival step").c_str()),
      .length = StateInteger(e[1], lo, hi, what.c_str())};
}
// A list of them.
inline std::vector<ArrivedTokens> ArrivedTokensListFromState(const nlohmann::json& j, int64_t lo,
                                                             int64_t hi, const std::string& owner,
                                                             const std::string& what) {
  if (!j.is_array()) {
    throw nlohmann::json::type_error::create(302, owner + " entries are not an array", &j);
  }
  std::vector<ArrivedTokens> entries;
  for (const nlohmann::json& e : j)
    entries.push_back(ArrivedTokensFromState(e, lo, hi, owner, what));
  return entries;
}
inline nlohmann::json ArrivedTokensState(const std::vector<ArrivedTokens>& entries) {
  nlohmann::json a = nlohmann::json::array();
  for (const ArrivedTokens& e : entries)
    a.push_back(nlohmann::json::array({e.arrival_step, e.length}));
  return a;
}

// How errors name a queued entry: by document (and piece), or by length.
inline std::string QueuedName(const Document& d) { return absl::StrFormat("document %d", d.id); }
inline std::string QueuedName(const ArrivedTokens& e) {
  return absl::StrFormat("length %d", e.length);
}
inline std::string QueuedPieceName(const Document& d) {
  return absl::StrFormat("document %d piece %d", d.id, d.piece);
}
inline std::string QueuedPieceName(const ArrivedTokens&) { return "an outlier"; }

}  // namespace detail

template <typename Entry>  // Document or ArrivedTokens
class OutlierQueues {
 public:
  OutlierQueues() = default;
  // `thresholds` must pass ValidateThresholds for the context window `context` (S).
  OutlierQueues(std::vector<int64_t> thresholds, int64_t context)
      : thresholds_(std::move(thresholds)), context_(context), queues_(thresholds_.size()) {}

  const std::vector<int64_t>& thresholds() const { return thresholds_; }
  size_t levels() const { return queues_.size(); }
  // The level of an entry of `length` tokens: the last i with L_i <= length; -1: not an outlier.
  int Level(int64_t length) const {
    int level = -1;
    for (size_t i = 0; i < thresholds_.size() && length >= thresholds_[i]; ++i) {
      level = static_cast<int>(i);
    }
    return level;
  }
  // The lengths level `level` holds: [L_level, L_{level+1} - 1], the last level up to S.
  int64_t MinLength(size_t level) const { return thresholds_[level]; }
  int64_t MaxLength(size_t level) const {
    return level + 1 < thresholds_.size() ? thresholds_[level + 1] - 1 : context_;
  }

  // The entries of one level, oldest first.
  const std::vector<Entry>& queue(size_t level) const { return queues_[level]; }
  // Entries and tokens queued, over all levels.
  HeldBack held() const { return held_; }
  bool empty() const { return held_.documents == 0; }

  // Queues `e` at its level; false (nothing queued) when it is not an outlier.
  bool Enqueue(const Entry& e) {
    const int level = Level(e.length);
    if (level < 0) return false;
    queues_[level].push_back(e);
    held_ = held_ + HeldBack{1, e.length};
    return true;
  }

  // wlb's rule: every level holding at least `n` entries releases its `n` oldest, appended to
  // `out` level by level.
  void ReleaseFull(size_t n, std::vector<Entry>& out) {
    for (std::vector<Entry>& q : queues_) {
      if (q.size() < n) continue;
      const auto end = q.begin() + static_cast<std::ptrdiff_t>(n);
      for (auto it = q.begin(); it != end; ++it) held_ = held_ - HeldBack{1, it->length};
      out.insert(out.end(), q.begin(), end);
      q.erase(q.begin(), end);
    }
  }
  // Releases every entry, level by level, appended to `out`.
  void ReleaseAll(std::vector<Entry>& out) {
    for (std::vector<Entry>& q : queues_) {
      out.insert(out.end(), q.begin(), q.end());
      q.clear();
    }
    held_ = {};
  }
  // Releases the oldest queued entry (the earliest arrival step at the front of a level; the
  // lowest such level on ties), appended to `out`; false when nothing is queued.
  bool ReleaseOldest(std::vector<Entry>& out) {
    std::vector<Entry>* oldest = nullptr;
    for (std::vector<Entry>& q : queues_) {
      if (!q.empty() &&
          (oldest == nullptr || q.front().arrival_step < oldest->front().arrival_step)) {
        oldest = &q;
      }
    }
    if (oldest == nullptr) return false;
    held_ = held_ - HeldBack{1, oldest->front().length};
    out.push_back(oldest->front());
    oldest->erase(oldest->begin());
    return true;
  }
  // Releases the entries at `positions` (increasing) of level `level`, appended to `out`; the
  // others keep their order.
  void Release(size_t level, std::span<const size_t> positions, std::vector<Entry>& out) {
    if (positions.empty()) return;
    std::vector<Entry>& q = queues_[level];
    size_t next = 0, kept = 0;  // the kept entries move forward in place (kept <= i)
    for (size_t i = 0; i < q.size(); ++i) {
      const bool released = next < positions.size() && positions[next] == i;
      next += released;
      if (released) {
        held_ = held_ - HeldBack{1, q[i].length};
        out.push_back(q[i]);
      } else {
        q[kept++] = q[i];
      }
    }
    q.resize(kept);
  }

  // Every queued entry, level by level, oldest first, appended to `out`.
  void AppendTo(std::vector<Entry>& out) const {
    for (const std::vector<Entry>& q : queues_) out.insert(out.end(), q.begin(), q.end());
  }

  // The state: one array per level.
  nlohmann::json StateJson() const {
    nlohmann::json levels = nlohmann::json::array();
    for (const std::vector<Entry>& q : queues_) {
      if constexpr (std::is_same_v<Entry, Document>) {
        levels.push_back(detail::DocumentsState(q));
      } else {
        levels.push_back(detail::ArrivedTokensState(q));
      }
    }
    return levels;
  }
  // Loads a StateJson() of queues with these thresholds, all or nothing; a malformed one is an
  // error naming what is wrong (the text of the nlohmann::json::exception the readers throw).
  // `owner` names the state in errors ("" for a packer's own queues). Documents are checked
  // against their levels by Validate(); ArrivedTokens, which carry no identity, as they are read.
  absl::Status LoadStateJson(const nlohmann::json& j, const std::string& owner = "") {
    return detail::LoadStateOrError([&]() -> absl::Status {
      if (!j.is_array() || j.size() != queues_.size()) {
        throw nlohmann::json::out_of_range::create(
            401, (owner.empty() ? "" : owner + ": ") + "queue count does not match thresholds", &j);
      }
      std::vector<std::vector<Entry>> queues;
      HeldBack held;
      for (size_t l = 0; l < queues_.size(); ++l) {
        if constexpr (std::is_same_v<Entry, Document>) {
          queues.push_back(detail::DocumentsFromState(j[l]));
        } else {
          queues.push_back(detail::ArrivedTokensListFromState(j[l], MinLength(l), MaxLength(l),
                                                              owner, owner + " queued length"));
        }
        for (const Entry& e : queues.back()) held = held + HeldBack{1, e.length};
      }
      queues_ = std::move(queues);
      held_ = held;
      return absl::OkStatus();
    });
  }

  // Checks loaded queues: each entry at the level of its length, each level first in, first out,
  // and every entry arrived before step `arrived_before`. `owner` prefixes errors.
  absl::Status Validate(int64_t arrived_before, const std::string& owner = "") const {
    const std::string prefix = owner.empty() ? "" : owner + ": ";
    for (size_t l = 0; l < queues_.size(); ++l) {
      const std::vector<Entry>& q = queues_[l];
      for (size_t k = 0; k < q.size(); ++k) {
        const Entry& e = q[k];
        if (Level(e.length) != static_cast<int>(l)) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "%squeued: %s of length %d is outside [%d, %d] (it is in outlier queue %d, not its "
              "queue %d)",
              prefix, detail::QueuedPieceName(e), e.length, MinLength(l), MaxLength(l), l,
              Level(e.length)));
        }
        if (k > 0 && e.arrival_step < q[k - 1].arrival_step) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "%soutlier queue %d: %s (arrival step %d) is queued after %s (arrival step %d), but "
              "queues are first in, first out",
              prefix, l, detail::QueuedName(q[k - 1]), q[k - 1].arrival_step, detail::QueuedName(e),
              e.arrival_step));
        }
        if (e.arrival_step >= arrived_before) {
          return absl::InvalidArgumentError(
              absl::StrFormat("%squeued %s arrived at step %d, not before step %d", prefix,
                              detail::QueuedName(e), e.arrival_step, arrived_before));
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  std::vector<int64_t> thresholds_;
  int64_t context_ = 0;
  std::vector<std::vector<Entry>> queues_;  // per level, oldest first
  HeldBack held_;                           // entries and tokens in queues_
};

}  // namespace wlb
