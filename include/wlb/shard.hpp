// wlb/shard: CP shard plans (strategy_table.hpp is the strategy registry; shard_strategies.hpp
// reads it and reaches strategies/).
// Umbrella header of the folder: includes every header at its top level (subfolders are reached
// through the header that owns them). wlb/wlb.hpp includes one such header per folder.
#pragma once

#include "wlb/shard/cp_prediction.hpp"
#include "wlb/shard/per_seq_order.hpp"
#include "wlb/shard/placement.hpp"
#include "wlb/shard/plan_builder.hpp"
#include "wlb/shard/row_exchange.hpp"
#include "wlb/shard/shard_json.hpp"
#include "wlb/shard/shard_maps.hpp"
#include "wlb/shard/shard_metrics.hpp"
#include "wlb/shard/shard_plan.hpp"
#include "wlb/shard/shard_strategies.hpp"
#include "wlb/shard/shard_types.hpp"
#include "wlb/shard/strategy_table.hpp"
#include "wlb/shard/validate_plan.hpp"
