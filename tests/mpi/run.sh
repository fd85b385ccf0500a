#!/usr/bin/env bash
# Data-parallel `remat train` under mpirun on this machine (loopback only), against single-process
# runs. Usage: tests/mpi/run.sh REMAT_BINARY TEST, TEST one of:
#   bitwise POLICY   mpirun -np 2 train == one process with --accumulate 2 (grad_digest, losses,
#                    saved weights byte for byte), and != one process with --accumulate 1
#   ordered3         mpirun -np 3 (ordered sum) == one process with --accumulate 3
#   buckets          the all-reduce in small buckets overlapped with the backward (many buckets,
#                    ordered and native, save-all and every-layer, 2 and 3 ranks) == after the
#                    backward (--bucket-bytes 0) == one process accumulating the same micro-batches
#   mismatch         ranks with different weight files (same and different architecture), or
#                    different options, all end with an error naming the difference, in bounded time
#   zero             --shard-optimizer (ZeRO-1) saves the weights of plain data parallelism, each
#                    rank holding about half the AdamW state (allocator counters)
#   dead-rank        a rank killed during training ends the job in bounded time; a weight file
#                    saved before is left as it was
#   state            training states under mpirun (plain and --shard-optimizer): the job killed
#                    (SIGKILL to every process) or stopped (SIGTERM to mpirun, which passes it on)
#                    after a step resumes to the bits of the job never stopped; a number of ranks
#                    that cannot share the global batch is refused
#   invariant        -np 1 --accumulate 4, -np 2 --accumulate 2, -np 4: one weights_digest, with and
#                    without --shard-optimizer and buckets; -np 2 --accumulate 3 == -np 3
#                    --accumulate 2 == -np 1 --accumulate 6 (ranks holding several blocks)
#   resize           a state written at -np 2 --accumulate 2 (plain and --shard-optimizer) resumed
#                    at -np 1 and -np 4: the digest of the run never stopped; -np 3 refused
# Exit 0 on success; the failing check is printed otherwise.
set -uo pipefail

remat=$1
test=$2
limit=${REMAT_MPI_TEST_SECONDS:-120}  # every mpirun must end within this
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# loopback only, no shared-memory or InfiniBand probing, processes may share cores
mpi=(mpirun --oversubscribe --bind-to none --mca btl self,tcp --mca btl_tcp_if_include lo
     --mca oob_tcp_if_include lo --mca pml ob1)

dir=$(mktemp -d "${TMPDIR:-/tmp}/remat-mpi-test.XXXXXX")
[[ -n "${REMAT_MPI_TEST_KEEP:-}" ]] || trap 'rm -rf "$dir"' EXIT
for i in $(seq 200); do printf 'the quick brown fox %d jumps over the lazy dog\n%%\n' "$i"; done >"$dir/corpus.txt"
model=(--threads 1 --data "$dir/corpus.txt" --layers 2 --width 16 --heads 2 --seq 16 --batch 4 --quiet --json)

fail() {
  echo "FAIL ($test): $*"
  exit 1
}
field() {  # field NAME FILE: the value of "NAME" in the JSON line of FILE
  grep -o "\"$1\":[^,}]*" "$2" | tail -1 | cut -d: -f2-
}
# run NAME CMD...: runs CMD with the time limit, output in $dir/NAME.out, exit code in $rc
run() {
  local name=$1
  shift
  local start=$SECONDS
  timeout "$limit" "$@" >"$dir/$name.out" 2>&1
  rc=$?
  echo "-- $name: exit $rc in $((SECONDS - start)) s: $*"
  ((rc == 124)) && { cat "$dir/$name.out"; fail "$name did not end within $limit s"; }
  return 0
}
expect_ok() {
  ((rc == 0)) || { cat "$dir/$1.out"; fail "$1 exited with $rc"; }
}
expect_error() {  # expect_error NAME FRAGMENT
  ((rc != 0)) || { cat "$dir/$1.out"; fail "$1 succeeded but should have failed"; }
  grep -qF -- "$2" "$dir/$1.out" || { cat "$dir/$1.out"; fail "$1: no \"$2\" in its output"; }
}

# same NAME_A NAME_B: the runs agree on the gradient digest, the losses and their saved weights
same() {
  local f
  for f in grad_digest first_loss final_loss val_loss; do
    [[ -n "$(field $f "$dir/$1.out")" && "$(field $f "$dir/$1.out")" == "$(field $f "$dir/$2.out")" ]] ||
      fail "$f differs: $1 $(field $f "$dir/$1.out"), $2 $(field $f "$dir/$2.out")"
  done
  cmp "$dir/$1.safetensors" "$dir/$2.safetensors" || fail "the weights saved by $1 and $2 differ"
  echo "   $1 == $2: grad_digest $(field grad_digest "$dir/$1.out"), final_loss $(field final_loss "$dir/$1.out")"
}

case $test in
  bitwise)
    policy=$3
    run single1 "$remat" train "${model[@]}" --steps 2 --policy "$policy" --save "$dir/single1.safetensors"
    expect_ok single1
    run single2 "$remat" train "${model[@]}" --steps 2 --policy "$policy" --accumulate 2 --save "$dir/single2.safetensors"
    expect_ok single2
    run mpi2 "${mpi[@]}" -np 2 "$remat" train "${model[@]}" --steps 2 --policy "$policy" --save "$dir/mpi2.safetensors"
    expect_ok mpi2
    [[ "$(field world_size "$dir/mpi2.out")" == 2 && "$(field global_batch "$dir/mpi2.out")" == 8 ]] ||
      fail "mpi2 does not report 2 ranks and a global batch of 8"
    same single2 mpi2
    [[ "$(field grad_digest "$dir/single1.out")" != "$(field grad_digest "$dir/single2.out")" ]] ||
      fail "--accumulate 2 has the digest of --accumulate 1: the second micro-batch did not count"
    # the other policy on the ranks than in the single process: checkpointing changes nothing
    other=save-all
    [[ "$policy" == save-all ]] && other=every-layer
    run mpi2other "${mpi[@]}" -np 2 "$remat" train "${model[@]}" --steps 2 --policy "$other" --save "$dir/mpi2other.safetensors"
    expect_ok mpi2other
    same single2 mpi2other
    ;;
  ordered3)
    run single3 "$remat" train "${model[@]}" --steps 2 --accumulate 3 --save "$dir/single3.safetensors"
    expect_ok single3
    run mpi3 "${mpi[@]}" -np 3 "$remat" train "${model[@]}" --steps 2 --reduce ordered --save "$dir/mpi3.safetensors"
    expect_ok mpi3
    same single3 mpi3
    # two ranks that each accumulate 2 run the 4 micro-batches of one process with --accumulate 4:
    # the same bits (the micro-batch tree; the invariant test covers more splits)
    run mpi2x2 "${mpi[@]}" -np 2 "$remat" train "${model[@]}" --steps 1 --accumulate 2 --save "$dir/mpi2x2.safetensors"
    expect_ok mpi2x2
    run single4 "$remat" train "${model[@]}" --steps 1 --accumulate 4 --save "$dir/single4.safetensors"
    expect_ok single4
    same single4 mpi2x2
    ;;
  buckets)
    # the tiny model's ~10 kB of parameters in 1 KiB buckets: most are started by the backward
    run single2 "$remat" train "${model[@]}" --steps 2 --accumulate 2 --save "$dir/single2.safetensors"
    expect_ok single2
    for policy in save-all every-layer; do
      for reduce in ordered native; do
        name=b1k-$policy-$reduce
        run "$name" "${mpi[@]}" -np 2 "$remat" train "${model[@]}" --steps 2 --policy "$policy" --reduce "$reduce" \
          --bucket-bytes 1KiB --save "$dir/$name.safetensors"
        expect_ok "$name"
        same single2 "$name"
        b=$(field buckets "$dir/$name.out")
        ((b > 4)) || fail "$name: $b buckets, expected more than 4 buckets of 1 KiB"
        grep -q '"communication_hidden_seconds":' "$dir/$name.out" || fail "$name: no communication_hidden_seconds"
      done
    done
    run after "${mpi[@]}" -np 2 "$remat" train "${model[@]}" --steps 2 --bucket-bytes 0 --save "$dir/after.safetensors"
    expect_ok after
    same single2 after
    [[ "$(field buckets "$dir/after.out")" == 0 ]] || fail "--bucket-bytes 0 still used buckets"
    # three ranks, ordered, in buckets == one process accumulating 3
    run single3 "$remat" train "${model[@]}" --steps 2 --accumulate 3 --save "$dir/single3.safetensors"
    expect_ok single3
    run mpi3 "${mpi[@]}" -np 3 "$remat" train "${model[@]}" --steps 2 --bucket-bytes 2KiB --save "$dir/mpi3.safetensors"
    expect_ok mpi3
    same single3 mpi3
    # accumulation on the ranks: only the last micro-batch reduces, with the earlier ones added first
    run mpiacc "${mpi[@]}" -np 2 "$remat" train "${model[@]}" --steps 2 --accumulate 2 --bucket-bytes 1KiB \
      --save "$dir/mpiacc.safetensors"
    expect_ok mpiacc
    run mpiacc0 "${mpi[@]}" -np 2 "$remat" train "${model[@]}" --steps 2 --accumulate 2 --bucket-bytes 0 \
      --save "$dir/mpiacc0.safetensors"
    expect_ok mpiacc0
    same mpiacc0 mpiacc
    run badbucket "${mpi[@]}" -np 2 "$remat" train "${model[@]}" --steps 1 --bucket-bytes 12parsecs
    expect_error badbucket "--bucket-bytes"
    ;;
  zero)
    # ZeRO-1: each rank keeps the AdamW state of half the parameters; the result is plain DP's
    run plain "${mpi[@]}" -np 2 "$remat" train "${model[@]}" --steps 3 --save "$dir/plain.safetensors"
    expect_ok plain
    run sharded "${mpi[@]}" -np 2 "$remat" train "${model[@]}" --steps 3 --shard-optimizer --save "$dir/sharded.safetensors"
    expect_ok sharded
    [[ "$(field shard_optimizer "$dir/sharded.out")" == true ]] || fail "the sharded run does not report sharding"
    same plain sharded
    total=$(field optimizer_state_bytes "$dir/plain.out")
    ranks=$(grep -o '"rank_optimizer_state_bytes":\[[^]]*\]' "$dir/sharded.out" | tail -1 | sed 's/.*\[//; s/\]//')
    plain_ranks=$(grep -o '"rank_optimizer_state_bytes":\[[^]]*\]' "$dir/plain.out" | tail -1 | sed 's/.*\[//; s/\]//')
    IFS=, read -r r0 r1 <<<"$ranks"
    IFS=, read -r p0 p1 <<<"$plain_ranks"
    echo "   optimizer state bytes: plain $p0 / $p1 per rank, sharded $r0 / $r1 per rank"
    r0=${r0%.*} r1=${r1%.*} p0=${p0%.*} p1=${p1%.*}
    ((total > 0 && p0 == total && p1 == total)) || fail "plain DP: every rank should hold all $total bytes of state"
    ((r0 + r1 == total)) || fail "the shards ($r0 + $r1) do not add up to the whole state ($total)"
    # about half each: within the largest parameter's state (the embedding or the head) of total/2
    ((r0 > 0 && r1 > 0 && 10 * r0 <= 7 * total && 10 * r1 <= 7 * total)) ||
      fail "a shard holds more than 70% of the state ($r0, $r1 of $total)"
    ;;
  mismatch)
    run wa "$remat" train "${model[@]}" --steps 1 --save "$dir/a.safetensors"
    expect_ok wa
    run wb "$remat" train "${model[@]}" --steps 1 --seed 2 --save "$dir/b.safetensors"
    expect_ok wb
    run wc "$remat" train --threads 1 --data "$dir/corpus.txt" --layers 2 --width 32 --heads 2 --seq 16 --batch 4 \
      --quiet --steps 1 --save "$dir/c.safetensors"
    expect_ok wc
    cat >"$dir/per-rank.sh" <<SCRIPT
#!/usr/bin/env bash
# rank 0 loads \$1, the others \$2; the rest are the train options
a=\$1 b=\$2
shift 2
if [[ "\$OMPI_COMM_WORLD_RANK" == 0 ]]; then w=\$a; else w=\$b; fi
exec "$remat" train --threads 1 --data "$dir/corpus.txt" --batch 4 --quiet --json --load "\$w" "\$@"
SCRIPT
    chmod +x "$dir/per-rank.sh"
    run same_file "${mpi[@]}" -np 2 "$dir/per-rank.sh" "$dir/a.safetensors" "$dir/a.safetensors" --steps 1
    expect_ok same_file
    run other_weights "${mpi[@]}" -np 2 "$dir/per-rank.sh" "$dir/a.safetensors" "$dir/b.safetensors" --steps 1
    expect_error other_weights "rank 1 of 2 has a different set of weights from rank 0"
    run other_model "${mpi[@]}" -np 2 "$dir/per-rank.sh" "$dir/a.safetensors" "$dir/c.safetensors" --steps 1
    expect_error other_model "rank 1 of 2 has a different model (parameter names, shapes or dtypes) from rank 0"
    cat >"$dir/per-rank-steps.sh" <<SCRIPT
#!/usr/bin/env bash
steps=3
[[ "\$OMPI_COMM_WORLD_RANK" == 1 ]] && steps=4
exec "$remat" train --threads 1 --data "$dir/corpus.txt" --layers 1 --width 8 --heads 2 --seq 8 --batch 2 --quiet \
  --steps \$steps
SCRIPT
    chmod +x "$dir/per-rank-steps.sh"
    run other_steps "${mpi[@]}" -np 2 "$dir/per-rank-steps.sh"
    expect_error other_steps "rank 1 of 2 has a different set of training options"
    ;;
  dead-rank)
    run before "$remat" train "${model[@]}" --steps 1 --save "$dir/w.safetensors"
    expect_ok before
    cp "$dir/w.safetensors" "$dir/w.before"
    # rank 1 is killed (SIGKILL) two seconds into a run far longer than the limit
    cat >"$dir/dies.sh" <<SCRIPT
#!/usr/bin/env bash
if [[ "\$OMPI_COMM_WORLD_RANK" == 1 ]]; then (sleep 2; kill -9 \$\$) & fi
exec "$remat" train --threads 1 --data "$dir/corpus.txt" --layers 2 --width 16 --heads 2 --seq 16 --batch 4 --quiet \
  --steps 100000000 --save "$dir/w.safetensors"
SCRIPT
    chmod +x "$dir/dies.sh"
    run dies "${mpi[@]}" -np 2 "$dir/dies.sh"
    ((rc != 0)) || fail "the job succeeded although rank 1 was killed"
    grep -qiE "signal 9|killed" "$dir/dies.out" || { cat "$dir/dies.out"; fail "no message about the killed rank"; }
    grep -iE "signal 9|killed" "$dir/dies.out" | head -2
    cmp "$dir/w.safetensors" "$dir/w.before" || fail "the weight file saved before the run was changed"
    ;;
  state)
    # stop_job NAME SIGNAL WHO STEP CMD...: CMD in a session of its own; after its JSON shows step
    # STEP, SIGNAL goes to every process of the session (WHO=group: a crash of every node) or to
    # every rank (WHO=ranks: what a scheduler does to stop a job, e.g. SLURM's scancel; mpirun
    # itself passes a SIGTERM on only after a delay, so the job may end first)
    stop_job() {
      local name=$1 signal=$2 who=$3 step=$4
      shift 4
      # emptied before the start: the job truncates it only once it runs, and a poll that read an
      # earlier job's lines would signal before the session (or its ranks) exist
      : >"$dir/$name.out"
      setsid "$@" >"$dir/$name.out" 2>&1 &
      local pid=$! start=$SECONDS
      while kill -0 "$pid" 2>/dev/null && ! grep -q "\"step\":$step,\"train_loss\"" "$dir/$name.out"; do
        ((SECONDS - start > limit)) && { kill -KILL $(pgrep -s "$pid"); fail "$name: step $step never came"; }
        sleep 0.005
      done
      # every process of the job's session (mpirun gives the ranks process groups of their own)
      case $who in
        group) kill "-$signal" $(pgrep -s "$pid") 2>/dev/null ;;
        ranks) kill "-$signal" $(pgrep -s "$pid" | grep -vx "$pid") ;;  # all but mpirun
      esac
      wait "$pid"
      rc=$?
      # every rank gone (mpirun may end before the ranks it signalled)
      while [[ -n "$(pgrep -s "$pid")" ]]; do
        ((SECONDS - start > limit)) && fail "$name: ranks still running after $limit s"
        sleep 0.05
      done
      echo "-- $name: $signal to the $who after step $step: exit $rc; $(grep -o 'stopped by [A-Z]* after step [0-9]*' "$dir/$name.out" | head -1)"
    }
    resumed_same() {  # resumed_same NAME: the resumed job ends as the job never stopped
      local f
      for f in weights_digest final_loss first_loss grad_digest; do
        [[ -n "$(field $f "$dir/$1.out")" && "$(field $f "$dir/$1.out")" == "$(field $f "$dir/straight$2.out")" ]] ||
          fail "$1: $f $(field $f "$dir/$1.out"), the job never stopped: $(field $f "$dir/straight$2.out")"
      done
      echo "   $1: resumed from step $(field resumed_from_step "$dir/$1.out"), weights_digest $(field weights_digest "$dir/$1.out") as never stopped"
    }
    for shard in "" --shard-optimizer; do
      run "straight$shard" "${mpi[@]}" -np 2 "$remat" train "${model[@]}" --steps 60 $shard
      expect_ok "straight$shard"
      for how in "KILL group" "TERM ranks"; do
        states=$dir/states-${how% *}$shard
        stop_job "stopped$shard" ${how% *} ${how#* } 12 "${mpi[@]}" -np 2 "$remat" train "${model[@]}" --steps 60 \
          --eval-every 1 --state-dir "$states" --state-every 5 $shard
        [[ $how == TERM* ]] && ! grep -q "stopped by SIGTERM after step" "$dir/stopped$shard.out" &&
          { cat "$dir/stopped$shard.out"; fail "the job did not stop on SIGTERM"; }
        run "resumed-${how% *}$shard" "${mpi[@]}" -np 2 "$remat" train --resume "$states" --json --quiet
        ((rc == 0)) || { cat "$dir/stopped$shard.out" "$dir/resumed-${how% *}$shard.out"; fail "the resumed job exited with $rc"; }
        resumed_same "resumed-${how% *}$shard" "$shard"
      done
      compgen -G "$states/step-*/optimizer-shard-1-of-2.safetensors" >/dev/null || [[ -z "$shard" ]] ||
        fail "no optimizer shard of rank 1 in the state"
    done
    run three_ranks "${mpi[@]}" -np 3 "$remat" train --resume "$dir/states-KILL--shard-optimizer" --json
    expect_error three_ranks "which 3 ranks cannot share evenly; resume with a number of ranks that divides 2"
    ;;
  invariant)
    # weights_digest of each split of 4 (and of 6) micro-batches a step
    digest_of() {  # digest_of NAME NP ACCUMULATE [OPTIONS...]
      local name=$1 np=$2 acc=$3
      shift 3
      if ((np == 1)); then
        run "$name" "$remat" train "${model[@]}" --steps 3 --accumulate "$acc" "$@"
      else
        run "$name" "${mpi[@]}" -np "$np" "$remat" train "${model[@]}" --steps 3 --accumulate "$acc" "$@"
      fi
      expect_ok "$name"
      echo "   $name: weights_digest $(field weights_digest "$dir/$name.out"), grad_digest $(field grad_digest "$dir/$name.out"), final_loss $(field final_loss "$dir/$name.out")"
    }
    digest_of w1a4 1 4
    for split in "2 2" "4 1" "2 2 --shard-optimizer" "4 1 --shard-optimizer" "2 2 --bucket-bytes 1KiB" "4 1 --bucket-bytes 0"; do
      set -- $split
      name=w$1a$2${3:+${3//-/}}
      digest_of "$name" "$@"
      for f in weights_digest grad_digest final_loss first_loss; do
        [[ "$(field $f "$dir/$name.out")" == "$(field $f "$dir/w1a4.out")" ]] ||
          fail "$name: $f $(field $f "$dir/$name.out"), -np 1 --accumulate 4: $(field $f "$dir/w1a4.out")"
      done
    done
    digest_of w1a6 1 6
    for split in "2 3" "3 2" "2 3 --bucket-bytes 1KiB" "3 2 --shard-optimizer"; do
      set -- $split
      name=w$1a$2${3:+${3//-/}}
      digest_of "$name" "$@"
      [[ "$(field weights_digest "$dir/$name.out")" == "$(field weights_digest "$dir/w1a6.out")" ]] ||
        fail "$name: weights_digest differs from -np 1 --accumulate 6"
    done
    # control: another order of the same micro-batches (native, 4 ranks: MPI's order) may differ,
    # and a different global batch must
    digest_of w1a2 1 2
    [[ "$(field weights_digest "$dir/w1a2.out")" != "$(field weights_digest "$dir/w1a4.out")" ]] ||
      fail "--accumulate 2 gives the digest of 4: the micro-batches did not count"
    ;;
  resize)
    for shard in "" --shard-optimizer; do
      # 2 ranks x --accumulate 2: a global batch of 4 micro-batches, which 1, 2 and 4 ranks share
      run "straight$shard" "${mpi[@]}" -np 2 "$remat" train "${model[@]}" --steps 16 --accumulate 2 $shard
      expect_ok "straight$shard"
      # a state of step 8 written by 2 ranks (the one of step 16 set aside)
      states=$dir/resize$shard
      run "first$shard" "${mpi[@]}" -np 2 "$remat" train "${model[@]}" --steps 16 --accumulate 2 --state-dir "$states" \
        --state-every 8 $shard
      expect_ok "first$shard"
      rm -rf "$states/step-00000016"
      for np in 1 4; do
        rm -rf "$states-$np" && cp -r "$states" "$states-$np"
        if ((np == 1)); then
          run "resumed$np$shard" "$remat" train --resume "$states-$np" --json --quiet
        else
          run "resumed$np$shard" "${mpi[@]}" -np "$np" "$remat" train --resume "$states-$np" --json --quiet $shard
        fi
        expect_ok "resumed$np$shard"
        [[ "$(field resumed_from_step "$dir/resumed$np$shard.out")" == 8 ]] || fail "resumed$np$shard did not resume at step 8"
        for f in weights_digest final_loss grad_digest; do
          [[ "$(field $f "$dir/resumed$np$shard.out")" == "$(field $f "$dir/straight$shard.out")" ]] ||
            fail "resumed$np$shard: $f $(field $f "$dir/resumed$np$shard.out"), the job never stopped: $(field $f "$dir/straight$shard.out")"
        done
        echo "   written at -np 2${shard:+ $shard}, resumed at -np $np: weights_digest $(field weights_digest "$dir/resumed$np$shard.out") as never stopped"
      done
    done
    run three "${mpi[@]}" -np 3 "$remat" train --resume "$states" --json
    expect_error three "which 3 ranks cannot share evenly"
    ;;
  *)
    fail "unknown test"
    ;;
esac
echo "PASS ($test)"
