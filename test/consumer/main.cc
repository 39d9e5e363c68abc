// Smoke test of the installed package: plans a few steps with the public API only.
#include <cstdio>

#include "wlb/wlb.hpp"

int main() {
  std::vector<int64_t> lengths = {5, 300000, 19, 4096, 70000};
  auto docs = wlb::MakeDocuments(lengths, 131072);
  if (!docs.ok()) {
    std::fprintf(stderr, "%s\n", docs.status().ToString().c_str());
    return 1;
  }
  std::printf("wlb consumer: %zu pieces, %lld tokens\n", docs->size(),
              static_cast<long long>(wlb::TotalTokens(*docs)));
  return docs->size() == 7 ? 0 : 1;
}
