// Checkpoint-state helpers of the packers: documents as compact JSON arrays, checked integer
// fields, a checksum of state blobs, and the guard that turns a malformed state into an error.
//
//   nlohmann::json j = wlb::detail::DocumentsState(held);  // save
//   absl::Status s = wlb::detail::LoadStateOrError([&]() -> absl::Status {
//     held = wlb::detail::DocumentsFromState(j);           // throws on a malformed state
//     return absl::OkStatus();
//   });                                                    // the throw comes back as an error
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "wlb/core/document.hpp"
#include "wlb/core/step_plan.hpp"

namespace wlb {

namespace detail {
// 64-bit FNV-1a: a cheap checksum that catches corrupted state blobs (not a security measure).
inline uint64_t Fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// A document as a compact JSON array [id, length, piece, offset, arrival_step] (state blobs).
inline nlohmann::json DocumentState(const Document& d) {
  return nlohmann::json::array({d.id, d.length, d.piece, d.offset, d.arrival_step});
}
// An integer field of a state blob in [lo, hi]; anything else (a float, a string, out of range)
// throws, so no value is ever narrowed or rounded silently.
inline int64_t StateInteger(const nlohmann::json& v, int64_t lo, int64_t hi, const char* what) {
  const bool fits =
      v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX});
  if (!fits || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    throw nlohmann::json::out_of_range::create(
        401, absl::StrFormat("%s must be an integer in [%d, %d]", what, lo, hi), &v);
  }
  return v.get<int64_t>();
}
inline Document DocumentFromState(const nlohmann::json& j) {
  if (!j.is_array() || j.size() != 5) {
    throw nlohmann::json::type_error::create(302, "document entry is not a 5-element array", &j);
  }
  // Ranges that keep every sum below 2^63; the packer checks length <= S and the rest against
  // its configuration and counters after loading (Packer::ValidateState).
  return Document{.id = StateInteger(j[0], 0, kMaxStateCounter, "document id"),
                  .length = StateInteger(j[1], 1, kMaxContext, "document length"),
                  .piece = static_cast<int32_t>(StateInteger(j[2], 0, kMaxPieces, "piece")),
                  .offset = StateInteger(j[3], 0, kMaxStreamTokens, "offset"),
                  .arrival_step = StateInteger(j[4], 0, kMaxStateCounter, "arrival step")};
}
template <typename Documents>  // a vector or deque of Document
nlohmann::json DocumentsState(const Documents& docs) {
  nlohmann::json a = nlohmann::json::array();
  for (const Document& d : docs) a.push_back(DocumentState(d));
  return a;
}
// Adds `docs` to a held-back count.
template <typename Documents>
void AddHeld(const Documents& docs, HeldBack& held) {
  held.documents += static_cast<int64_t>(docs.size());
  for (const Document& d : docs) held.tokens += d.length;
}
inline std::vector<Document> DocumentsFromState(const nlohmann::json& j) {
  if (!j.is_array()) {
    throw nlohmann::json::type_error::create(302, "document list is not an array", &j);
  }
  std::vector<Document> docs;
  for (const nlohmann::json& e : j) docs.push_back(DocumentFromState(e));
  return docs;
}
// Runs a state loader `load` (returning absl::Status) and returns what it throws reading a
// malformed state (nlohmann::json::exception: a missing field, a wrong type, a value out of
// range, as the readers above throw) as an error with the exception's text, so no exception
// leaves a state loader.
template <typename Load>
absl::Status LoadStateOrError(Load&& load) {
  try {
    return load();
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(e.what());
  }
}
// True when `text` nests JSON arrays/objects deeper than `max_depth` (brackets inside strings do
// not count). Comparing or dumping a deeper value would recurse once per level.
inline bool JsonNestedDeeperThan(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}
}  // namespace detail

}  // namespace wlb
