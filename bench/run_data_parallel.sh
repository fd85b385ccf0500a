#!/usr/bin/env bash
# Data parallelism on this machine: the default `remat train` GPT at one global batch, run as
#   A. 1 process x 2 threads, --batch 2B            (one big batch)
#   B. 1 process x 2 threads, --batch B --accumulate 2
#   C. 2 processes x 1 thread (mpirun), --batch B    (data parallel, ordered gradient sum in
#      buckets of 1 MiB overlapped with the backward, the default), and C0 (--bucket-bytes 0:
#      the sum after the backward), C256 (256 KiB buckets), C4M (4 MiB buckets)
#   D. as C with --shard-optimizer (ZeRO-1)
# and prints, per run: median step seconds, tokens/s, communication seconds per step and the
# share of it hidden behind the backward (in flight while the backward still ran), peak total
# bytes per rank and optimizer-state bytes per rank.
# Usage: bench/run_data_parallel.sh [BUILD_DIR] [STEPS] [B]   (defaults: build 30 32)
# Timing figures are only comparable side by side in one run; the load is printed.
set -euo pipefail
build=${1:-build}
steps=${2:-30}
b=${3:-32}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun --oversubscribe --bind-to none --mca btl self,tcp --mca btl_tcp_if_include lo
     --mca oob_tcp_if_include lo --mca pml ob1 -np 2)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
field() { grep -o "\"$1\":[^,}]*" "$2" | tail -1 | cut -d: -f2-; }
array() { grep -o "\"$1\":\[[^]]*\]" "$2" | tail -1 | sed 's/.*\[//; s/\]//'; }

echo "load before: $(uptime)"
common=(train --quiet --json --steps "$steps")
"$build/remat" "${common[@]}" --threads 2 --batch $((2 * b)) >"$out/A"
"$build/remat" "${common[@]}" --threads 2 --batch "$b" --accumulate 2 >"$out/B"
"${mpi[@]}" "$build/remat" "${common[@]}" --threads 1 --batch "$b" >"$out/C"
"${mpi[@]}" "$build/remat" "${common[@]}" --threads 1 --batch "$b" --bucket-bytes 0 >"$out/C0"
"${mpi[@]}" "$build/remat" "${common[@]}" --threads 1 --batch "$b" --bucket-bytes 256KiB >"$out/C256"
"${mpi[@]}" "$build/remat" "${common[@]}" --threads 1 --batch "$b" --bucket-bytes 4MiB >"$out/C4M"
"${mpi[@]}" "$build/remat" "${common[@]}" --threads 1 --batch "$b" --shard-optimizer >"$out/D"
echo "load after:  $(uptime)"
printf '%-50s %10s %10s %12s %8s %8s %24s %22s\n' run "step s" "tok/s" "comm s/step" buckets hidden \
  "peak total B/rank" "optimizer B/rank"
for r in A B C C0 C256 C4M D; do
  case $r in
    A) name="A 1 proc x 2 threads, batch $((2 * b))" ;;
    B) name="B 1 proc x 2 threads, batch $b x accumulate 2" ;;
    C) name="C 2 procs x 1 thread, batch $b (1 MiB buckets)" ;;
    C0) name="C0 as C, --bucket-bytes 0 (after the backward)" ;;
    C256) name="C256 as C, 256 KiB buckets" ;;
    C4M) name="C4M as C, 4 MiB buckets" ;;
    D) name="D as C, --shard-optimizer" ;;
  esac
  comm=$(field communication_seconds "$out/$r")
  hidden=$(field communication_hidden_seconds "$out/$r")
  printf '%-50s %10.4f %10.0f %12.5f %8s %8s %24s %22s\n' "$name" "$(field step_seconds_median "$out/$r")" \
    "$(field tokens_per_second "$out/$r")" "$(awk -v c="$comm" -v s="$steps" 'BEGIN { print c / s }')" \
    "$(field buckets "$out/$r")" "$(awk -v c="$comm" -v h="${hidden:-0}" 'BEGIN { if (c > 0) printf "%.0f%%", 100 * h / c; else print "-" }')" \
    "$(array rank_peak_total_bytes "$out/$r")" "$(array rank_optimizer_state_bytes "$out/$r")"
done
