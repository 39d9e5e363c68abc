// Fuzzes RestoreState() of every packer with blobs that pass the checksum: the first bytes pick
// the packer and its configuration, the rest is the JSON payload (its "config" is replaced by the
// packer's own, so the fuzzer reaches the state checks). For every blob RestoreState() accepts,
// one more Push() and Flush() must end, place every held and pushed piece exactly once in N
// micro-batches per step under the packer's cap, and leave nothing pending; a rejected blob must
// leave the packer's state unchanged.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fuzz_check.hpp"
#include "wlb/wlb.hpp"

namespace {

std::string Blob(const std::string& payload) {
  return absl::StrFormat("%s\n%016x\n%s", wlb::Packer::kStateMagic, wlb::detail::Fnv1a64(payload),
                         payload);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  // Every packer of the registry; the first four keep the indices the committed corpus was
  // written with, the rest follow in the registry's order.
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n = {"original", "fixed-greedy", "wlb", "wlb-refine"};
    for (const wlb::PackerInfo& p : wlb::kPackers) {
      if (std::find(n.begin(), n.end(), p.name) == n.end()) n.push_back(p.name);
    }
    return n;
  }();
  const std::string& name = names[data[0] % names.size()];
  wlb::PackerConfig config;
  config.context = 1 + data[1] % 64;
  config.max_tokens = config.context + data[2] % 32;
  config.micro_batches = 1 + data[3] % 4;
  wlb::PackerOptions options{.window = 1 + data[4] % 3, .lookahead = data[4] / 9 % 3};
  const int queues = data[4] / 3 % 3;
  for (int i = 1; i <= queues; ++i) {
    options.thresholds.push_back(std::max<int64_t>(i, config.context * i / (queues + 1)));
  }
  if (!wlb::ValidateThresholds(options.thresholds, config.context).ok()) options.thresholds = {};
  auto packer = wlb::MakePacker(name, config, *wlb::CostModelFromPreset("llama2-7b"), options);
  WLB_FUZZ_CHECK(packer.ok());
  wlb::Packer& p = **packer;

  std::string payload(reinterpret_cast<const char*>(data) + 5, size - 5);
  if (!wlb::detail::JsonNestedDeeperThan(payload, wlb::kMaxJsonDepth)) {
    nlohmann::json j = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) {
      j["config"] = p.ConfigJson();
      payload = j.dump();
    }
  }
  const std::string before = p.SaveState();
  const absl::Status restored = p.RestoreState(Blob(payload));
  if (!restored.ok()) {
    WLB_FUZZ_CHECK(p.SaveState() == before);
    WLB_FUZZ_CHECK(restored.message().size() < 2048);
    return 0;
  }

  // Every piece held, plus one more step of new pieces (ids the state does not hold), exactly
  // once.
  std::map<std::pair<int64_t, int32_t>, int64_t> expected;  // (id, piece) -> length
  std::set<int64_t> held_ids;
  for (const wlb::Document& d : p.Pending()) {
    expected[{d.id, d.piece}] = d.length;
    held_ids.insert(d.id);
  }
  std::vector<wlb::Document> arrivals;
  int64_t next_id = 0;
  for (int64_t i = 0; i < 2 * config.micro_batches; ++i) {
    while (held_ids.contains(next_id)) ++next_id;
    const wlb::Document d{.id = next_id++, .length = 1 + (i * 7919) % config.context};
    arrivals.push_back(d);
    expected[{d.id, d.piece}] = d.length;
  }
  absl::StatusOr<wlb::PackRun> run = wlb::RunPacker(p, {arrivals});
  WLB_FUZZ_CHECK(run.ok());
  WLB_FUZZ_CHECK(p.Pending().empty());
  const int64_t cap = name.starts_with("wlb") ? config.max_tokens : config.context;
  std::map<std::pair<int64_t, int32_t>, int64_t> placed;  // (id, emitted piece) -> tokens
  std::map<int64_t, int64_t> tokens_by_id, expected_by_id;
  for (const auto& [key, length] : expected) expected_by_id[key.first] += length;
  for (const wlb::StepPlan& step : run->steps) {
    WLB_FUZZ_CHECK(step.micro_batches.size() == static_cast<size_t>(config.micro_batches));
    for (const wlb::MicroBatch& mb : step.micro_batches) {
      int64_t tokens = 0;
      for (const wlb::Document& d : mb.documents) {
        WLB_FUZZ_CHECK(d.length >= 1);
        tokens += d.length;
        tokens_by_id[d.id] += d.length;
        if (name != "original") {  // original renumbers the parts it cuts
          WLB_FUZZ_CHECK((placed.emplace(std::pair(d.id, d.piece), d.length).second));
          const auto want = expected.find(std::pair(d.id, d.piece));
          WLB_FUZZ_CHECK(want != expected.end() && want->second == d.length);
        }
      }
      WLB_FUZZ_CHECK(tokens == mb.tokens);
      WLB_FUZZ_CHECK(tokens <= cap);
    }
  }
  WLB_FUZZ_CHECK(tokens_by_id == expected_by_id);
  return 0;
}
