#!/usr/bin/env bash
# A run_dir that holds a previous run (issue 14, items 2 and 3): without --resume or --fresh it is refused (by
# `dflash run` and by dflashd alone) and nothing in it changes; --resume is refused against another target (other
# weights of the same shape, or another layer count that moves the taps), naming both, and accepted against the
# one it was trained with; --fresh keeps the previous run aside in <run_dir>/previous-<time>/ and starts over.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
make_fixture || { fail run_dir_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
mk_target() { # NAME SEED LAYERS
    "$BIN/dflash-demo" make-target "$T/$1" --seed "$2" --hidden 32 --layers "$3" --heads 4 --kv-heads 2 \
        --head-dim 8 --intermediate 64 --vocab 256 >/dev/null 2>>"$T/fixture.log"
}
mk_target other 12 4 && mk_target deeper 11 6 || { fail run_dir_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
write_config job 20
run_job job || { fail run_dir_first_run "$(tail -5 "$T/job.out")"; exit 1; }
snapshot() { echo "$(wc -l <"$T/job/ledger.jsonl") $(readlink "$T/job/ckpt/latest") $(md5sum <"$T/job/ledger.jsonl")"; }
before=$(snapshot)

# 2: forgetting --resume
run_job job; rc=$?
if [ $rc -eq 1 ] && grep -q "holds a previous run (ledger.jsonl" "$T/job.out" && grep -q -- "--fresh" "$T/job.out" &&
   [ "$(snapshot)" = "$before" ] && ! ls -d "$T"/job/previous-* >/dev/null 2>&1; then
    ok "run_dir_previous_run_refused ($(head -c 160 "$T/job.out")...)"
else
    fail run_dir_previous_run_refused "exit $rc: $(tail -3 "$T/job.out"); $before -> $(snapshot)"
fi
timeout 60 "$BIN/dflashd" -c "$T/job.ini" >"$T/dflashd-alone.out" 2>&1; rc=$?
if [ $rc -eq 1 ] && grep -q "holds a previous run" "$T/dflashd-alone.out" && [ "$(snapshot)" = "$before" ]; then
    ok run_dir_previous_run_refused_by_dflashd
else
    fail run_dir_previous_run_refused_by_dflashd "exit $rc: $(tail -3 "$T/dflashd-alone.out")"
fi
"$BIN/dflash" run -c "$T/job.ini" --resume --fresh >"$T/both.out" 2>&1; rc=$?
if [ $rc -eq 2 ]; then ok run_dir_resume_and_fresh_usage_error; else fail run_dir_resume_and_fresh_usage_error "exit $rc: $(cat "$T/both.out")"; fi

# 3: --resume against another target
for c in "other:mismatch of the target weights" "deeper:mismatch of the target shape"; do
    tgt=${c%%:*} want=${c#*:}
    run_job job --resume --set "target.model=$T/$tgt" --set train.steps=30; rc=$?
    if [ $rc -eq 1 ] && grep -q "$want" "$T/job.out" && grep -q "$T/target " "$T/job.out" && grep -q "$T/$tgt " "$T/job.out" &&
       [ "$(snapshot)" = "$before" ]; then
        ok "run_dir_resume_other_target_refused ($tgt: $(grep -o "mismatch.*" "$T/job.out" | head -1 | cut -c1-300))"
    else
        fail "run_dir_resume_other_target_refused" "$tgt: exit $rc: $(tail -3 "$T/job.out")"
    fi
done
if run_job job --resume --set train.steps=30 && grep -q "trained against this target" "$T/job/logs/dflashd.log" &&
   msg=$(check_ledger job 30 2); then
    ok "run_dir_resume_same_target ($msg)"
else
    fail run_dir_resume_same_target "$(tail -3 "$T/job.out") ${msg:-}"
fi
# the summary's throughput after a resume counts only this run's steps
if grep -q "this run (resumed at step 20): 10 steps" "$T/job.out"; then ok "run_dir_resume_throughput_this_run ($(grep -o "this run.*" "$T/job.out"))"
else fail run_dir_resume_throughput_this_run "$(grep "tokens" "$T/job.out")"; fi

# 2: --fresh keeps the previous run aside
resumed=$(snapshot)
if run_job job --fresh --set train.steps=12 && msg=$(check_ledger job 12 2); then
    prev=$(ls -d "$T"/job/previous-* 2>/dev/null | head -1)
    if [ -n "$prev" ] && [ "$(wc -l <"$prev/ledger.jsonl")" = 30 ] && [ -f "$prev/ckpt/latest/trainer_state.json" ] &&
       [ -f "$prev/logs/dflashd.log" ] && [ "$(readlink "$T/job/ckpt/latest")" = step-00000012 ]; then
        ok "run_dir_fresh_keeps_previous_aside (${prev#$T/job/}: 30 steps kept; new run: $msg)"
    else
        fail run_dir_fresh_keeps_previous_aside "previous=$prev: $(ls "$prev" 2>&1 | tr '\n' ' '); latest $(readlink "$T/job/ckpt/latest")"
    fi
else
    fail run_dir_fresh_keeps_previous_aside "$(tail -3 "$T/job.out") ${msg:-}"
fi
# 8: nothing left in /dev/shm after a refused start, a failed start, a --resume without checkpoint, a SIGTERM
segs() { ls /dev/shm 2>/dev/null | grep -c "^dflash-t$$-$1-"; }
run_job job --set control.endpoint=tcp://127.0.0.1:9 --resume; r1=$?
write_config empty 20
run_job empty --resume; r2=$?
write_config term 100000
"$BIN/dflash" run -c "$T/term.ini" >"$T/term.out" 2>&1 &
sup=$!
deadline=$((SECONDS + 60))
until [ -f "$T/term/ckpt/step-00000010/trainer_state.json" ] || [ $SECONDS -ge $deadline ]; do sleep 0.1; done
during=$(segs term)
kill -TERM $sup; wait $sup; r3=$?
if [ $r1 = 1 ] && [ $r2 = 1 ] && [ "$during" -ge 3 ] && [ "$(segs job)" = 0 ] && [ "$(segs empty)" = 0 ] && [ "$(segs term)" = 0 ]; then
    ok "run_dir_no_segments_left (failed start, --resume without checkpoint, SIGTERM after $during segments: none left)"
else
    fail run_dir_no_segments_left "exits $r1 $r2 $r3, segments during $during, left: $(ls /dev/shm | grep "dflash-t$$-" | tr '\n' ' ')"
fi
exit $FAILED
