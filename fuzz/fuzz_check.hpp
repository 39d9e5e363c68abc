// Shared by the fuzz harnesses: a failed invariant aborts with a message, which libFuzzer (and the
// corpus replay test) reports as a crash.
#pragma once

#include <cstdio>
#include <cstdlib>

#define WLB_FUZZ_CHECK(cond)                                                                 \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)
