#!/usr/bin/env bash
# bench/run_targets.sh - the speed and memory targets of docs/performance.md, in one
# run, one after the other on the same machine:
#   1. the peer benchmarks, every model (bench/peers/run.sh: remat, PyTorch, JAX; MLP, GPT,
#      gpt-large, nanoGPT shapes), written as bench/results/peers-DATE-targets.{md,svg,json};
#   2. model-FLOPs utilisation (build/bench/bench_step) at the default GPT, nanoGPT's shapes and
#      gpt-large, save-all and every-layer;
#   3. context scaling (bench/run_context.sh);
#   4. the row and elementwise kernels and the AdamW step against two-thread memcpy
#      (build/bench/bench_elementwise, medians of 3).
# Writes bench/results/targets-DATE.md: the commit, the load before each part, and the raw
# output of parts 2 and 3 (part 1 has its own report, whose "Targets" section it points to).
#   bench/run_targets.sh [--skip-peers]
# Takes about 30 minutes on 2 idle cores. Nothing else should run meanwhile (see
# bench/peers/README.md on contention).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
day="$(date -u +%Y-%m-%d)"
out="bench/results/targets-$day.md"
skip_peers=0
[[ "${1:-}" == "--skip-peers" ]] && skip_peers=1

cmake --build build --target remat bench_step bench_elementwise >/dev/null
commit="$(git rev-parse --short HEAD)"
{
  echo "# Performance targets in one run, $day"
  echo
  echo "Produced by \`bench/run_targets.sh\` at $commit ($(nproc) CPUs; started $(date -u +%H:%M) UTC)."
  echo
} >"$out"

if [[ $skip_peers == 0 ]]; then
  echo "== 1. peers ($(uptime))"
  bench/peers/run.sh --tag targets
  {
    echo "## 1. Against PyTorch and JAX"
    echo
    echo "Report: [peers-$day-targets.md](peers-$day-targets.md) (its \"Targets\" section)."
    echo
  } >>"$out"
fi

echo "== 2. MFU ($(uptime))"
{
  echo "## 2. Model-FLOPs utilisation"
  echo
  echo "\`build/bench/bench_step <shape> --policy P --steps 10 --warmup 2 --threads 2\`; load before: $(uptime | sed 's/.*load/load/')"
  echo
  echo '```'
} >>"$out"
for shape in "--layers 4 --width 128 --heads 4 --seq 64 --batch 32 --vocab 114" \
             "--layers 4 --width 128 --heads 4 --seq 64 --batch 12 --vocab 65" \
             "--layers 8 --width 256 --heads 8 --seq 256 --batch 20 --vocab 114"; do
  for policy in save-all every-layer; do
    echo "== $shape $policy" | tee -a "$out"
    # shellcheck disable=SC2086
    build/bench/bench_step $shape --policy "$policy" --steps 10 --warmup 2 --threads 2 | tee -a "$out"
  done
done
echo '```' >>"$out"

echo "== 3. context ($(uptime))"
{
  echo
  echo "## 3. Context scaling"
  echo
  echo "\`STEPS=3 bench/run_context.sh build\`"
  echo
} >>"$out"
STEPS=3 bench/run_context.sh build | tee -a "$out"

echo "== 4. row kernels ($(uptime))"
{
  echo
  echo "## 4. Row kernels against memcpy"
  echo
  echo "\`build/bench/bench_elementwise --benchmark_repetitions=3 --benchmark_report_aggregates_only=true\`; load before: $(uptime | sed 's/.*load/load/')"
  echo
  echo '```'
} >>"$out"
build/bench/bench_elementwise --benchmark_repetitions=3 --benchmark_report_aggregates_only=true 2>&1 |
  grep -E '_median|^Run on|CPU' | tee -a "$out"
echo '```' >>"$out"
echo "bench/run_targets.sh: wrote $out"
