// wlb/metrics: imbalance metrics.
// Umbrella header of the folder: includes every header at its top level (subfolders are reached
// through the header that owns them). wlb/wlb.hpp includes one such header per folder.
#pragma once

#include "wlb/metrics/imbalance.hpp"
