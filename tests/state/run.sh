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
# Exit 0 on success; the failing check is printed otherwise.
set -uo pipefail

remat=$1
test=$2
shift 2
limit=120  # seconds for any one run
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
    if mount -t tmpfs -o size=$((2 * state_bytes + 32768)) tmpfs "$dir/tmpfs" 2>/dev/null; then
      mounted=$dir/tmpfs
      run real_full "$remat" train "${model[@]}" --steps 12 --state-dir "$dir/tmpfs/states" --state-every 2
      expect_rc real_full 1
      expect_text real_full "No space left on device"
      run after_real "$remat" train --resume "$dir/tmpfs/states" --state-dir "$dir/elsewhere" --json --quiet
      expect_rc after_real 0
      same straight after_real
      echo "   a real tmpfs full: $(grep -o 'failed: No space[^;]*' "$dir/real_full.err" | head -1); resumed to the same bits"
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
    run disagree "$remat" train --resume "$states" --steps 20 --lr 0.1 --layers 2
    expect_rc disagree 2
    expect_text disagree "--steps 20 (the state's: 12), --lr 0.1 (the state's: 0.004) disagree with the run in the state"
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
  *)
    fail "unknown test"
    ;;
esac
echo "PASS ($test)"
