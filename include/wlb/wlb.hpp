// wlb: workload-balanced packing and context-parallel sharding for long-context LLM training.
// Umbrella header: includes every public header of the planning library.
#pragma once

#include "wlb/core/document.hpp"
