// Original packing: what a packing-unaware data loader does.
//
// Documents are concatenated in arrival order and cut into N sequences of exactly S tokens; a
// document crossing a sequence boundary is cut into parts. Parts are numbered in the order they
// are emitted (`piece` = 0, 1, ... per document, `offset` = first token), so (id, piece) stays
// unique. The tail of the stream that does not fill a whole step waits for the next Push().
//
// The other reading of "original packing" (WholeDocuments::kYes, name "original-nextfit"): whole
// documents in arrival order, next-fit into N sequences of at most S tokens (a document that does
// not fit in the rest of a sequence starts the next one), so no document is cut and sequences are
// partly empty. A step is cut once the buffer holds N x S tokens.
#pragma once

#include <algorithm>
#include <vector>

#include "wlb/pack/packer.hpp"

namespace wlb {

class OriginalPacker final : public Packer {
 public:
  enum class WholeDocuments { kNo, kYes };
  OriginalPacker(PackerConfig config, DocumentCost cost, WholeDocuments whole = WholeDocuments::kNo)
      : Packer(config, std::move(cost)), whole_(whole == WholeDocuments::kYes) {}
  std::string_view name() const override { return whole_ ? "original-nextfit" : "original"; }

  std::vector<Document> Pending() const override {
    return {buffer_.begin() + static_cast<std::ptrdiff_t>(head_), buffer_.end()};
  }
  HeldBack Held() const override {
    return {static_cast<int64_t>(buffer_.size() - head_), buffer_tokens_};
  }

  nlohmann::json StateJson() const override {
    return {{"buffer", detail::DocumentsState(Pending())},
            {"last_id", last_id_},
            {"next_piece", next_piece_}};
  }

 protected:
  absl::Status LoadStateJson(const nlohmann::json& j) override {
    return detail::LoadStateOrError([&]() -> absl::Status {
      std::vector<Document> buffer = detail::DocumentsFromState(j.at("buffer"));
      const int64_t last_id =
          detail::StateInteger(j.at("last_id"), -1, kMaxStateCounter, "last_id");
      const auto next_piece = static_cast<int32_t>(
          detail::StateInteger(j.at("next_piece"), 0, kMaxPieces, "next_piece"));
      buffer_tokens_ = TotalTokens(buffer);
      buffer_ = std::move(buffer);
      head_ = 0;
      last_id_ = last_id;
      next_piece_ = next_piece;
      return absl::OkStatus();
    });
  }

  // Push() cuts steps while the buffer holds a whole step, so a saved buffer holds less. The part
  // numbering (last_id, next_piece) is the state of NextPieceIndex(): nothing emitted (last_id -1,
  // next_piece 0) exactly while no step was planned, and after the first part next_piece >= 1;
  // next-fit never numbers parts, so it stays at (-1, 0).
  absl::Status ValidateState(int64_t pushes, int64_t next_step) const override {
    if (absl::Status s = CheckHeldPieces(pushes); !s.ok()) return s;
    if (buffer_tokens_ >= config_.context * config_.micro_batches) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "buffer holds %d tokens, but a buffer of S x N = %d or more is always cut into steps",
          buffer_tokens_, config_.context * config_.micro_batches));
    }
    if (whole_) {  // next-fit keeps documents whole and numbers no parts
      if (last_id_ != -1 || next_piece_ != 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "last_id %d with next_piece %d: original-nextfit never cuts or numbers parts (-1, 0)",
            last_id_, next_piece_));
      }
      return absl::OkStatus();
    }
    if ((last_id_ < 0) != (next_piece_ == 0)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "last_id %d with next_piece %d: a part was emitted exactly when last_id >= 0, and then "
          "next_piece >= 1",
          last_id_, next_piece_));
    }
    if ((last_id_ < 0) != (next_step == 0)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "next_step %d with last_id %d: every planned step emits a part, and no part is emitted "
          "outside a step",
          next_step, last_id_));
    }
    return absl::OkStatus();
  }

  std::vector<StepPlan> DoPush(std::vector<Document> arrivals) override {
    buffer_.insert(buffer_.end(), arrivals.begin(), arrivals.end());
    buffer_tokens_ += TotalTokens(arrivals);
    std::vector<StepPlan> steps;
    const int64_t step_tokens = config_.context * config_.micro_batches;
    while (buffer_tokens_ >= step_tokens) steps.push_back(CutStep());
    DropEmitted();
    return steps;
  }

  std::vector<StepPlan> DoFlush() override {
    std::vector<StepPlan> steps;
    while (head_ < buffer_.size()) steps.push_back(CutStep());
    DropEmitted();
    return steps;
  }

 private:
  // Fills N sequences of S tokens from the front of the buffer (fewer at the end of input); the
  // emitted documents stay in buffer_ before head_ until DropEmitted(), so cutting k steps from a
  // buffer of n documents costs O(n), not O(k x n).
  StepPlan CutStep() {
    std::vector<MicroBatch> sequences(config_.micro_batches);
    size_t next = head_;
    for (MicroBatch& seq : sequences) {
      while (seq.tokens < config_.context && next < buffer_.size()) {
        Document& d = buffer_[next];
        if (whole_) {
          if (d.length > config_.context - seq.tokens) break;  // starts the next sequence
          Add(seq, d);
          ++next;
          continue;
        }
        const int64_t room = config_.context - seq.tokens;
        Document part = d;
        if (d.length > room) {  // cut: the rest stays at the front of the buffer
          part.length = room;
          d.length -= room;
          d.offset += room;
        } else {
          ++next;
        }
        part.piece = NextPieceIndex(part.id);
        Add(seq, part);
      }
    }
    for (const MicroBatch& seq : sequences) buffer_tokens_ -= seq.tokens;
    head_ = next;
    return MakeStep(std::move(sequences));
  }

  void DropEmitted() {
    buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(head_));
    head_ = 0;
  }

  int32_t NextPieceIndex(int64_t id) {
    if (id != last_id_) {
      last_id_ = id;
      next_piece_ = 0;
    }
    return next_piece_++;
  }

  bool whole_ = false;            // next-fit whole documents instead of cutting
  std::vector<Document> buffer_;  // from head_: not yet emitted, stream order (the front may be a
                                  // cut tail)
  size_t head_ = 0;               // buffer_[0, head_) is emitted (dropped after each call)
  int64_t buffer_tokens_ = 0;     // tokens of buffer_[head_, end)
  int64_t last_id_ = -1;          // document of the last emitted part, for piece numbering
  int32_t next_piece_ = 0;
};

}  // namespace wlb
