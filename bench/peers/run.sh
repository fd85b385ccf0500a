#!/usr/bin/env bash
# bench/peers/run.sh - the one command for the peer benchmarks: sets up the Python environment,
# builds remat and its runner (Release, build/), runs every configuration and writes
# bench/results/peers-YYYY-MM-DD.{md,svg,json}. Arguments go to run.py (e.g. --models gpt
# --steps 3, or --wait-quiet 600 to wait up to 10 minutes for a quiet machine before each model).
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
# With bench/peers hooked into CMake (bench/CMakeLists.txt: add_subdirectory(peers)) the runner
# is a target; until then it is built by hand against build/libremat.
if ninja -t targets all 2>/dev/null | grep -q '^remat_runner:'; then
  ninja -j"$jobs" remat_runner
else
  ninja -j"$jobs" remat
  runner_src="$here/remat_runner.cpp"
  if [[ ! -x remat_runner || remat_runner -ot "$runner_src" || remat_runner -ot libremat.so ]]; then
    echo "run.sh: building build/remat_runner against build/libremat.so"
    g++ -O2 -std=c++20 -fopenmp -I"$root/include" "$runner_src" -L"$root/build" -lremat \
      -Wl,-rpath,"$root/build" -o remat_runner
  fi
fi

cd "$root"
exec "$here/.venv/bin/python" "$here/run.py" "$@"
