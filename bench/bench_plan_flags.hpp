// The flags the table benches (bench/*_table.cc) share, defined once in bench_plan_flags.cc:
// the input (--docs, --distribution, --seed, Abseil flags) and the plan settings of
// wlb::kPlanSettings offered to benches (kBenchFlag: --packer, --context, --max_tokens,
// --micro_batches, --cost, --queues, --lookahead, --attention_range, and --cp_link_gbps and
// --cp_memory_cap_percent, the CP link and memory cap of the plans and predictions), spelled as
// wlb-plan spells them. Each bench says which plan flags it
// takes; --steps (its default and meaning differ per bench) and the bench's own flags stay in its
// file.
//
//   wlb::bench::ParseFlags(argc, argv, "Compares CP shard strategies ...",
//                          {"packer", "micro_batches", "cp_link_gbps"});
//   absl::StatusOr<wlb::bench::BenchPlan> plan = wlb::bench::PlanFromFlags();
//   absl::StatusOr<wlb::PlanSettings> settings = plan->spec.Validate();  // wlb-plan's checks
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "wlb/plan_spec.hpp"
#include "wlb/wlb.hpp"

namespace wlb::bench {

// Parses the command line of a bench that takes the shared plan flags `takes` (and always the
// input flags); --help lists the program's own flags and the shared ones, and says which it takes.
void ParseFlags(int argc, char** argv, std::string_view usage,
                std::initializer_list<std::string_view> takes);

// What the shared flags describe.
struct BenchPlan {
  PlanSpec spec;       // the plan keys taken; those on the command line are given
  InputOptions input;  // --docs, --distribution, --seed (steps: the bench's)
  CpPlanOptions cp;    // --cp_link_gbps's K/V link and --cp_memory_cap_percent's cap, checked
};

// The parsed shared flags (ParseFlags). A taken plan flag on the command line is a given key of
// the spec, so PlanSpec::Validate checks it as wlb-plan does; a shared flag the bench does not
// take is an error, never silently ignored ("--context is not used by this run: ...").
absl::StatusOr<BenchPlan> PlanFromFlags();

// `base` for the rows a bench plans with `packer` while it sweeps packers: the given options that
// packer does not read (--lookahead for wlb) are dropped, so they apply to the rows that read them.
PlanSpec ForPacker(PlanSpec base, std::string packer);

// The registry's packer named `name` (kPackers); a name it does not hold fails to compile.
consteval const char* Packer(std::string_view name) {
  for (const PackerInfo& p : kPackers) {
    if (name == p.name) return p.name;
  }
  throw "not a packer of wlb::kPackers";
}

}  // namespace wlb::bench
