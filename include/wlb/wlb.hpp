// wlb: workload-balanced packing and context-parallel sharding for long-context LLM training.
// Umbrella header: one umbrella per folder (wlb/core.hpp, wlb/pack.hpp, ...), plan_settings.hpp
// and plan_spec.hpp, so every public header of the planning library is reached once.
#pragma once

#include "wlb/core.hpp"
#include "wlb/cost.hpp"
#include "wlb/io.hpp"
#include "wlb/metrics.hpp"
#include "wlb/pack.hpp"
#include "wlb/plan_settings.hpp"
#include "wlb/plan_spec.hpp"
#include "wlb/shard.hpp"
#include "wlb/sim.hpp"
