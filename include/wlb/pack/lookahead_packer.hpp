// Look-ahead selection ("wlb-lookahead"): wlb-refine that sees the next K steps' arrivals (data
// loaders prefetch) and uses them to choose which documents each step holds.
//
//   auto packer = wlb::MakePacker("wlb-lookahead", config, cost,
//                                 {.thresholds = {32768, 65536}, .lookahead = 1});
//   for (auto& arrivals : steps) {
//     auto ready = packer->Push(std::move(arrivals));  // empty for the first K pushes, then the
//   }                                                  // plan of the step pushed K calls earlier
//   auto rest = packer->Flush();                       // the K buffered steps, then leftovers
//
// How a caller gives the packer K steps ahead: Push() the arrivals of step t + K before it needs
// the plan of step t; Push() returns the plan of step t once the arrivals of t + 1 .. t + K are
// buffered, so a loader prefetching K steps calls Push(t + K) and trains on what it returns. The
// buffered arrivals are part of the saved state. No document is trained before the step it arrived
// with (the look-ahead only informs decisions), so token delay (planned step - arrival step) is
// counted exactly as for wlb and is never negative.
//
// Each step starts from what wlb would do (the same queues, thresholds and carry-over), and
// compares it with a few alternatives (lookahead/candidates.hpp): hold back one queue level's
// release when two levels release into one step (that step would be cap-full with outliers no
// placement can balance; up to two steps), release a queue level's oldest outliers early when the
// step has room for them, or hold back the one or two longest new arrivals; from N = 16 also
// release more outliers than micro-batches, alike or shortest first, so they pair up
// (AddEvenReleases), and never keep an outlier queued more than kMaxOutlierWait steps. Each
// candidate's step is sketched (long documents placed as wlb places them, short ones as a fluid)
// and followed through the look-ahead steps, where each step takes wlb's release or, when wlb
// releases a level, every queued outlier, whichever balances better (a step that must take a long
// outlier is best filled with the other long ones, so holding outliers for it pays off). The
// candidate with the lowest summed imbalance wins (lookahead/scoring.hpp) and is packed as
// wlb-refine packs a step. A delay account (lookahead/delay_account.hpp) follows wlb's rule on the
// same stream alongside and, while the packer's token delay exceeds 0.9 of wlb's, prices each
// token trained later than wlb's rule would. The winner is
// then checked by its real packing (PlanChosen): its step may be at most kStepTolerance more
// unbalanced than the step wlb's rule packs from the same holding, under every cost of the
// attention range (robust to the cost's error, as refinement is), and bounded (bound_delay, the
// default) it must keep the packer's token delay within a lower bound of wlb-refine's on the same
// stream; the step is planned under the best
// candidate by score that passes both, or else the one that passes the first and comes closest to
// the second (PackerOptions::bound_delay says how often none does). K = 0 considers no
// alternative and equals wlb-refine exactly; so does N = 1 (one micro-batch is always balanced, so
// an alternative could only add delay).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "wlb/core/document.hpp"
#include "wlb/core/step_plan.hpp"
#include "wlb/cost/document_cost.hpp"
#include "wlb/metrics/imbalance.hpp"
#include "wlb/pack/length_order.hpp"
#include "wlb/pack/lookahead/candidates.hpp"
#include "wlb/pack/lookahead/delay_account.hpp"
#include "wlb/pack/lookahead/scoring.hpp"
#include "wlb/pack/outlier_queues.hpp"
#include "wlb/pack/packer.hpp"

namespace wlb {

// How much more unbalanced than wlb's rule's step (imbalance degree, at either end of the
// attention range) a candidate's step may be (LookaheadPacker::PlanChosen). Measured with
// bench/model_error_table (7 stream shapes x 3 seeds x 5 truths, 750 steps): 0 blocks the
// candidates that trade a slightly worse step now for a better next one and left worst steps
// 0.02-0.035 above wlb's on the WLB-LLM-like data; 0.01 and 0.03 both left every worst step within
// 0.006 of wlb's (docs/results/packing/lookahead_worst_step.md).
inline constexpr double kStepTolerance = 0.01;
// PlanChosen does not pack a candidate (after the best-scoring one) whose sketched step is more
// than this above the sketch of wlb's rule's step: at N = 64 the step check refused most
// candidates, and packing each one it refused doubled planning time.
inline constexpr double kSketchSkip = 0.05;

class LookaheadPacker final : public Packer {
 public:
  // `thresholds` must pass ValidateThresholds; refine_rounds >= 1; lookahead >= 0; delay_budget
  // >= 0 mean steps of token delay, infinity for none beyond wlb's (MakePacker checks all four).
  LookaheadPacker(PackerConfig config, DocumentCost cost, std::vector<int64_t> thresholds,
                  int refine_rounds, int lookahead,
                  double delay_budget = std::numeric_limits<double>::infinity(),
                  bool bound_delay = true, AttentionRange attention_range = {})
      : Packer(config, std::move(cost)),
        refine_rounds_(refine_rounds),
        lookahead_(lookahead),
        bound_delay_(bound_delay),
        attention_range_(attention_range),
        held_{.queues = OutlierQueues<Document>(thresholds, config.context), .carry = {}},
        delay_(config, std::move(thresholds), delay_budget),
        sketcher_(config_, cost_) {}
  // The sketcher refers to this packer's configuration and cost.
  LookaheadPacker(const LookaheadPacker&) = delete;
  LookaheadPacker& operator=(const LookaheadPacker&) = delete;

  std::string_view name() const override { return "wlb-lookahead"; }
  int lookahead() const { return lookahead_; }

  // The check of the last step planned with candidates to choose from (PlanChosen): the
  // imbalance at the attention range's ends of the chosen candidate's step and of wlb's rule's
  // from the same holding, both unrefined (the rule's is 1, its least, when the chosen step was
  // within kStepTolerance of 1 and the rule's was not packed). For tests and logs; `checked` is
  // false until then.
  struct StepCheck {
    bool checked = false;
    bool rule_chosen = false;  // the step was planned under wlb's rule
    std::array<double, 2> chosen{1.0, 1.0};
    std::array<double, 2> rule{1.0, 1.0};
  };
  const StepCheck& last_step_check() const { return last_check_; }

  std::vector<Document> Pending() const override {
    std::vector<Document> pending;
    held_.queues.AppendTo(pending);
    held_.carry.AppendTo(pending);
    for (const Buffered& step : buffer_) {
      pending.insert(pending.end(), step.arrivals.begin(), step.arrivals.end());
    }
    return pending;
  }
  HeldBack Held() const override {
    HeldBack held = held_.queues.held();
    held = held + HeldBack{held_.carry.size(), held_.carry.tokens()};
    for (const Buffered& step : buffer_) detail::AddHeld(step.arrivals, held);
    return held;
  }

  nlohmann::json ConfigJson() const override {
    nlohmann::json j = Packer::ConfigJson();
    j["thresholds"] = held_.queues.thresholds();
    j["refine_rounds"] = refine_rounds_;
    j["lookahead"] = lookahead_;
    if (std::isfinite(delay_.budget())) j["delay_budget"] = delay_.budget();
    j["bound_delay"] = bound_delay_;
    // No attention_range: like the cost, it only steers later choices (every held document is
    // valid under any range), so a state restores into a packer planning with another range or
    // cost (the sampler's online calibration swaps a FLOP cost for a fitted one mid-run).
    return j;
  }
  nlohmann::json StateJson() const override {
    nlohmann::json buffer = nlohmann::json::array();
    for (const Buffered& step : buffer_) buffer.push_back(detail::DocumentsState(step.arrivals));
    return {{"queues", held_.queues.StateJson()},
            {"carry", detail::DocumentsState(held_.carry.ToVector())},
            {"buffer", buffer},
            {"wlb_delay", delay_.StateJson()}};
  }

 protected:
  // Parses every field (ValidateState checks them against the configuration) and assigns only at
  // the end.
  absl::Status LoadStateJson(const nlohmann::json& j) override {
    return detail::LoadStateOrError([&]() -> absl::Status {
      lookahead::Holding held{.queues = held_.queues, .carry = {}};
      if (absl::Status s = held.queues.LoadStateJson(j.at("queues")); !s.ok()) return s;
      const nlohmann::json& bs = j.at("buffer");
      if (!bs.is_array() || bs.size() > static_cast<size_t>(lookahead_)) {
        throw nlohmann::json::out_of_range::create(
            401, "more buffered steps than the look-ahead allows", &j);
      }
      const std::vector<Document> carry = detail::DocumentsFromState(j.at("carry"));
      // PackUnderCap keeps the carry longest first; a carry in another order is not a saved one.
      if (!std::is_sorted(carry.begin(), carry.end(), LongerFirst)) {
        throw nlohmann::json::out_of_range::create(401, "carry-over is not ordered longest first",
                                                   &j);
      }
      std::deque<Buffered> buffer;
      for (const nlohmann::json& b : bs) buffer.push_back(Buffer(detail::DocumentsFromState(b)));
      held.carry = detail::LengthOrdered(carry);
      lookahead::DelayAccount delay = delay_;
      if (absl::Status s = delay.LoadStateJson(j.at("wlb_delay")); !s.ok()) return s;
      held_ = std::move(held);
      buffer_ = std::move(buffer);
      delay_ = std::move(delay);
      return absl::OkStatus();
    });
  }

  // Queued outliers at their levels in arrival order, carried and queued documents before the
  // first buffered step, each buffered step holding the arrivals of one push in order; then the
  // held pieces (CheckHeldPieces); then the delay account's arrivals before the buffered steps,
  // every step pushed before them planned, and the buffered steps the last ones pushed.
  absl::Status ValidateState(int64_t pushes, int64_t next_step) const override {
    const int64_t first_buffered = next_buffered_arrival(buffer_);
    if (absl::Status s = held_.queues.Validate(first_buffered); !s.ok()) return s;
    absl::Status carried = absl::OkStatus();
    held_.carry.ForEach([&](const Document& d) {
      if (carried.ok() && d.arrival_step >= first_buffered) {
        carried = absl::InvalidArgumentError(
            absl::StrFormat("carried document %d arrived at step %d, not before step %d", d.id,
                            d.arrival_step, first_buffered));
      }
    });
    if (!carried.ok()) return carried;
    int64_t expected = first_buffered;
    for (const Buffered& step : buffer_) {
      for (const Document& d : step.arrivals) {
        if (d.arrival_step != expected) {
          return absl::InvalidArgumentError(
              absl::StrFormat("buffered document %d: arrival step %d, expected %d", d.id,
                              d.arrival_step, expected));
        }
      }
      ++expected;
    }
    if (absl::Status s = CheckHeldPieces(pushes); !s.ok()) return s;
    const auto buffered = static_cast<int64_t>(buffer_.size());
    if (absl::Status s = delay_.Validate(pushes - buffered); !s.ok()) return s;
    if (next_step < pushes - buffered) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "next_step %d is below the %d pushes before the %d buffered steps: every step pushed "
          "before them was planned, so planned steps went backwards",
          next_step, pushes - buffered, buffered));
    }
    if (buffered > pushes || (first_buffered != INT64_MAX && first_buffered != pushes - buffered)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%d buffered steps from arrival step %d are not the last of the %d pushes so far",
          buffered, first_buffered == INT64_MAX ? -1 : first_buffered, pushes));
    }
    return absl::OkStatus();
  }

  std::vector<StepPlan> DoPush(std::vector<Document> arrivals) override {
    buffer_.push_back(Buffer(std::move(arrivals)));
    std::vector<StepPlan> steps;
    if (buffer_.size() > static_cast<size_t>(lookahead_)) steps.push_back(PlanFront());
    return steps;
  }

  // The buffered steps are planned with what look-ahead is left; then, as in wlb, every queue
  // releases everything and steps are planned until nothing is held.
  std::vector<StepPlan> DoFlush() override {
    std::vector<StepPlan> steps;
    while (!buffer_.empty()) steps.push_back(PlanFront());
    while (!held_.queues.empty() || !held_.carry.empty()) {
      steps.push_back(MakeStep(Packing().DrainStep(held_)));  // places at least one piece
    }
    return steps;
  }

 private:
  // A pushed step not yet planned: its arrivals and their sketch, made once at the push (the
  // look-ahead reads it while the step is buffered, then as the step's own arrivals).
  struct Buffered {
    std::vector<Document> arrivals;
    lookahead::Arrivals sketch;
  };
  Buffered Buffer(std::vector<Document> arrivals) const {
    lookahead::Arrivals sketch;
    // Read only when candidates are scored: never at K = 0 or N = 1 (lookahead::Candidates).
    if (lookahead_ > 0 && config_.micro_batches > 1) {
      sketch = sketcher_.SplitArrivals(arrivals, held_.queues);
    }
    return {.arrivals = std::move(arrivals), .sketch = std::move(sketch)};
  }
  lookahead::AheadArrivals AheadSketches() const {
    lookahead::AheadArrivals ahead;
    for (const Buffered& step : buffer_) ahead.push_back(&step.sketch);
    return ahead;
  }

  // The arrival step of the first buffered step (the first document's; INT64_MAX when the buffer
  // holds no document).
  static int64_t next_buffered_arrival(const std::deque<Buffered>& buffer) {
    for (size_t i = 0; i < buffer.size(); ++i) {
      if (!buffer[i].arrivals.empty()) {
        return buffer[i].arrivals.front().arrival_step - static_cast<int64_t>(i);
      }
    }
    return INT64_MAX;
  }

  lookahead::StepPacking Packing() const {
    return {.config = config_,
            .cost = cost_,
            .refine_rounds = refine_rounds_,
            .attention_range = attention_range_};
  }

  // Plans the front buffered step: scores every candidate, then packs the best one as
  // wlb-refine packs a step (bounded: the best one that keeps the delay within wlb's).
  StepPlan PlanFront() {
    last_check_.checked = false;
    std::vector<Document> arrivals = std::move(buffer_.front().arrivals);
    const lookahead::Arrivals arrived = std::move(buffer_.front().sketch);
    buffer_.pop_front();
    const lookahead::DelayAccount::Standing standing =
        delay_.BeginStep(arrivals, next_step_, bound_delay_,
                         bound_delay_ ? lookahead::AccruedDelay(held_, next_step_) : 0.0);
    lookahead::Holding held = std::move(held_);
    std::vector<Document> fresh = lookahead::Enqueue(std::move(arrivals), held);
    SortLongestFirst(fresh);
    const std::vector<lookahead::Candidate> candidates =
        lookahead::Candidates(held, fresh, static_cast<size_t>(config_.micro_batches),
                              config_.max_tokens, delay_.wlb_queues(), lookahead_, next_step_);
    std::vector<MicroBatch> mbs;
    if (candidates.size() == 1) {
      mbs = Packing().PlanStep(candidates[0], fresh, held);
    } else {
      const Scoring scoring{
          .candidates = candidates,
          .held = held,
          .fresh = fresh,
          .sketcher = sketcher_,
          .sketch = sketcher_.MakeSketchBase(held, fresh, arrived, AheadSketches()),
          .price = standing.price,
          .step_tokens = static_cast<double>(config_.micro_batches) * config_.context};
      mbs = PlanChosen(scoring, Best(scoring, scored_), standing, held);
    }
    delay_.Record(mbs, next_step_);
    held_ = std::move(held);
    return MakeStep(std::move(mbs));
  }

  // What the candidates of a step are scored on.
  struct Scoring {
    const std::vector<lookahead::Candidate>& candidates;
    const lookahead::Holding& held;
    const std::vector<Document>& fresh;
    const lookahead::Sketcher& sketcher;
    lookahead::SketchBase sketch;
    double price;        // DelayAccount::Standing::price, per N x S tokens
    double step_tokens;  // N x S

    // The candidate's score, or nullopt once it cannot come below `to_beat`; `first_step` as
    // Sketcher::ScoreBySketch's.
    std::optional<double> Score(size_t i, std::optional<double> to_beat,
                                double* first_step = nullptr) const {
      const double penalty =
          price * lookahead::TrainedTokens(candidates[i], held, fresh) / step_tokens;
      auto loses = [&](double at_least) { return to_beat && at_least - penalty >= *to_beat; };
      const std::optional<double> sum =
          sketcher.ScoreBySketch(candidates[i], held, sketch, loses, first_step);
      if (!sum) return std::nullopt;
      return *sum - penalty;
    }
  };

  // A candidate's score and the sketch of its own step, once scored in full.
  struct Scored {
    bool full = false;
    double score = 0.0;
    double sketched = 1.0;
  };
  // The best-scoring candidate (a later one must win by more than 1e-9); a candidate is scored
  // only as far as it could still win. `scored` receives what was scored in full.
  static size_t Best(const Scoring& scoring, std::vector<Scored>& scored) {
    scored.assign(scoring.candidates.size(), Scored{});
    std::optional<size_t> best;
    for (size_t i = 0; i < scoring.candidates.size(); ++i) {
      // A repeated candidate scores as its first occurrence, which it would have to beat.
      if (lookahead::RepeatsEarlier(scoring.candidates, i)) continue;
      double sketched = 1.0;
      const std::optional<double> score = scoring.Score(
          i, best ? std::optional(scored[*best].score - 1e-9) : std::nullopt, &sketched);
      if (!score) continue;
      scored[i] = {.full = true, .score = *score, .sketched = sketched};
      if (!best || *score < scored[*best].score - 1e-9) best = i;
    }
    return best.value_or(0);
  }

  // Packs the step under the best-scoring candidate that passes two checks on its real packing
  // (unrefined: refinement moves documents between micro-batches, not between steps; the chosen
  // one is then refined):
  //  - No worse a step than wlb's rule (NoWorseStepThan): under every cost of the attention
  //    range, its imbalance is at most that of the step wlb's rule (candidate 0) packs from the
  //    same holding. The sketch scores under the planning cost alone, and a candidate that wins
  //    there by releasing a lone long outlier into a step of short ones (one micro-batch at 2x
  //    the mean, which wlb's rule would hold until a partner is queued) is a worst step that the
  //    look-ahead's later steps cannot repay; nor is a choice that wins under one attention
  //    weight and loses under another in the range. wlb's rule itself always passes.
  //  - Bounded (bound_delay), within wlb-refine's delay: the delay committed by the end of the
  //    step (held tokens charged up to the next step) plus what the held tokens add later is at
  //    most the account's fluid wlb's (a lower bound of wlb-refine's, DelayAccount) counted the
  //    same way. With no step buffered, "later" is the drain: the packer's exactly as Flush()
  //    drains (DrainDelay), the fluid's at N x S_max a step, so that the last step of a stream
  //    ends within wlb-refine's delay. With steps buffered it is ContinuationDelay over their
  //    arrivals, the same for both: a backlog costs more while arrivals keep coming, so one that
  //    wlb does not have is not taken on because a drain would clear it.
  // Candidates are tried by score, `best` first; when none passes both, the step is packed under
  // the one that passes the first and comes closest to the delay bound.
  std::vector<MicroBatch> PlanChosen(const Scoring& scoring, size_t best,
                                     const lookahead::DelayAccount::Standing& wlb,
                                     lookahead::Holding& held) const {
    const lookahead::StepPacking packing = Packing();
    const double capacity = static_cast<double>(config_.micro_batches) * config_.max_tokens;
    absl::InlinedVector<double, kMaxLookahead> ahead;  // the buffered steps' tokens
    for (const Buffered& step : buffer_) ahead.push_back(step.sketch.tokens);
    // Bounded: wlb's delay by the end of the stream in the two futures the packer cannot tell
    // apart, the stream ending after the buffered steps (queued outliers then drain with the
    // rest) or going on (they wait for their level's next release, DelayAccount::QueueDelay); a
    // step must keep within both (Planned::excess).
    double wlb_ends = std::numeric_limits<double>::infinity();
    double wlb_goes_on = std::numeric_limits<double>::infinity();
    if (bound_delay_) {
      wlb_ends = wlb.wlb_committed + lookahead::ContinuationDelay(wlb.wlb_held, ahead, capacity);
      wlb_goes_on = wlb.wlb_committed + wlb.wlb_queued +
                    lookahead::ContinuationDelay(wlb.wlb_carried, ahead, capacity);
    }
    // Outlier tokens in a carry-over (queued-length documents released but not trained).
    const int64_t outlier_length = held.queues.levels() > 0 ? held.queues.MinLength(0) : INT64_MAX;
    auto carried_outliers = [&](const lookahead::Holding& h) {
      int64_t tokens = 0;
      h.carry.ForEach([&](const Document& d) {
        if (d.length >= outlier_length) tokens += d.length;
      });
      return tokens;
    };
    const int64_t carried_before = carried_outliers(held);
    auto plan = [&](size_t i, Planned& p) {
      p.held = held;  // a copy into memory kept from earlier steps
      p.mbs = packing.PlanStep(scoring.candidates[i], scoring.fresh, p.held, /*refined=*/false);
      p.imbalance = lookahead::ImbalanceAtRangeEnds(p.mbs, cost_, attention_range_);
      p.carried_outliers = carried_outliers(p.held);
      p.excess = -std::numeric_limits<double>::infinity();
      if (!bound_delay_) return;
      const double committed = delay_.planned_token_steps() +
                               lookahead::TrainedDelay(p.mbs, next_step_) +
                               lookahead::AccruedDelay(p.held, next_step_ + 1);
      if (ahead.empty()) {
        p.excess = committed + packing.DrainDelay(p.held) - wlb_ends;
        return;
      }
      const auto carried = static_cast<double>(p.held.carry.tokens());
      const auto queued = static_cast<double>(p.held.queues.held().tokens);
      const double ends =
          committed + lookahead::ContinuationDelay(queued + carried, ahead, capacity);
      const double goes_on = committed + delay_.QueueDelay(p.held.queues) +
                             lookahead::ContinuationDelay(carried, ahead, capacity);
      p.excess = std::max(ends - wlb_ends, goes_on - wlb_goes_on);
    };
    // An explicit delay budget is the caller's word that delay matters more than balance: its
    // price steers, and the step check would refuse the releases it asks for (measured: a
    // quarter-step budget on the heavy tail ended at 0.39 steps with the check, 0.25 without).
    const bool budgeted = std::isfinite(delay_.budget());
    // wlb's rule's plan, made when first needed: a step at most 1 + kStepTolerance unbalanced
    // passes the step check whatever the rule's is (no step is below 1).
    Planned& rule = planned_[0];
    bool rule_planned = false;
    auto plan_rule = [&] {
      if (!rule_planned) plan(0, rule);
      rule_planned = true;
    };
    Planned* closest = nullptr;  // passes the step check, nearest the delay bound so far
    // Passes both checks, but its real step was far off its sketch, and its score corrected by
    // the difference (the first such).
    Planned* missketched = nullptr;
    double corrected = 0.0;
    Planned* chosen = nullptr;
    auto free_slot = [&] {
      for (size_t k = 1; k < planned_.size(); ++k) {
        if (&planned_[k] != closest && &planned_[k] != missketched) return &planned_[k];
      }
      return &planned_[1];  // unreachable: three slots beside the rule's for two kept plans
    };
    auto try_candidate = [&](size_t i, const Scored& scored) {
      if (i == 0) {
        plan_rule();
        if (rule.excess <= 0.0) chosen = &rule;
        if (closest == nullptr || rule.excess < closest->excess) closest = &rule;
        return;
      }
      Planned* next = free_slot();
      plan(i, *next);
      // Outliers released but not trained go first next step, a long one among that step's
      // short documents (releasing more than a step holds made worst steps 0.9-1.2 above wlb's
      // at N = 16): no more of them than wlb's rule carries.
      if (next->carried_outliers > carried_before) {
        plan_rule();
        if (next->carried_outliers > rule.carried_outliers) return;
      }
      const bool balanced =
          next->imbalance[0] <= 1.0 + kStepTolerance && next->imbalance[1] <= 1.0 + kStepTolerance;
      if (!balanced && !budgeted) {
        plan_rule();
        if (!NoWorseStepThan(*next, rule)) return;
      }
      if (next->excess <= 0.0) {
        // A sketch its real step does not bear out (e.g. arrivals held back that come back to
        // fill a micro-batch left empty) ranks by its score corrected by the difference: the
        // next by score may be better.
        const double off = ImbalanceDegree(next->mbs) - scored.sketched;
        if (off <= kSketchSkip) {
          chosen = next;
        } else if (missketched == nullptr) {
          missketched = next;
          corrected = scored.score + off;
        }
      } else if (closest == nullptr || next->excess < closest->excess) {
        closest = next;
      }
    };
    try_candidate(best, scored_[best]);
    if (chosen == nullptr) {
      // The others by score, each scored in full. One whose sketched step is far more unbalanced
      // than the sketch of wlb's rule's is not packed: the step check would refuse it (the
      // sketch is within a few hundredths of the real packing), and packing a candidate costs
      // more than scoring all of them.
      std::vector<std::pair<double, size_t>> ranked;
      for (size_t i = 0; i < scoring.candidates.size(); ++i) {
        if (lookahead::RepeatsEarlier(scoring.candidates, i)) continue;
        Scored& c = scored_[i];
        if (!c.full) {
          double sketched = 1.0;
          const double score = *scoring.Score(i, std::nullopt, &sketched);
          c = {.full = true, .score = score, .sketched = sketched};
        }
        if (i != best) ranked.push_back({c.score, i});
      }
      // Candidate 0 (wlb's rule) never repeats an earlier one, so its sketch is set.
      std::erase_if(ranked, [&](const std::pair<double, size_t>& r) {
        return r.second != 0 && scored_[r.second].sketched > scored_[0].sketched + kSketchSkip;
      });
      std::sort(ranked.begin(), ranked.end());
      for (const auto& [score, i] : ranked) {
        if (missketched != nullptr && corrected <= score) break;  // it ranks before this one
        try_candidate(i, scored_[i]);
        if (chosen != nullptr) break;
      }
    }
    if (chosen == nullptr) chosen = missketched;
    if (chosen == nullptr) {
      plan_rule();  // it passes the check: the closest is at worst the rule's plan
      chosen = closest != nullptr && closest->excess < rule.excess ? closest : &rule;
    }
    last_check_ = {.checked = true,
                   .rule_chosen = chosen == &rule,
                   .chosen = chosen->imbalance,
                   .rule = rule_planned ? rule.imbalance : std::array<double, 2>{1.0, 1.0}};
    for (Planned& p : planned_) {
      if (&p != chosen) p.mbs = {};  // a losing plan's documents are not kept until the next step
    }
    packing.Refine(chosen->mbs);
    std::swap(held, chosen->held);  // the plan keeps the old holding's memory for the next step
    return std::move(chosen->mbs);
  }

  // A step planned under one candidate (PlanChosen).
  struct Planned {
    std::vector<MicroBatch> mbs;
    lookahead::Holding held;
    std::array<double, 2> imbalance{};  // at the attention range's ends (ImbalanceAtRangeEnds)
    // Bounded: the delay the step leads to beyond wlb's, the larger over the two futures
    // PlanChosen weighs (<= 0 keeps within wlb's in both); -infinity unbounded.
    double excess = 0.0;
    int64_t carried_outliers = 0;  // tokens of outliers left in the carry-over
  };
  // Whether `p`'s step is no more unbalanced than `rule`'s under either end of the attention
  // range (a relative 1e-12 for rounding: wlb's rule must pass against itself).
  static bool NoWorseStepThan(const Planned& p, const Planned& rule) {
    for (size_t e = 0; e < 2; ++e) {
      if (p.imbalance[e] > rule.imbalance[e] + kStepTolerance) return false;
    }
    return true;
  }

  int refine_rounds_;
  int lookahead_;
  bool bound_delay_;                // plan within wlb-refine's delay (PackerOptions::bound_delay)
  AttentionRange attention_range_;  // refinement's changes must not worsen these costs
  lookahead::Holding held_;
  std::deque<Buffered> buffer_;  // pushed but not yet planned, oldest first
  lookahead::DelayAccount delay_;
  // Sketches of this packer's steps; its working memory is kept from step to step.
  lookahead::Sketcher sketcher_;
  // PlanChosen's plans (wlb's rule's and three others), kept from step to step: copying the
  // holding into them reuses their memory (copies allocated a dozen times a step at N = 4).
  mutable std::array<Planned, 4> planned_;
  // Best()'s scores, for PlanChosen's further tries (memory kept from step to step).
  mutable std::vector<Scored> scored_;
  mutable StepCheck last_check_;
};

}  // namespace wlb
