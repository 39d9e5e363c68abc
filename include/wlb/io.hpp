// wlb/io: reading lengths, profiles and measurements; plan JSON.
// Umbrella header of the folder: includes every header at its top level (subfolders are reached
// through the header that owns them). wlb/wlb.hpp includes one such header per folder.
#pragma once

#include "wlb/io/csv.hpp"
#include "wlb/io/default_distribution.hpp"
#include "wlb/io/input.hpp"
#include "wlb/io/kernel_profile.hpp"
#include "wlb/io/lengths.hpp"
#include "wlb/io/megatron_index.hpp"
#include "wlb/io/micro_batch_csv.hpp"
#include "wlb/io/plan_json.hpp"
#include "wlb/io/profile.hpp"
#include "wlb/io/read_file.hpp"
