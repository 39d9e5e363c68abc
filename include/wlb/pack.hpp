// wlb/pack: the packers (make_packer.hpp is their registry; it reaches every packer and its parts).
// Umbrella header of the folder: includes every header at its top level (subfolders are reached
// through the header that owns them). wlb/wlb.hpp includes one such header per folder.
#pragma once

#include "wlb/pack/argmin_tree.hpp"
#include "wlb/pack/fixed_greedy_packer.hpp"
#include "wlb/pack/length_order.hpp"
#include "wlb/pack/lookahead_packer.hpp"
#include "wlb/pack/make_packer.hpp"
#include "wlb/pack/original_packer.hpp"
#include "wlb/pack/outlier_queues.hpp"
#include "wlb/pack/packer.hpp"
#include "wlb/pack/packer_state.hpp"
#include "wlb/pack/refine.hpp"
#include "wlb/pack/stream.hpp"
#include "wlb/pack/tuner.hpp"
#include "wlb/pack/windowed_packer.hpp"
#include "wlb/pack/wlb_packer.hpp"
