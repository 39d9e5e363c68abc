#include "wlb/cuda/layer_analysis.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "wlb/core/limits.hpp"
#include "wlb/cost/micro_batch_fit.hpp"
#include "wlb/shard/shard_metrics.hpp"

namespace wlb::cuda {
namespace {

constexpr absl::string_view kHeader =
    "method,step,index,tokens,documents,predicted,forward_ms,backward_ms,attention_forward_ms,"
    "attention_backward_ms,lengths";

// Rows grouped by step (in step order), each in micro-batch order.
std::map<int64_t, std::vector<const MicroBatchMeasurement*>> BySteps(
    std::span<const MicroBatchMeasurement> rows) {
  std::map<int64_t, std::vector<const MicroBatchMeasurement*>> steps;
  for (const MicroBatchMeasurement& m : rows) steps[m.step].push_back(&m);
  for (auto& [step, mbs] : steps) {
    std::stable_sort(mbs.begin(), mbs.end(),
                     [](const auto* a, const auto* b) { return a->index < b->index; });
  }
  return steps;
}

std::string Sanitized(std::string_view text) {
  std::string s(text.data(), text.size());
  for (char& c : s) {
    if (c == ',' || c == '\n' || c == '\r') c = c == ',' ? ';' : ' ';
  }
  return s;
}

}  // namespace

int64_t MicroBatchMeasurement::tokens() const {
  int64_t t = 0;
  for (int64_t d : lengths) t += d;
  return t;
}

std::string MeasurementsCsv(std::span<const MicroBatchMeasurement> rows,
                            std::string_view provenance) {
  std::string out = absl::StrCat("# ", Sanitized(provenance), "\n", kHeader, "\n");
  for (const MicroBatchMeasurement& m : rows) out += MeasurementsCsvRow(m);
  return out;
}

std::string MeasurementsCsvRow(const MicroBatchMeasurement& m) {
  return absl::StrFormat("%s,%d,%d,%d,%d,%.10g,%.6f,%.6f,%.6f,%.6f,%s\n", Sanitized(m.method),
                         m.step, m.index, m.tokens(), m.lengths.size(), m.predicted, m.forward_ms,
                         m.backward_ms, m.attention_forward_ms, m.attention_backward_ms,
                         absl::StrJoin(m.lengths, ";"));
}

absl::StatusOr<std::vector<MicroBatchMeasurement>> ParseMeasurementsCsv(std::string_view text,
                                                                        std::string_view source) {
  std::vector<MicroBatchMeasurement> rows;
  bool header_seen = false;
  int line_no = 0;
  const absl::string_view all(text.data(), text.size());
  const absl::string_view src(source.data(), source.size());
  for (absl::string_view line : absl::StrSplit(all, '\n')) {
    ++line_no;
    line = absl::StripTrailingAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    if (!header_seen) {
      if (line != kHeader) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s:%d: header must be \"%s\"", src, line_no, kHeader));
      }
      header_seen = true;
      continue;
    }
    std::vector<absl::string_view> f = absl::StrSplit(line, ',');
    if (f.size() != 11) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s:%d: %d fields, expected 11", src, line_no, f.size()));
    }
    MicroBatchMeasurement m;
    m.method = std::string(f[0]);
    int64_t tokens = 0, documents = 0;
    const std::pair<const char*, int64_t*> ints[] = {
        {"step", &m.step}, {"index", &m.index}, {"tokens", &tokens}, {"documents", &documents}};
    for (size_t i = 0; i < 4; ++i) {
      if (!absl::SimpleAtoi(f[1 + i], ints[i].second) || *ints[i].second < 0) {
        return absl::InvalidArgumentError(absl::StrFormat("%s:%d: %s %s is not an integer >= 0",
                                                          src, line_no, ints[i].first,
                                                          QuoteForMessage(f[1 + i])));
      }
    }
    const std::pair<const char*, double*> reals[] = {
        {"predicted", &m.predicted},
        {"forward_ms", &m.forward_ms},
        {"backward_ms", &m.backward_ms},
        {"attention_forward_ms", &m.attention_forward_ms},
        {"attention_backward_ms", &m.attention_backward_ms}};
    for (size_t i = 0; i < 5; ++i) {
      if (!absl::SimpleAtod(f[5 + i], reals[i].second) || !(*reals[i].second >= 0.0) ||
          !std::isfinite(*reals[i].second)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s:%d: %s %s is not a finite number >= 0", src, line_no,
                            reals[i].first, QuoteForMessage(f[5 + i])));
      }
    }
    for (absl::string_view d : absl::StrSplit(f[10], ';', absl::SkipEmpty())) {  // "": empty
      int64_t length = 0;
      if (!absl::SimpleAtoi(d, &length) || length < 1 || length > kMaxContext) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s:%d: document length %s is not an integer in [1, %d]", src, line_no,
                            QuoteForMessage(d), kMaxContext));
      }
      m.lengths.push_back(length);
    }
    if (static_cast<int64_t>(m.lengths.size()) != documents || m.tokens() != tokens) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s:%d: %d documents of %d tokens listed, the row says %d documents of %d tokens", src,
          line_no, m.lengths.size(), m.tokens(), documents, tokens));
    }
    rows.push_back(std::move(m));
  }
  if (!header_seen) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: no header line", src));
  }
  return rows;
}

std::vector<MicroBatchMeasurement> RowsOf(std::span<const MicroBatchMeasurement> rows,
                                          std::string_view method) {
  std::vector<MicroBatchMeasurement> out;
  for (const MicroBatchMeasurement& m : rows) {
    if (m.method == method) out.push_back(m);
  }
  return out;
}

absl::StatusOr<std::vector<ImbalanceRow>> ImbalanceTable(
    std::span<const MicroBatchMeasurement> rows) {
  std::vector<std::string> methods;
  for (const MicroBatchMeasurement& m : rows) {
    if (std::find(methods.begin(), methods.end(), m.method) == methods.end()) {
      methods.push_back(m.method);
    }
  }
  if (methods.empty()) return absl::InvalidArgumentError("Table 2 needs measurements, got none");
  std::vector<ImbalanceRow> table;
  for (const std::string& method : methods) {
    const std::vector<MicroBatchMeasurement> mine = RowsOf(rows, method);
    ImbalanceRow row{.method = method};
    for (const auto& [step, mbs] : BySteps(mine)) {
      std::vector<double> flop, fwd, total;
      for (const MicroBatchMeasurement* m : mbs) {
        flop.push_back(m->predicted);
        fwd.push_back(m->forward_ms);
        total.push_back(m->forward_ms + m->backward_ms);
      }
      row.flop_model += MaxOverMean(flop);
      row.measured_forward += MaxOverMean(fwd);
      row.measured_forward_backward += MaxOverMean(total);
      ++row.steps;
    }
    row.flop_model /= static_cast<double>(row.steps);
    row.measured_forward /= static_cast<double>(row.steps);
    const bool has_backward =
        std::any_of(mine.begin(), mine.end(), [](const auto& m) { return m.backward_ms > 0; });
    row.measured_forward_backward =
        has_backward ? row.measured_forward_backward / static_cast<double>(row.steps) : 0.0;
    table.push_back(row);
  }
  return table;
}

double PredictMicroBatch(const MicroBatchFit& fit, const MicroBatchMeasurement& m) {
  return ::wlb::PredictMicroBatchMs(fit, m.lengths);
}

absl::StatusOr<MicroBatchFit> FitMicroBatchCost(std::span<const MicroBatchMeasurement> rows) {
  std::vector<MicroBatchSample> samples;
  for (const MicroBatchMeasurement& m : rows) {
    if (m.lengths.empty()) continue;  // an empty micro-batch: nothing ran, 0 ms
    samples.push_back({.lengths = m.lengths,
                       .ms = m.forward_ms,
                       .step = m.step,
                       .where = absl::StrFormat("%s step %d micro-batch %d forward_ms", m.method,
                                                m.step, m.index)});
  }
  return ::wlb::FitMicroBatchCost(samples);
}

double PredictMicroBatch(const CostModel& model, const MicroBatchMeasurement& m) {
  double w = 0.0;
  for (int64_t d : m.lengths) w += model(d);
  return w;
}

absl::StatusOr<std::string> LayerProfileCsv(std::span<const ProfilePoint> points,
                                            std::string_view provenance) {
  if (points.empty()) return absl::InvalidArgumentError("a layer profile needs points, got none");
  std::string out = absl::StrCat("length,ms,", Sanitized(provenance), "\n");
  for (const ProfilePoint& p : points) {
    if (p.length < 1 || p.length > kMaxContext || !(p.ms >= kMinProfileMs) ||
        !(p.ms <= kMaxProfileMs)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "profile point (length %d, %g ms): length must be in [1, %d] and latency in [%g, %g] "
          "ms",
          p.length, p.ms, kMaxContext, kMinProfileMs, kMaxProfileMs));
    }
    absl::StrAppendFormat(&out, "%d,%.9g,\n", p.length, p.ms);
  }
  return out;
}

absl::StatusOr<double> MeasuredSecondsPerToken(std::span<const MicroBatchMeasurement> rows,
                                               const ParallelSizes& sizes, int layers) {
  if (rows.empty()) return absl::InvalidArgumentError("no measurements to simulate");
  if (layers < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("layers must be >= 1, got %d", layers));
  }
  const double per_stage = static_cast<double>(layers) / static_cast<double>(sizes.pp) * 1e-3;
  double seconds = 0.0;
  int64_t tokens = 0;
  for (const auto& [step, mbs] : BySteps(rows)) {
    std::vector<StageTimes> times;
    for (const MicroBatchMeasurement* m : mbs) {
      times.push_back({m->forward_ms * per_stage, m->backward_ms * per_stage});
      tokens += m->tokens();
    }
    absl::StatusOr<double> t = SimulateStep(times, sizes.pp, sizes.dp);
    if (!t.ok()) return t.status();
    seconds += *t;
  }
  if (tokens == 0) return absl::InvalidArgumentError("the measurements hold no tokens");
  return seconds / static_cast<double>(tokens);
}

absl::StatusOr<double> ModelSecondsPerToken(std::span<const MicroBatchMeasurement> rows,
                                            const StepTimeModel& model, const CpPolicy& policy) {
  if (rows.empty()) return absl::InvalidArgumentError("no measurements to simulate");
  double seconds = 0.0;
  int64_t tokens = 0;
  for (const auto& [step, mbs] : BySteps(rows)) {
    StepPlan plan;
    for (const MicroBatchMeasurement* m : mbs) {
      MicroBatch mb;
      for (int64_t d : m->lengths) {
        mb.documents.push_back(
            Document{.id = static_cast<int64_t>(mb.documents.size()), .length = d});
      }
      mb.tokens = m->tokens();
      mb.cost = m->predicted;
      tokens += mb.tokens;
      plan.micro_batches.push_back(std::move(mb));
    }
    absl::StatusOr<double> t = model.StepSeconds(plan, policy);
    if (!t.ok()) return t.status();
    seconds += *t;
  }
  if (tokens == 0) return absl::InvalidArgumentError("the measurements hold no tokens");
  return seconds / static_cast<double>(tokens);
}

absl::StatusOr<std::vector<CpRow>> CpTable(std::span<const CpMeasurement> rows) {
  using Key = std::tuple<std::string, int64_t, int64_t>;  // method, step, index
  // cp -> strategy -> micro-batch -> slowest rank ms (and imbalance).
  std::map<int, std::map<std::string, std::map<Key, std::pair<double, double>>>> by_cp;
  std::map<int, std::vector<std::string>> order;  // strategies in order of first appearance
  for (const CpMeasurement& m : rows) {
    if (m.rank_ms.empty() || static_cast<int>(m.rank_ms.size()) != m.cp) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s step %d micro-batch %d: %d rank times for C = %d", m.strategy, m.step,
                          m.index, m.rank_ms.size(), m.cp));
    }
    for (double v : m.rank_ms) {
      if (!(v >= 0.0) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s step %d micro-batch %d: rank time %g must be >= 0 and finite",
                            m.strategy, m.step, m.index, v));
      }
    }
    auto& strategies = order[m.cp];
    if (std::find(strategies.begin(), strategies.end(), m.strategy) == strategies.end()) {
      strategies.push_back(m.strategy);
    }
    by_cp[m.cp][m.strategy][{m.method, m.step, m.index}] = {
        *std::max_element(m.rank_ms.begin(), m.rank_ms.end()), MaxOverMean(m.rank_ms)};
  }
  std::vector<CpRow> table;
  for (const auto& [cp, strategies] : by_cp) {
    std::set<Key> keys;
    for (const auto& [name, mbs] : strategies) {
      for (const auto& [key, v] : mbs) keys.insert(key);
    }
    std::map<Key, double> oracle;
    for (const auto& [name, mbs] : strategies) {
      if (mbs.size() != keys.size()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("C = %d: strategy %s measured %d micro-batches, the others %d", cp,
                            name, mbs.size(), keys.size()));
      }
      if (name == "adaptive") continue;
      for (const auto& [key, v] : mbs) {
        auto [it, fresh] = oracle.emplace(key, v.first);
        if (!fresh) it->second = std::min(it->second, v.first);
      }
    }
    double oracle_total = 0.0;
    for (const auto& [key, v] : oracle) oracle_total += v;
    for (const std::string& name : order[cp]) {
      CpRow row{.cp = cp, .strategy = name, .mean_imbalance = 0.0};
      for (const auto& [key, v] : strategies.at(name)) {
        row.total_ms += v.first;
        row.mean_imbalance += v.second;
        ++row.micro_batches;
      }
      row.mean_imbalance /= static_cast<double>(row.micro_batches);
      row.vs_oracle = oracle_total > 0.0 ? row.total_ms / oracle_total : 1.0;
      table.push_back(row);
    }
  }
  return table;
}

absl::StatusOr<std::vector<MicroBatchMeasurement>> CpStageRows(
    std::span<const MicroBatchMeasurement> rows, std::span<const CpMeasurement> cp_rows,
    std::string_view method, std::string_view strategy, int cp) {
  std::map<std::pair<int64_t, int64_t>, const CpMeasurement*> slowest;  // (step, index)
  std::set<int64_t> steps;
  for (const CpMeasurement& c : cp_rows) {
    if (c.method != method || c.strategy != strategy || c.cp != cp) continue;
    slowest[{c.step, c.index}] = &c;
    steps.insert(c.step);
  }
  if (steps.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "no CP measurement of %s under %s at C = %d", method, strategy, cp));
  }
  std::vector<MicroBatchMeasurement> out;
  for (const MicroBatchMeasurement& m : rows) {
    if (m.method != method || !steps.contains(m.step)) continue;
    MicroBatchMeasurement r = m;
    if (!m.lengths.empty()) {
      auto it = slowest.find({m.step, m.index});
      const double whole = m.forward_ms + m.backward_ms;
      if (it == slowest.end() || it->second->rank_ms.empty() || !(whole > 0.0)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s step %d micro-batch %d: %s", method, m.step, m.index,
            it == slowest.end() || it->second->rank_ms.empty()
                ? absl::StrFormat("no CP measurement under %s at C = %d", strategy, cp)
                : std::string("no measured layer time to split")));
      }
      const double max_rank =
          *std::max_element(it->second->rank_ms.begin(), it->second->rank_ms.end());
      r.forward_ms = max_rank * m.forward_ms / whole;
      r.backward_ms = max_rank * m.backward_ms / whole;
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace wlb::cuda
