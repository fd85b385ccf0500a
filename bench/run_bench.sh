#!/usr/bin/env bash
# Runs bench_gemm and bench_elementwise and prints Markdown tables:
#   GEMM: GFLOP/s of remat::matmul and of direct oneDNN / OpenBLAS / BLIS calls, and
#         remat / fastest direct call;
#   elementwise: GB/s (bytes read + written) and op / memcpy (the faster of the two memcpys).
# Each number is the best of REPS repetitions (default 3) of at least MIN_TIME seconds (default
# 0.5), which is the least disturbed by other processes; check `uptime` on a shared machine.
#   bench/run_bench.sh [BUILD_DIR]      (default build; built in Release if needed)
#   bench/run_bench.sh --report DIR...  (tables only: best over earlier runs' JSON in each DIR)
# Each run's JSON is kept in BUILD_DIR/bench/runs/<date-time>/, and it also reports how much
# CPU other processes took meanwhile. On a shared machine, `--report BUILD_DIR/bench/runs/*`
# combines several runs: interference only ever slows a kernel down, so the best repetition
# over all runs is the closest to an undisturbed one. Needs only bash and awk.
# Environment: REPS, MIN_TIME, NO_BUILD=1 (skip rebuilding the two programs), REMAT_JOBS.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
reps=${REPS:-3}
min_time=${MIN_TIME:-0.5}
report_only=0
if [[ "${1:-}" == --report ]]; then
  report_only=1
  shift
  (($#)) || { echo "usage: $0 --report DIR..." >&2; exit 2; }
  result_dirs=("$@")
  build=
else
  build=${1:-build}
  result_dirs=("$build/bench/runs/$(date +%Y%m%d-%H%M%S)")
fi

if ((report_only == 0)); then

if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
if ! grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$build/CMakeCache.txt"; then
  echo "warning: $build is not a Release build" >&2
fi
if [[ -z "${NO_BUILD:-}" ]]; then  # NO_BUILD=1: run the binaries already in BUILD_DIR as they are
  cmake --build "$build" --target bench_gemm bench_elementwise -- -j"${REMAT_JOBS:-2}" >/dev/null
fi

# Busy CPU time of the whole machine, in clock ticks (user nice system irq softirq steal).
machine_busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
ticks=$(getconf CLK_TCK)
ncpu=$(getconf _NPROCESSORS_ONLN)
declare -a other_use=()

run() {  # run NAME: runs build/bench/NAME, JSON to build/bench/NAME.json
  echo "running $1 (${reps} x >= ${min_time}s per benchmark) ..." >&2
  local busy0 busy1 t0 t1 own
  busy0=$(machine_busy)
  t0=$(date +%s.%N)
  own=$( { TIMEFORMAT='%3U %3S'; time "$build/bench/$1" --benchmark_repetitions="$reps" \
           --benchmark_min_time="$min_time" --benchmark_format=json --benchmark_out_format=json \
           --benchmark_out="$build/bench/$1.json" >/dev/null 2>&1; } 2>&1 )
  t1=$(date +%s.%N)
  busy1=$(machine_busy)
  # CPU share used by other processes while this benchmark ran: they make OpenMP kernels wait.
  other_use+=("$(awk -v b="$((busy1 - busy0))" -v hz="$ticks" -v own="$own" -v t0="$t0" -v t1="$t1" -v n="$ncpu" \
    'BEGIN { split(own, o, " "); x = (b / hz - o[1] - o[2]) / ((t1 - t0) * n) * 100; printf "%.0f", (x < 0 ? 0 : x) }')")
  cp "$build/bench/$1.json" "${result_dirs[0]}/"
}
mkdir -p "${result_dirs[0]}"
run bench_gemm
run bench_elementwise
printf 'GEMM %s%%\nelementwise %s%%\n' "${other_use[0]}" "${other_use[1]}" >"${result_dirs[0]}/other-cpu-use.txt"
fi  # report_only

# Reads benchmark JSON (one key per line) and prints "run_name value" for each repetition,
# where value is the given counter, or "ERROR:<message>" for a benchmark that reported one.
extract() {  # extract FILE COUNTER
  awk -v counter="\"$2\":" '
    function val(line) { sub(/^[^:]*: */, "", line); sub(/,$/, "", line); gsub(/"/, "", line); return line }
    /"run_name":/      { run = val($0); sub(/\/real_time$/, "", run) }
    /"run_type":/      { type = val($0) }
    /"error_message":/ { err = val($0) }
    $1 == counter      { if (type == "iteration") print run, val($0) }
    /^    }/           { if (err != "" && type == "iteration") print run, "ERROR:" err; err = ""; type = "" }
  ' "$1"
}

# Best (maximum) value per run_name, in order of first appearance.
best() {
  awk '{ name = $1; v = $2; for (i = 3; i <= NF; ++i) v = v " " $i
         if (!(name in b)) order[++n] = name
         if (v ~ /^ERROR:/) { if (!(name in b)) b[name] = v; next }
         if (!(name in b) || b[name] ~ /^ERROR:/ || v + 0 > b[name] + 0) b[name] = v }
       END { for (i = 1; i <= n; ++i) print order[i] "\t" b[order[i]] }'
}

gemm_files=() elem_files=()
for d in "${result_dirs[@]}"; do
  [[ -f "$d/bench_gemm.json" ]] && gemm_files+=("$d/bench_gemm.json")
  [[ -f "$d/bench_elementwise.json" ]] && elem_files+=("$d/bench_elementwise.json")
done
((${#gemm_files[@]} && ${#elem_files[@]})) || { echo "no bench_gemm.json / bench_elementwise.json in ${result_dirs[*]}" >&2; exit 1; }
gemm=$(for f in "${gemm_files[@]}"; do extract "$f" GFLOPs; done | best)
elem=$(for f in "${elem_files[@]}"; do extract "$f" GBps; done | best)
if ((report_only)); then
  reps="all repetitions of ${#gemm_files[@]} runs"
fi

threads=$(awk -F'"' '/"threads":/ { print $4; exit }' "${gemm_files[0]}")
echo
echo "GEMM, GFLOP/s (best of $reps; ${threads:-?} threads; C[M,N] = A[M,K] @ B[K,N], row-major)"
echo
printf '%s\n' "$gemm" | awk -F'\t' '
  { split($1, p, "/"); dt = p[1]; impl = p[2]; shape = p[3]
    key = dt SUBSEP shape; v[key, impl] = $2; if (!(key in seen)) { seen[key] = 1; keys[++n] = key } }
  function fmt(x) { return (x == "") ? "-" : (x ~ /^ERROR/ ? "error" : sprintf("%.1f", x)) }
  END {
    has_blis = 0; for (k in v) { split(k, q, SUBSEP); if (q[3] == "blis") has_blis = 1 }
    hdr = "| dtype | M x N x K | remat | oneDNN | OpenBLAS |" (has_blis ? " BLIS |" : "") " remat / fastest direct |"
    print hdr
    sep = "|---|---|---:|---:|---:|" (has_blis ? "---:|" : "") "---:|"; print sep
    # stable order: f32 before f64, then by the order the shapes appeared
    for (pass = 1; pass <= 2; ++pass) for (i = 1; i <= n; ++i) {
      split(keys[i], q, SUBSEP); if ((pass == 1) != (q[1] == "f32")) continue
      r = v[keys[i], "remat"]; best = 0
      split("onednn openblas blis", libs, " ")
      for (j = 1; j <= 3; ++j) { x = v[keys[i], libs[j]]; if (x != "" && x !~ /^ERROR/ && x + 0 > best) best = x + 0 }
      ratio = (best > 0 && r != "" && r !~ /^ERROR/) ? sprintf("%.2f", r / best) : "-"
      printf "| %s | %s | %s | %s | %s |%s %s |\n", q[1], q[2], fmt(r), fmt(v[keys[i], "onednn"]),
             fmt(v[keys[i], "openblas"]), (has_blis ? " " fmt(v[keys[i], "blis"]) " |" : ""), ratio
    }
  }'

echo
echo "Elementwise over [4096, 1024] f32, GB/s of bytes read + written (best of $reps)"
echo
printf '%s\n' "$elem" | awk -F'\t' '
  { v[$1] = $2 }
  END {
    m = 0; for (k in v) if (k ~ /^memcpy/ && v[k] !~ /^ERROR/ && v[k] + 0 > m) m = v[k] + 0
    print "| op | GB/s | op / memcpy |"; print "|---|---:|---:|"
    split("memcpy memcpy_threads relu tanh softmax layer_norm", order, " ")
    for (i = 1; i <= 6; ++i) { k = order[i]; if (!(k in v)) continue
      if (v[k] ~ /^ERROR/) { msg = v[k]; sub(/^ERROR:/, "", msg); printf "| %s | n/a (%s) | - |\n", k, msg; continue }
      printf "| %s | %.1f | %s |\n", k, v[k], (m > 0 ? sprintf("%.2f", v[k] / m) : "-") }
  }'

if ((report_only == 0)); then
  echo
  echo "Other processes used ${other_use[0]}% (GEMM) and ${other_use[1]}% (elementwise) of the ${ncpu} CPUs during the runs."
  if ((other_use[0] > 5 || other_use[1] > 5)); then
    echo "WARNING: the machine was not quiet; OpenMP kernels slow down badly when a core is taken."
    echo "Rerun when idle, or combine runs: $0 --report $build/bench/runs/*"
  fi
  echo "JSON: ${result_dirs[0]}"
fi
