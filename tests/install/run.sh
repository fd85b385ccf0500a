#!/usr/bin/env bash
# Install test: installs the remat build in BUILD_DIR into WORK_DIR/prefix, then configures,
# builds and runs the consumer project in this folder against it (find_package(remat)), and
# builds the examples installed with the package, from their installed copy, and runs two of them.
#   tests/install/run.sh BUILD_DIR WORK_DIR
# Used by scripts/test and registered as the ctest test `install_consumer`.
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR WORK_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$(cd "$1" && pwd)
mkdir -p "$2"
work=$(cd "$2" && pwd)
prefix="$work/prefix"

# Fresh prefix and consumer build each time, so a stale install can never pass the test.
rm -rf "$prefix" "$work/consumer"
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
echo "installed $(grep -c '^-- Installing' "$work/install.log") files into $prefix"

# The public headers and the documentation come with the package.
for f in include/remat/remat.h include/remat/gradcheck.h share/doc/remat/README.md share/doc/remat/design.md \
         share/doc/remat/examples/CMakeLists.txt share/doc/remat/examples/seed_model.cpp \
         share/doc/remat/examples/port_your_model.cpp; do
  [[ -f "$prefix/$f" ]] || { echo "not installed: $prefix/$f" >&2; exit 1; }
done
echo "installed headers, docs and examples: include/remat, share/doc/remat"

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
compiler=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
cmake -S "$here" -B "$work/consumer" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  ${compiler:+-DCMAKE_CXX_COMPILER="$compiler"} -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
grep 'Found remat' "$work/configure.log" || true
cmake --build "$work/consumer" -j 2
"$work/consumer/consumer"

# The installed examples build on their own against the installed package, and run.
rm -rf "$work/examples"
cmake -S "$prefix/share/doc/remat/examples" -B "$work/examples" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  ${compiler:+-DCMAKE_CXX_COMPILER="$compiler"} -DCMAKE_PREFIX_PATH="$prefix" >"$work/examples-configure.log" ||
  { cat "$work/examples-configure.log"; exit 1; }
cmake --build "$work/examples" -j 2
"$work/examples/port_your_model" --depth 4 --steps 5
"$work/examples/seed_model" --steps 4 --blocks 2 --voxels 8 --channels 4 --batch 2
echo "installed examples build and run: $prefix/share/doc/remat/examples"

# The installed command line (when built) must find the installed shared library by itself.
if [[ -x "$prefix/bin/remat" ]]; then
  "$prefix/bin/remat" --help >/dev/null
  "$prefix/bin/remat" --version
  echo "installed command line runs: $prefix/bin/remat --help"
fi
