// The owner of the precompiled umbrella header (wlb_umbrella_pch in CMakeLists.txt): CMake builds
// a target's precompiled header alongside its sources, so this target has one, and no code.
