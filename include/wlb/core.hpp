// wlb/core: documents, micro-batches, step plans, limits and the varlen layout.
// Umbrella header of the folder: includes every header at its top level (subfolders are reached
// through the header that owns them). wlb/wlb.hpp includes one such header per folder.
#pragma once

#include "wlb/core/document.hpp"
#include "wlb/core/limits.hpp"
#include "wlb/core/step_plan.hpp"
#include "wlb/core/steps.hpp"
#include "wlb/core/varlen_layout.hpp"
