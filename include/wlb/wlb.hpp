// wlb: workload-balanced packing and context-parallel sharding for long-context LLM training.
// Umbrella header: includes every public header of the planning library.
#pragma once

#include "wlb/core/document.hpp"
#include "wlb/cost/cost_model.hpp"
#include "wlb/io/default_distribution.hpp"
#include "wlb/io/lengths.hpp"
#include "wlb/io/plan_json.hpp"
#include "wlb/io/profile.hpp"
#include "wlb/metrics/imbalance.hpp"
#include "wlb/pack/fixed_greedy_packer.hpp"
#include "wlb/pack/make_packer.hpp"
#include "wlb/pack/original_packer.hpp"
#include "wlb/pack/packer.hpp"
#include "wlb/pack/refine.hpp"
#include "wlb/pack/stream.hpp"
#include "wlb/pack/tuner.hpp"
#include "wlb/pack/windowed_packer.hpp"
#include "wlb/pack/wlb_packer.hpp"
#include "wlb/shard/kernel_model.hpp"
#include "wlb/shard/shard_json.hpp"
#include "wlb/shard/shard_metrics.hpp"
#include "wlb/shard/shard_plan.hpp"
