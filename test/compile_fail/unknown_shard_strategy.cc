// Must NOT compile: kShardStrategyTable has no row "per-dco", so ShardStrategy's consteval
// constructor fails (test ShardStrategyUnknownNameDoesNotCompile in test/CMakeLists.txt builds it
// and expects that error). Spelled "per-doc", it compiles.
#include "wlb/shard/strategy_table.hpp"

constexpr wlb::ShardStrategy kTypo("per-dco");
