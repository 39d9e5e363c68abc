#!/bin/bash
# A compiler launcher that appends "user-s sys-s wall-s object" for every compile to the file
# $WLB_COMPILE_TIMES (default compile_times.txt), for comparing per-target compile cost in
# CPU-seconds on a shared machine (docs/guides/testing.md):
#   cmake -S . -B build -DCMAKE_CXX_COMPILER_LAUNCHER=$PWD/scripts/compile_times.sh ...
#   WLB_COMPILE_TIMES=$PWD/times.txt ninja -C build TARGET...
out=""
prev=""
for arg in "$@"; do
  if [ "$prev" = "-o" ]; then out="$arg"; fi
  prev="$arg"
done
exec /usr/bin/time -a -o "${WLB_COMPILE_TIMES:-compile_times.txt}" -f "%U %S %e $out" "$@"
