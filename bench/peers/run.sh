#!/usr/bin/env bash
# bench/peers/run.sh - the one command for the peer benchmarks: sets up the Python environment,
# builds remat (Release, build/) and the runner, runs every configuration and writes
# bench/results/peers-YYYY-MM-DD.{md,svg,json}. Arguments go to run.py (e.g. --models gpt
# --steps 5; see bench/peers/README.md).
#
# The runner is linked against a snapshot of the library (build/peers/libremat.so.0, copied
# right after the build), so a rebuild of build/ while the benchmarks run does not change the
# library under them half way (nor its ABI under an already compiled runner).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
jobs="${REMAT_JOBS:-2}"

bash "$here/setup.sh"

mkdir -p "$root/build"
cd "$root/build"
if [[ ! -f build.ninja ]]; then
  cmake -G Ninja -DCMAKE_BUILD_TYPE=Release .. >/dev/null
fi
ninja -j"$jobs" remat

snap="$root/build/peers"
mkdir -p "$snap"
cp -L "$root/build/libremat.so.0" "$snap/libremat.so.0.tmp" && mv -f "$snap/libremat.so.0.tmp" "$snap/libremat.so.0"
commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git -C "$root" status --porcelain --untracked-files=no -- include src CMakeLists.txt 2>/dev/null)" ]]; then
  commit="$commit (with uncommitted changes in include/ or src/)"
fi
echo "$commit" >"$snap/COMMIT"
echo "run.sh: building build/peers/remat_runner against the snapshot of libremat ($commit)"
g++ -O2 -std=c++20 -fopenmp -I"$root/include" "$here/remat_runner.cpp" "$snap/libremat.so.0" \
  -Wl,-rpath,"$snap" -o "$snap/remat_runner"

cd "$root"
exec "$here/.venv/bin/python" "$here/run.py" "$@"
