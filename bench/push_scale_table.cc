// Time and peak memory of one Push() of n documents followed by Flush(), for every packer: both
// must grow linearly (or n log n) in n, so a huge push or a long carry never runs out of memory or
// time.
//
//   build/bench/push_scale_table --docs=100000,1000000,10000000
//
// Every (packer, n) runs in a child process of its own, so its peak resident memory (getrusage
// ru_maxrss of the child) counts only that run: the n input documents, the packer's state and the
// returned plans. Lengths: log-uniform in [1, S] (seeded), S = 8192, N = 8, S_max = S + S/4,
// default outlier thresholds (two queues), fixed-greedy window 4, wlb-lookahead K = 1.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "wlb/wlb.hpp"

ABSL_FLAG(std::string, docs, "100000,1000000,10000000", "comma-separated document counts");
ABSL_FLAG(std::string, packers, "", "comma-separated packers (empty: all)");
ABSL_FLAG(int64_t, context, 8192, "context window S");
ABSL_FLAG(int32_t, micro_batches, 8, "N");

namespace {

struct Measured {
  double seconds = 0.0;
  int64_t steps = 0;
  int64_t planned_documents = 0;
};

// One Push() of `n` documents and a Flush(); checks that every document comes out exactly once.
Measured PushAndFlush(const std::string& packer, int64_t n) {
  const int64_t context = absl::GetFlag(FLAGS_context);
  const wlb::PackerConfig config{.context = context,
                                 .max_tokens = wlb::DefaultMaxTokens(context),
                                 .micro_batches = absl::GetFlag(FLAGS_micro_batches)};
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> u(0.0, std::log(static_cast<double>(context)));
  std::vector<wlb::Document> docs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    docs[i] = {.id = i, .length = std::max<int64_t>(1, std::llround(std::exp(u(rng))))};
  }
  // The packer as wlb-plan would make it (two default outlier queues), fixed-greedy with W = 4.
  const wlb::PlanSpec spec{.packer = packer,
                           .context = config.context,
                           .micro_batches = config.micro_batches,
                           .window = 4};
  absl::StatusOr<wlb::PlanSettings> plan = spec.Validate();
  auto p = plan.ok() ? wlb::MakePacker(plan->packer, plan->config,
                                       *wlb::CostModelFromPreset("llama2-7b"), plan->options)
                     : absl::StatusOr<std::unique_ptr<wlb::Packer>>(plan.status());
  if (!p.ok()) {
    std::fprintf(stderr, "%s\n", std::string(p.status().message()).c_str());
    std::exit(1);
  }
  Measured m;
  const auto start = std::chrono::steady_clock::now();
  std::vector<wlb::StepPlan> steps = *(*p)->Push(std::move(docs));
  for (wlb::StepPlan& s : (*p)->Flush()) steps.push_back(std::move(s));
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.steps = static_cast<int64_t>(steps.size());
  std::vector<bool> seen(static_cast<size_t>(n), false);
  for (const wlb::StepPlan& s : steps) {
    for (const wlb::MicroBatch& mb : s.micro_batches) {
      for (const wlb::Document& d : mb.documents) {
        if (d.piece == 0) {  // original cuts documents into parts: count each document once
          if (seen[d.id]) {
            std::fprintf(stderr, "%s: document %ld planned twice\n", packer.c_str(), d.id);
            std::exit(1);
          }
          seen[d.id] = true;
          ++m.planned_documents;
        }
      }
    }
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<std::string> packers;
  for (const char* name : wlb::kPackerNames) packers.push_back(name);
  if (!absl::GetFlag(FLAGS_packers).empty()) {
    packers = absl::StrSplit(absl::GetFlag(FLAGS_packers), ',');
  }
  std::vector<int64_t> counts;
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_docs), ',')) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(c, &n) || n < 1) {
      std::fprintf(stderr, "--docs: bad count '%s'\n", std::string(c).c_str());
      return 1;
    }
    counts.push_back(n);
  }
  std::printf(
      "| packer | documents | steps | push + flush (s) | peak RSS (MiB) | s per 10^6 docs | "
      "bytes per doc |\n|---|---:|---:|---:|---:|---:|---:|\n");
  std::fflush(stdout);
  for (const std::string& packer : packers) {
    for (int64_t n : counts) {
      int fds[2];
      if (pipe(fds) != 0) return 1;
      const pid_t pid = fork();
      if (pid == 0) {
        close(fds[0]);
        const Measured m = PushAndFlush(packer, n);
        if (m.planned_documents != n) {
          std::fprintf(stderr, "%s: %ld of %ld documents planned\n", packer.c_str(),
                       m.planned_documents, n);
          _exit(1);
        }
        if (write(fds[1], &m, sizeof(m)) != sizeof(m)) _exit(1);
        _exit(0);
      }
      close(fds[1]);
      Measured m;
      const bool got = read(fds[0], &m, sizeof(m)) == sizeof(m);
      close(fds[0]);
      int status = 0;
      rusage usage{};
      wait4(pid, &status, 0, &usage);
      if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::printf("| %s | %ld | failed (status %d) | | | | |\n", packer.c_str(), n, status);
        std::fflush(stdout);
        continue;
      }
      const double mib = static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB
      std::printf("| %s | %ld | %ld | %.2f | %.0f | %.2f | %.0f |\n", packer.c_str(), n, m.steps,
                  m.seconds, mib, m.seconds * 1e6 / static_cast<double>(n),
                  static_cast<double>(usage.ru_maxrss) * 1024.0 / static_cast<double>(n));
      std::fflush(stdout);
    }
  }
  return 0;
}
