#!/usr/bin/env bash
# Runs a test binary with its CPU kernels forced to one level (remat/cpu_features.h):
#   tests/at_cpu_level.sh LEVEL BINARY [ARGS...]
# Exits 77 (ctest: skipped) when this CPU lacks the level, so every machine runs the levels it has.
set -euo pipefail
level=$1
shift
case $level in
  avx512) needs="avx512f avx512bw avx512cd avx512dq avx512vl" ;;
  avx2) needs="avx2 fma bmi2 f16c movbe" ;;
  baseline) needs="" ;;
  *) echo "at_cpu_level.sh: no level $level" >&2; exit 2 ;;
esac
for flag in $needs; do
  if ! grep -qw "$flag" /proc/cpuinfo; then
    echo "this CPU lacks $flag: level $level not run"
    exit 77
  fi
done
REMAT_CPU_LEVEL=$level exec "$@"
