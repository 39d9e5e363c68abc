// wlb-plan: plans packed micro-batches for a stream of documents and reports their balance.
// See wlb_plan.h and docs/guides/cli.md.
#include "wlb_plan.h"

int main(int argc, char** argv) { return wlb::cli::Main(argc, argv); }
