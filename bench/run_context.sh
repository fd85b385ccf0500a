#!/usr/bin/env bash
# Context scaling of the default GPT (4 layers, width 128, 4 heads, vocab 114): for T = 64, 256,
# 1024, 4096 with the batch chosen so that a step has max(2048, T) tokens (32, 8, 2, 1 sequences),
# the peak saved bytes and the median step time under save-all, every-layer and
# selective:matmul, with remat's fused attention and, for comparison, attention written out
# (scores, mask, softmax: keeps [B, H, T, T]). Saved bytes per token stay flat with the fused
# attention (linear in T at a fixed batch) and grow with T with the explicit one.
#   bench/run_context.sh [BUILD_DIR]        (default build; needs build/bench/bench_step)
# Prints a Markdown table; the load (uptime) is printed with it. Env: STEPS (default 3), CONTEXTS,
# POLICIES, ATTENTION (default "fused explicit"), THREADS (2).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build}
bin=$build/bench/bench_step
[[ -x $bin ]] || { echo "no $bin: cmake --build $build --target bench_step" >&2; exit 1; }
steps=${STEPS:-3}
contexts=${CONTEXTS:-"64 256 1024 4096"}
policies=${POLICIES:-"save-all every-layer selective:matmul"}
attentions=${ATTENTION:-"fused explicit"}
threads=${THREADS:-2}

echo "load before: $(uptime | sed 's/.*load average: //')"
echo
echo "| T | batch | attention | policy | peak saved bytes | saved bytes / token | median step s | tokens / s |"
echo "|---:|---:|---|---|---:|---:|---:|---:|"
for t in $contexts; do
  tokens=$((t > 2048 ? t : 2048))
  batch=$((tokens / t))
  for att in $attentions; do
    for pol in $policies; do
      line=$("$bin" --layers 4 --width 128 --heads 4 --vocab 114 --seq "$t" --batch "$batch" --policy "$pol" \
             --steps "$steps" --warmup 1 --threads "$threads" --attention "$att" --no-peak --json 2>&1 | tail -1) || true
      if [[ $line != \{* ]]; then
        echo "| $t | $batch | $att | $pol | error: ${line:0:80} | | | |"
        continue
      fi
      echo "$line" | awk -v t="$t" -v b="$batch" -v att="$att" -v pol="$pol" -v tok="$tokens" '
        function field(name,   m) { if (match($0, "\"" name "\": [0-9.e+-]+")) { m = substr($0, RSTART, RLENGTH); sub(/.*: /, "", m); return m + 0 } return -1 }
        { saved = field("peak_saved_bytes"); s = field("step_seconds_median")
          printf "| %d | %d | %s | %s | %d | %.0f | %.4f | %.0f |\n", t, b, att, pol, saved, saved / tok, s, tok / s }'
    done
  done
done
echo
echo "load after: $(uptime | sed 's/.*load average: //')"
