#!/usr/bin/env bash
# Fault injection for `remat train`'s training states: runs stopped at random points resume to the
# bits of the run never stopped; damaged states are refused; failed writes keep the previous state.
# Usage: tests/state/run.sh REMAT_BINARY TEST [ARGS], TEST one of:
#   kill POLICY [OPTIONS...]  a run killed (SIGKILL) at random steps and in the middle of state writes,
#                             and stopped by SIGTERM and SIGINT, several seeds, each resumed (and
#                             resumed again after a second kill): the same weights_digest, losses
#                             and gradient digest as the run never stopped, under POLICY with OPTIONS
#   corrupt                   one flipped byte in a tensor, a header or state.json: refused naming
#                             the tensor or the file, exit 1, nothing trained or written
#   faults                    a disk that fills up (injected, and a real tmpfs where one can be
#                             mounted) during a state write, during --save and under offload:, an
#                             unwritable --state-dir or --save: clear errors, the previous state intact
#   options                   --resume's options: disagreeing ones refused, --policy free; a finished
#                             run; --eval-only conversion
#   signals RUNS [SHIM [EVERY]]  RUNS runs sent SIGINT or SIGTERM at random times during the
#                             steps' compute (no pause hook; a model whose products take oneDNN's
#                             heap path; REMAT_FAULT_STEPS steps, default 150, signalled up to
#                             REMAT_FAULT_SPREAD_MS, default 400, after the first), and during a state
#                             write: each writes its state and exits 130 or 143, none crashes, each
#                             resume ends with the uninterrupted weights_digest; with SHIM
#                             (tests/state/sigprof_shim.cpp) preloaded into every EVERY-th run
#                             (default 2), the same under a profiler's 1 kHz SIGPROF timer
#   trap                      a --state-dir that cannot trap: an incomplete step directory, a second
#                             run on a locked directory (and a lock left by a killed run), states
#                             newer than the one resumed, no room for a state or for --save on a
#                             small tmpfs (where one can be mounted): each a clear message before
#                             step 1; room for two states is enough; a --save that fails at the end
#                             says how to keep the weights
#   extend                    --resume D --steps N: a run stopped within its warm-up extended to the
#                             bits of a run started with N steps; a finished run extended; a
#                             smaller N refused; another --data on resume named as such
# Exit 0 on success; the failing check is printed otherwise.
set -uo pipefail

remat=$1
test=$2
shift 2
# seconds for any one run: it catches a hang; a 150-step run on a machine busy with builds has taken
# over 120 s, so the default leaves room (REMAT_STATE_TEST_SECONDS sets it)
limit=${REMAT_STATE_TEST_SECONDS:-300}
dir=$(mktemp -d "${TMPDIR:-/tmp}/remat-state-test.XXXXXX")
mounted=""
cleanup() {
  [[ -n "$mounted" ]] && umount "$mounted" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
for i in $(seq 200); do printf 'the quick brown fox %d jumps over the lazy dog\n%%\n' "$i"; done >"$dir/corpus.txt"
model=(--threads 1 --data "$dir/corpus.txt" --layers 2 --width 16 --heads 2 --seq 16 --batch 4 --quiet --json)
steps=24

fail() {
  echo "FAIL ($test): $*"
  exit 1
}
field() {  # field NAME FILE: the value of "NAME" in the last JSON line of FILE that has it
  grep -o "\"$1\":[^,}]*" "$2" | tail -1 | cut -d: -f2-
}
# run NAME CMD...: runs CMD with the time limit; output in $dir/NAME.out (stdout) and .err; $rc
run() {
  local name=$1
  shift
  timeout "$limit" "$@" >"$dir/$name.out" 2>"$dir/$name.err"
  rc=$?
  ((rc == 124)) && { cat "$dir/$name.err"; fail "$name did not end within $limit s"; }
  return 0
}
expect_rc() {  # expect_rc NAME CODE
  ((rc == $2)) || { cat "$dir/$1.out" "$dir/$1.err"; fail "$1 exited with $rc, expected $2"; }
}
expect_text() {  # expect_text NAME FRAGMENT: in stdout or stderr
  grep -qF -- "$2" "$dir/$1.out" "$dir/$1.err" || { cat "$dir/$1.out" "$dir/$1.err"; fail "$1: no \"$2\" in its output"; }
}
# same A B: the runs end with the same weights, losses and gradient digest
same() {
  local f
  for f in weights_digest first_loss final_loss val_loss grad_digest; do
    [[ -n "$(field $f "$dir/$1.out")" && "$(field $f "$dir/$1.out")" == "$(field $f "$dir/$2.out")" ]] ||
      fail "$f differs: $1 $(field $f "$dir/$1.out"), $2 $(field $f "$dir/$2.out")"
  done
}
# writing_in DIR: a state is being written in DIR: a partial directory holding a tensor file and no
# manifest yet (a pruned state is renamed to a .partial directory before its removal too, but it
# has its manifest: a kill then would land in a removal that ends in a moment, not in a write)
writing_in() {
  local p
  for p in "$1"/step-*.partial; do
    [[ -d $p && ! -e $p/state.json ]] && compgen -G "$p/*.safetensors" >/dev/null && return 0
  done
  return 1
}
# stop_at NAME SIGNAL WHEN CMD...: runs CMD in the background and sends SIGNAL once WHEN holds:
# "step N" (its JSON shows step N's evaluation) or "writing DIR" (a state is being written in DIR,
# where an earlier one is complete)
stop_at() {
  local name=$1 signal=$2 when=$3
  shift 3
  # "step N": the run holds after step N until the signal comes (REMAT_TEST_PAUSE_AFTER_STEP)
  local pause=()
  [[ $when == step* ]] && pause=(env "REMAT_TEST_PAUSE_AFTER_STEP=${when#step }")
  # emptied here, before the start: the background job truncates them only once it runs, and a
  # poll that read an earlier seed's lines would signal a process that has not yet installed its
  # handler (a background job starts with SIGINT ignored, so that signal would be lost)
  : >"$dir/$name.out"
  : >"$dir/$name.err"
  "${pause[@]}" "$@" >"$dir/$name.out" 2>"$dir/$name.err" &
  local pid=$! start=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    if [[ $when == step* ]] && grep -q "\"step\":${when#step },\"train_loss\"" "$dir/$name.out" 2>/dev/null; then break; fi
    if [[ $when == writing* ]] && writing_in "${when#writing }" &&
      compgen -G "${when#writing }/step-*[0-9]/state.json" >/dev/null; then break; fi
    ((SECONDS - start > limit)) && { kill -KILL "$pid"; fail "$name: \"$when\" never came"; }
    sleep 0.005
  done
  kill "-$signal" "$pid" 2>/dev/null
  wait "$pid"
  rc=$?
  # a killed process leaves LLVM OpenMP's registration of its pid in /dev/shm (its exit removes it)
  rm -f "/dev/shm/__KMP_REGISTERED_LIB_${pid}_$(id -u)"
}

case $test in
  kill)
    policy=${1//@DIR@/$dir}  # @DIR@: this test's scratch directory (for offload:)
    shift
    options=("$@")
    run straight "$remat" train "${model[@]}" --steps $steps --policy "$policy" "${options[@]}"
    expect_rc straight 0
    echo "   straight: weights_digest $(field weights_digest "$dir/straight.out"), final_loss $(field final_loss "$dir/straight.out")"
    for seed in 1 2 3 4; do
      RANDOM=$seed
      states=$dir/states-$seed
      every=$((1 + RANDOM % 5))
      kill_step=$((every + RANDOM % (steps - every - 3)))  # after the first state
      common=("$remat" train "${model[@]}" --steps $steps --policy "$policy" "${options[@]}" --eval-every 1
              --state-dir "$states" --state-every $every)
      case $seed in
        1 | 2) # SIGKILL after a random step, then again in the resumed run
          stop_at first KILL "step $kill_step" "${common[@]}"
          ((rc == 137)) || fail "seed $seed: the killed run exited with $rc"
          stop_at second KILL "step $((kill_step + 1 + RANDOM % (steps - kill_step - 1)))" \
            "$remat" train --resume "$states" --json --quiet --eval-every 1
          how="SIGKILL after step $kill_step, and again in the resumed run" ;;
        3) # SIGKILL in the middle of a state write (slowed down so that the kill lands in it)
          stop_at first KILL "writing $states" env REMAT_TEST_WRITE_DELAY_MS=150 "${common[@]}"
          ((rc == 137)) || fail "seed $seed: the killed run exited with $rc"
          compgen -G "$states/step-*.partial" >/dev/null || fail "seed $seed: the kill did not land in a state write"
          how="SIGKILL during the write of $(basename "$(compgen -G "$states/step-*.partial")")" ;;
        4) # SIGTERM, then SIGINT in the resumed run: the step finishes, the state is written
          kill_step=$((kill_step % (steps - 8) + 1))  # a stop at the last step is no stop: the run ends
          stop_at first TERM "step $kill_step" "${common[@]}"
          ((rc == 143)) || { cat "$dir/first.err"; fail "seed $seed: SIGTERM: exit $rc, expected 143"; }
          grep -q "stopped by SIGTERM after step" "$dir/first.err" || fail "seed $seed: no stop message"
          grep -qF "continue with: remat train --resume $states" "$dir/first.err" || fail "seed $seed: no resume command"
          grep -q '"event":"stopped"' "$dir/first.out" || fail "seed $seed: no stopped event in the JSON"
          stopped=$(field step "$dir/first.out")
          stop_at second INT "step $((stopped + 2))" "$remat" train --resume "$states" --json --quiet --eval-every 1
          ((rc == 130)) || { cat "$dir/second.err"; fail "seed $seed: SIGINT: exit $rc, expected 130"; }
          how="SIGTERM after step $kill_step (stopped after $stopped), SIGINT after step $((stopped + 2)) (stopped after $(field step "$dir/second.out"))" ;;
      esac
      run "resumed-$seed" "$remat" train --resume "$states" --json --quiet
      expect_rc "resumed-$seed" 0
      same straight "resumed-$seed"
      echo "   seed $seed (--state-every $every; $how): resumed from step $(field resumed_from_step "$dir/resumed-$seed.out"), same bits"
      n=$(compgen -G "$states/step-*" | wc -l)
      ((n <= 2)) || fail "seed $seed: $n states kept, expected the last two"
      [[ -d "$states/step-$(printf %08d $steps)" ]] || fail "seed $seed: no state at the end"
    done
    ;;
  corrupt)
    states=$dir/states
    run train "$remat" train "${model[@]}" --steps 8 --state-dir "$states" --state-every 4
    expect_rc train 0
    newest=$states/step-00000008
    flip() {  # flip FILE OFFSET: one byte changed
      python3 -c "import sys; f=open(sys.argv[1],'r+b'); f.seek(int(sys.argv[2])); b=f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0]^0x20]))" "$1" "$2"
    }
    data_offset() {  # data_offset FILE TENSOR: where the tensor's bytes start
      python3 -c "import json,struct,sys; b=open(sys.argv[1],'rb').read(); n=struct.unpack('<Q',b[:8])[0]; print(8+n+json.loads(b[8:8+n])[sys.argv[2]]['data_offsets'][0]+5)" "$1" "$2"
    }
    for target in "model.safetensors blocks.1.attn.qkv.weight" "optimizer.safetensors wte.weight/exp_avg_sq" \
                  "model.safetensors header" "state.json whole"; do
      set -- $target
      rm -rf "$dir/damaged" && cp -r "$states" "$dir/damaged"
      file=$dir/damaged/step-00000008/$1
      case $2 in
        header) flip "$file" 40; expected="the header of model.safetensors" ;;
        whole) flip "$file" 60; expected="state.json" ;;
        *) flip "$file" "$(data_offset "$file" "$2")"; expected="tensor \"$2\" of $1 does not match its checksum" ;;
      esac
      before=$(ls -R "$dir/damaged" | md5sum)
      run refused "$remat" train --resume "$dir/damaged" --json
      expect_rc refused 1
      expect_text refused "$expected"
      expect_text refused "step-00000004 (pass one as --resume to continue from it)"
      grep -q '"weights_digest"' "$dir/refused.out" && fail "a run was trained from the damaged state"
      [[ "$(ls -R "$dir/damaged" | md5sum)" == "$before" ]] || fail "the refused resume wrote something"
      echo "   one byte flipped in $1 ($2): refused: $(grep -o 'load_training_state[^;]*' "$dir/refused.err" | head -1)"
    done
    ;;
  faults)
    run straight "$remat" train "${model[@]}" --steps 12
    expect_rc straight 0
    # a disk that fills up during the third state (each state's bytes, counted by the test hook)
    run sizing "$remat" train "${model[@]}" --steps 1 --state-dir "$dir/sizing" --state-every 1
    expect_rc sizing 0
    state_bytes=$(cat "$dir/sizing/step-00000001"/* | wc -c)
    run full env REMAT_TEST_FAIL_WRITES_AFTER=$((2 * state_bytes + state_bytes / 2)) \
      "$remat" train "${model[@]}" --steps 12 --state-dir "$dir/full" --state-every 4
    expect_rc full 1
    expect_text full "No space left on device"
    expect_text full "the previous state, $dir/full/step-00000008, is intact"
    compgen -G "$dir/full/step-*.partial" >/dev/null && fail "a partial state was left behind"
    run after_full "$remat" train --resume "$dir/full" --json --quiet
    expect_rc after_full 0
    same straight after_full
    echo "   disk full in the third state write: error, the state of step 8 intact, resumed to the same bits"
    # unwritable places: found before the first step
    touch "$dir/a-file"
    run bad_state_dir "$remat" train "${model[@]}" --steps 12 --state-dir "$dir/a-file/states"
    expect_rc bad_state_dir 2
    expect_text bad_state_dir "--state-dir: cannot create the directory"
    run bad_save "$remat" train "${model[@]}" --steps 12 --save "$dir/missing/w.safetensors"
    expect_rc bad_save 2
    expect_text bad_save "nothing was trained"
    # --save on a full disk: an error; the final state holds the weights, and a resume saves them
    run save_full env REMAT_TEST_FAIL_WRITES_AFTER=$((state_bytes + 8192)) \
      "$remat" train "${model[@]}" --steps 12 --state-dir "$dir/savefull" --state-every 100 --save "$dir/w.safetensors"
    expect_rc save_full 1
    expect_text save_full "No space left on device"
    [[ -e "$dir/w.safetensors" ]] && fail "a failed --save left a file"
    run save_again "$remat" train --resume "$dir/savefull" --json --quiet --save "$dir/w.safetensors"
    expect_rc save_again 0
    same straight save_again
    [[ -s "$dir/w.safetensors" ]] || fail "the resumed finished run did not --save"
    echo "   --save on a full disk: error; the final state kept the weights; --resume --save wrote them"
    # a real full disk, where this test may mount one (root)
    mkdir -p "$dir/tmpfs"
    # (room for one state and a half: the second is refused before it is written; two would fit,
    # the older one is removed before the next is written)
    if mount -t tmpfs -o size=$((3 * state_bytes / 2)) tmpfs "$dir/tmpfs" 2>/dev/null; then
      mounted=$dir/tmpfs
      run real_full "$remat" train "${model[@]}" --steps 12 --state-dir "$dir/tmpfs/states" --state-every 2
      expect_rc real_full 1
      expect_text real_full "is intact: free space"
      run after_real "$remat" train --resume "$dir/tmpfs/states" --state-dir "$dir/elsewhere" --json --quiet
      expect_rc after_real 0
      same straight after_real
      echo "   a real tmpfs full: $(grep -o 'not written: [^;]*' "$dir/real_full.err" | head -1); resumed to the same bits"
      # offload: to a full disk: the values stay in memory and the run stops with an error
      rm -rf "$dir/tmpfs/states"
      head -c $((2 * state_bytes + 32768)) /dev/zero >"$dir/tmpfs/filler" 2>/dev/null
      run offload_full "$remat" train "${model[@]}" --steps 12 --policy "every-layer+offload:$dir/tmpfs,threshold=1"
      expect_rc offload_full 1
      expect_text offload_full "No space left on device"
      expect_text offload_full "nothing was lost"
      echo "   offload: to a full tmpfs: $(grep -o 'policy offload: [^(]*' "$dir/offload_full.err" | head -1)"
      umount "$dir/tmpfs" && mounted=""
    else
      echo "   (no tmpfs could be mounted: the real full disk is skipped; the injected one above covers the same paths)"
    fi
    ;;
  options)
    states=$dir/states
    run straight "$remat" train "${model[@]}" --steps 12
    run first "$remat" train "${model[@]}" --steps 12 --state-dir "$states" --state-every 4
    expect_rc first 0
    rm -rf "$states/step-00000012"
    run disagree "$remat" train --resume "$states" --steps 20 --lr 0.1 --layers 3
    expect_rc disagree 2
    expect_text disagree "--layers 3 (the state's: 2), --lr 0.1 (the state's: 0.004) disagree with the run in the state"
    run other_policy "$remat" train --resume "$states" --policy save-all --json --quiet
    expect_rc other_policy 0
    same straight other_policy
    run finished "$remat" train --resume "$states" --json --quiet
    expect_rc finished 0
    same straight finished
    [[ "$(field resumed_from_step "$dir/finished.out")" == 12 ]] || fail "the finished run was trained again"
    run with_load "$remat" train --resume "$states" --load "$dir/x.safetensors"
    expect_rc with_load 2
    # the precision is part of the run: a bf16 state resumes in bf16, and --dtype f32 beside it is refused
    run straight16 "$remat" train "${model[@]}" --steps 8 --dtype bf16
    run first16 "$remat" train "${model[@]}" --steps 8 --dtype bf16 --state-dir "$dir/states16" --state-every 4
    expect_rc first16 0
    rm -rf "$dir/states16/step-00000008"
    run other_dtype "$remat" train --resume "$dir/states16" --dtype f32
    expect_rc other_dtype 2
    expect_text other_dtype "--dtype f32 (the state's: bf16) disagrees with the run in the state"
    run resumed16 "$remat" train --resume "$dir/states16" --json --quiet
    expect_rc resumed16 0
    same straight16 resumed16
    [[ "$(field dtype "$dir/resumed16.out")" == "\"bf16\"" ]] || fail "the bf16 state was resumed in another precision"
    run every_alone "$remat" train "${model[@]}" --steps 2 --state-every 1
    expect_rc every_alone 2
    expect_text every_alone "there is no --state-dir"
    run other_run "$remat" train "${model[@]}" --steps 12 --state-dir "$states"
    expect_rc other_run 2
    expect_text other_run "holds the states of a run"
    run empty "$remat" train --resume "$dir"
    expect_rc empty 2
    expect_text empty "holds no training state"
    # the weights of a state are a weight file other tools (and remat sample) read
    run sample "$remat" sample --load "$states/step-00000012/model.safetensors" --tokens 5
    expect_rc sample 0
    # --eval-only --load X --save Y --format F converts without training
    run convert "$remat" train "${model[@]}" --eval-only --load "$states/step-00000012/model.safetensors" \
      --save "$dir/nano.safetensors" --format nanogpt
    expect_rc convert 0
    [[ -s "$dir/nano.safetensors" ]] || fail "--eval-only --save wrote nothing"
    run reread "$remat" train "${model[@]}" --eval-only --load "$dir/nano.safetensors"
    [[ "$(field val_loss "$dir/reread.out")" == "$(field val_loss "$dir/convert.out")" ]] ||
      fail "the converted weights evaluate differently"
    echo "   disagreeing options refused; --policy free; a finished run; a state's weights sampled and converted"
    ;;
  signals)
    runs=$1
    shim=${2:-}
    every=${3:-2}  # with SHIM: every EVERY-th run under the timer (1: all of them)
    # a model whose weight gradients have k = batch x seq = 256 > 84: oneDNN's kernels run on their
    # heap workspace (Note [signals and oneDNN's kernels]); a few milliseconds a step
    big=(--threads "${REMAT_FAULT_THREADS:-2}" --data "$dir/corpus.txt" --layers 2 --width 32 --heads 2 --seq 32 --batch 8 --quiet --json)
    esteps=${REMAT_FAULT_STEPS:-150}
    run straight "$remat" train "${big[@]}" --steps $esteps
    expect_rc straight 0
    signalled=0
    for i in $(seq "$runs"); do
      RANDOM=$((i * 7919))
      states=$dir/signal-$i
      signal=TERM
      ((i % 2 == 0)) && signal=INT
      # one env: a preloaded shim's timer, which survives exec, must not reach a second exec
      env=(env)
      [[ -n "$shim" && $((i % every)) == $((1 % every)) ]] && env+=(LD_PRELOAD="$shim")
      slow=()
      ((i == 3)) && slow=(REMAT_TEST_WRITE_DELAY_MS=200)  # this one is signalled during a state write
      : >"$dir/sig.out"
      : >"$dir/sig.err"
      "${env[@]}" "${slow[@]}" "$remat" train "${big[@]}" --steps $esteps --eval-every 1 --state-dir "$states" \
        --state-every $((1 + RANDOM % 7)) >"$dir/sig.out" 2>"$dir/sig.err" &
      pid=$!
      start=$SECONDS
      # wait for the first step, then a random time into the steps (or, run 3, into a state write)
      until grep -q '"step":1,' "$dir/sig.out" 2>/dev/null || ! kill -0 "$pid" 2>/dev/null; do
        ((SECONDS - start > limit)) && { kill -KILL "$pid"; fail "run $i never started"; }
        sleep 0.005
      done
      if ((i == 3)); then
        until writing_in "$states" || ! kill -0 "$pid" 2>/dev/null; do sleep 0.002; done
      else
        sleep "$(awk -v ms=$((RANDOM % ${REMAT_FAULT_SPREAD_MS:-400})) 'BEGIN { printf "%.3f", ms / 1000 }')"
      fi
      kill "-$signal" "$pid" 2>/dev/null
      wait "$pid"
      rc=$?
      rm -f "/dev/shm/__KMP_REGISTERED_LIB_${pid}_$(id -u)"
      case $rc in
        0) echo "   run $i: ended before the signal (not counted)"; continue ;;
        130 | 143) ;;
        *) cat "$dir/sig.err"; fail "run $i: SIG$signal during the steps: exit $rc (a crash), expected 130 or 143" ;;
      esac
      [[ $signal == INT ]] && expected=130 || expected=143
      ((rc == expected)) || { cat "$dir/sig.err"; fail "run $i: SIG$signal: exit $rc, expected $expected"; }
      grep -q "stopped by SIG$signal after step" "$dir/sig.err" || { cat "$dir/sig.err"; fail "run $i: no stop message"; }
      signalled_rc=$rc
      if ((${#env[@]} > 1)); then
        grep -q 'sigprof shim: [1-9][0-9]* SIGPROF taken' "$dir/sig.err" || { cat "$dir/sig.err"; fail "run $i: the SIGPROF timer did not fire"; }
      fi
      stopped=$(field step "$dir/sig.out")
      run "resumed-$i" "${env[@]}" "$remat" train --resume "$states" --json --quiet
      expect_rc "resumed-$i" 0
      [[ "$(field weights_digest "$dir/resumed-$i.out")" == "$(field weights_digest "$dir/straight.out")" ]] ||
        fail "run $i: resumed to weights_digest $(field weights_digest "$dir/resumed-$i.out"), the run never stopped: $(field weights_digest "$dir/straight.out")"
      signalled=$((signalled + 1))
      under=""
      ((${#env[@]} > 1)) && under=" under a 1 kHz SIGPROF timer"
      echo "   run $i: SIG$signal$under${slow[*]:+ during a state write}: stopped after step $stopped, exit $signalled_rc; resumed to the same weights_digest"
    done
    ((signalled * 2 >= runs)) || fail "only $signalled of $runs runs were signalled before they ended"
    ;;
  trap)
    run straight "$remat" train "${model[@]}" --steps 8
    expect_rc straight 0
    # a step directory without its state.json (a copy cut short): named before step 1, not trained over
    states=$dir/cut
    run cut "$remat" train "${model[@]}" --steps 8 --state-dir "$states" --state-every 2  # keeps 6 and 8
    expect_rc cut 0
    cp -r "$states" "$dir/cut-copy"
    rm -f "$states/step-00000008/state.json"
    run incomplete "$remat" train --resume "$states" --json --quiet
    expect_rc incomplete 2
    expect_text incomplete "$states/step-00000008 is not a complete training state"
    expect_text incomplete "mv $states/step-00000008 $states/step-00000008.damaged"
    grep -q '"weights_digest"' "$dir/incomplete.out" && fail "a run trained over an incomplete state directory"
    mv "$states/step-00000008" "$states/step-00000008.damaged"
    run after_cut "$remat" train --resume "$states" --json --quiet
    expect_rc after_cut 0
    same straight after_cut
    # an older state resumed while newer ones exist; a damaged newest one
    states=$dir/cut-copy
    run older "$remat" train --resume "$states/step-00000006" --json --quiet
    expect_rc older 2
    expect_text older "holds states newer than it ($states/step-00000008)"
    rm -f "$states/step-00000008/model.safetensors"
    run damaged "$remat" train --resume "$states" --json --quiet
    expect_rc damaged 1
    expect_text damaged "model.safetensors is missing from the state; nothing was trained. Other states: $states/step-00000006"
    echo "   an incomplete step directory, an older state resumed, a damaged newest state: each named before step 1 with what to do"
    # a second run on a locked directory, then a lock left by a killed run
    locked=$dir/locked
    : >"$dir/holder.out"
    REMAT_TEST_PAUSE_AFTER_STEP=2 "$remat" train "${model[@]}" --steps 8 --eval-every 1 --state-dir "$locked" \
      --state-every 1 >"$dir/holder.out" 2>"$dir/holder.err" &
    holder=$!
    until grep -q '"step":2,' "$dir/holder.out" 2>/dev/null; do sleep 0.01; done
    run second "$remat" train "${model[@]}" --steps 8 --state-dir "$locked"
    expect_rc second 2
    expect_text second "another run is using it (pid $holder, host $(hostname)"
    run second_resume "$remat" train --resume "$locked"
    expect_rc second_resume 2
    expect_text second_resume "another run is using it"
    kill -KILL "$holder"
    wait "$holder" 2>/dev/null
    run after_kill "$remat" train --resume "$locked" --json --quiet
    expect_rc after_kill 0
    same straight after_kill
    echo "   a second run on a locked directory: refused naming pid $holder; its lock gone with the killed run"
    # --save that fails at the end without --state-dir: says how to keep the weights next time
    run save_fails env REMAT_TEST_FAIL_WRITES_AFTER=100 "$remat" train "${model[@]}" --steps 2 --save "$dir/w.safetensors"
    expect_rc save_fails 1
    expect_text save_fails "Pass --state-dir DIR to keep the training state"
    # room, on a small tmpfs where this test may mount one (root)
    run sizing "$remat" train "${model[@]}" --steps 1 --state-dir "$dir/sizing" --state-every 1
    state_bytes=$(du -sb "$dir/sizing/step-00000001" | cut -f1)
    mkdir -p "$dir/tmpfs"
    if mount -t tmpfs -o size=$((state_bytes / 2)) tmpfs "$dir/tmpfs" 2>/dev/null; then
      mounted=$dir/tmpfs
      run no_room "$remat" train "${model[@]}" --steps 8 --state-dir "$dir/tmpfs/states"
      expect_rc no_room 2
      expect_text no_room "nothing was trained"
      expect_text no_room "it needs room for two states"
      umount "$dir/tmpfs"
      # room for two states and a half: enough for a run that writes six (never three at once)
      mount -t tmpfs -o size=$((5 * state_bytes / 2)) tmpfs "$dir/tmpfs"
      run two_fit "$remat" train "${model[@]}" --steps 8 --state-dir "$dir/tmpfs/states" --state-every 1 --json --quiet
      expect_rc two_fit 0
      same straight two_fit
      # room for one and a half: the second state is refused before it is written, the first intact
      umount "$dir/tmpfs"
      mount -t tmpfs -o size=$((3 * state_bytes / 2)) tmpfs "$dir/tmpfs"
      run one_fits "$remat" train "${model[@]}" --steps 8 --state-dir "$dir/tmpfs/states" --state-every 2
      expect_rc one_fits 1
      expect_text one_fits "not written: a state takes about"
      expect_text one_fits "the previous state, $dir/tmpfs/states/step-00000002, is intact"
      compgen -G "$dir/tmpfs/states/step-*.partial" >/dev/null && fail "a partial state was left on the full disk"
      run after_room "$remat" train --resume "$dir/tmpfs/states" --state-dir "$dir/roomy" --json --quiet
      expect_rc after_room 0
      same straight after_room
      umount "$dir/tmpfs"
      mount -t tmpfs -o size=16k tmpfs "$dir/tmpfs"
      run save_room "$remat" train "${model[@]}" --steps 8 --save "$dir/tmpfs/w.safetensors"
      expect_rc save_room 2
      expect_text save_room "nothing was trained. Free space or --save to another disk"
      umount "$dir/tmpfs" && mounted=""
      echo "   no room for a state or for --save: refused before step 1; two states' room is enough; a full disk mid-run keeps the state"
    else
      echo "   (no tmpfs could be mounted: the room checks are skipped; the injected write failures of 'faults' cover the writes)"
    fi
    ;;
  extend)
    run straight29 "$remat" train "${model[@]}" --steps 29
    expect_rc straight29 0
    # a run of 20 stopped within its warm-up (min(100, steps / 10) = 2 steps for 20 and for 29)
    stop_at first TERM "step 2" "$remat" train "${model[@]}" --steps 20 --eval-every 1 --state-dir "$dir/e"
    ((rc == 143)) || { cat "$dir/first.err"; fail "the run to extend was not stopped"; }
    run extended "$remat" train --resume "$dir/e" --steps 29 --json
    expect_rc extended 0
    expect_text extended "extended from 20 to 29 steps"
    same straight29 extended
    # a finished run extended: it trains on; twice the same bits
    run done20 "$remat" train "${model[@]}" --steps 20 --state-dir "$dir/f" --json --quiet
    cp -r "$dir/f" "$dir/g"
    run more "$remat" train --resume "$dir/f" --steps 26 --json --quiet
    expect_rc more 0
    run more_again "$remat" train --resume "$dir/g" --steps 26 --json --quiet
    [[ "$(field resumed_from_step "$dir/more.out")" == 20 && -d "$dir/f/step-00000026" ]] || fail "the finished run was not extended"
    [[ "$(field weights_digest "$dir/more.out")" == "$(field weights_digest "$dir/more_again.out")" ]] || fail "two extensions differ"
    [[ "$(field weights_digest "$dir/more.out")" != "$(field weights_digest "$dir/done20.out")" ]] || fail "the extension trained nothing"
    run shorter "$remat" train --resume "$dir/f" --steps 10
    expect_rc shorter 2
    expect_text shorter "can be extended (a larger --steps), not shortened"
    # another text on resume, with bytes outside the run's vocabulary: named as another corpus
    { cat "$dir/corpus.txt"; echo "Zürich café"; } >"$dir/other.txt"
    run other_corpus "$remat" train --resume "$dir/g" --data "$dir/other.txt"
    expect_rc other_corpus 2
    expect_text other_corpus "is not the run's corpus"
    echo "   a run stopped in its warm-up extended to 29 steps == a run of 29; a finished run extended; a smaller --steps refused"
    ;;
  *)
    fail "unknown test"
    ;;
esac
echo "PASS ($test)"
