// wlb/cost: per-document cost models (FLOP presets, calibrations, fitted profiles, attention
// masks) and the CP kernel model.
// Umbrella header of the folder: includes every header at its top level (subfolders are reached
// through the header that owns them). wlb/wlb.hpp includes one such header per folder.
#pragma once

#include "wlb/cost/attention_mask.hpp"
#include "wlb/cost/cost_fit.hpp"
#include "wlb/cost/cost_model.hpp"
#include "wlb/cost/document_cost.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/cost/micro_batch_fit.hpp"
