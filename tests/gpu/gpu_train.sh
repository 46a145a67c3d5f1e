#!/usr/bin/env bash
# GPU training end to end (GPU machine): dflash run with job.backend = cuda — dflashd, prefetch, dflash-target-cuda
# and dflash-drafter-cuda sharing one GPU — on a tiny bf16 target. Checks: the run finishes with an exact ledger;
# a second run gives a bitwise-identical checkpoint; a run whose GPU drafter is SIGKILLed twice mid-run (dflash run
# restarts it: it re-imports its training state from dflashd and redoes the step in flight) ends bitwise equal; a
# run with `dflashctl rolling-restart target`, `rolling-restart drafter` and a SIGKILL of each GPU worker ends
# bitwise equal too, and prints how long each restart kept the pipeline from committing a step.
# Usage: BUILD=build tests/gpu/gpu_train.sh   (needs $BUILD/bin/* including the -cuda workers)
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
. tests/gpu/lib.bash
STEPS=${STEPS:-6000}

gpu_fixture || { fail gpu_train_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }

t0=$SECONDS
gpu_train_config a
if run_job a; then ok "gpu_train_run_finishes ($((SECONDS - t0)) s for $STEPS steps)"
else fail gpu_train_run_finishes "$(tail -5 "$T/a.out"; tail -5 "$T/a/logs/drafter-0.log")"; exit 1; fi
if msg=$(check_ledger a $STEPS 1); then ok "gpu_train_ledger_exactly_once ($msg)"; else fail gpu_train_ledger_exactly_once "$msg"; fi
python3 - "$T/a/ledger.jsonl" <<'EOP' && ok gpu_train_loss_goes_down || fail gpu_train_loss_goes_down "$(head -1 "$T/a/ledger.jsonl"; tail -1 "$T/a/ledger.jsonl")"
import json, sys
l = [json.loads(x) for x in open(sys.argv[1])]
first = sum(x["loss"] for x in l[:5]) / 5; last = sum(x["loss"] for x in l[-5:]) / 5
print("loss %.4f -> %.4f" % (first, last)); sys.exit(0 if last < first else 1)
EOP
grep -q "warm-up" "$T/a/logs/drafter-0.log" && ok gpu_train_drafter_warm_up || fail gpu_train_drafter_warm_up "no warm-up line"

gpu_train_config b
run_job b && cmp -s "$(final_weights a)" "$(final_weights b)" && ok gpu_train_twice_bitwise_identical ||
    fail gpu_train_twice_bitwise_identical "two runs differ: $(tail -3 "$T/b.out")"

# SIGKILL the GPU drafter twice at moments picked at random (dflash run restarts it)
gpu_train_config c
"$BIN/dflash" run -c "$T/c.ini" >"$T/c.out" 2>&1 &
sup=$!
for at in $((STEPS / 5 + RANDOM % (STEPS / 5))) $((STEPS / 2 + RANDOM % (STEPS / 5))); do
    wait_step c $at
    sleep 0.0$((RANDOM % 10))
    kill_worker c drafter-0
done
wait $sup
rc=$?
[ $rc -eq 0 ] && ok gpu_train_drafter_killed_run_finishes || fail gpu_train_drafter_killed_run_finishes "exit $rc: $(tail -3 "$T/c.out")"
nimp=$(grep -c "re-imported the training state" "$T/c/logs/drafter-0.log")
[ "$nimp" -ge 2 ] && ok "gpu_train_drafter_reimports_state ($nimp times)" || fail gpu_train_drafter_reimports_state "re-imported $nimp times"
if msg=$(check_ledger c $STEPS 1); then ok "gpu_train_killed_ledger_exactly_once ($msg)"; else fail gpu_train_killed_ledger_exactly_once "$msg"; fi
cmp -s "$(final_weights a)" "$(final_weights c)" && ok gpu_train_drafter_killed_bitwise_identical ||
    fail gpu_train_drafter_killed_bitwise_identical "the run with SIGKILLs differs from the one without"

# rolling restarts and SIGKILLs of both GPU workers under load; how long each kept the pipeline from committing
gpu_train_config d
"$BIN/dflash" run -c "$T/d.ini" >"$T/d.out" 2>&1 &
sup=$!
ledger_poller d $sup &   # when the ledger grows: the longest commit gap during each operation is read off it
poller=$!
train_op() { op d 20 "$@" || fail "gpu_train_$1" "exit $?: $(tail -3 "$T/d.ctl")"; } # LABEL COMMAND...: must succeed
wait_step d $((STEPS / 10))
train_op rolling_restart_target "$CTL" -c "$T/d.ini" --wait 300 rolling-restart target
train_op rolling_restart_drafter "$CTL" -c "$T/d.ini" --wait 300 rolling-restart drafter
train_op sigkill_target kill_worker d target-0
train_op sigkill_drafter kill_worker d drafter-0
still=$(ledger_lines d)
[ "$still" -lt $STEPS ] && ok "gpu_train_operations_under_load (done by step $still of $STEPS)" ||
    fail gpu_train_operations_under_load "the run ended before the operations did: raise STEPS"
wait $sup
rc=$?
wait $poller
gaps=$(commit_gaps d)
echo "restarts: $gaps"
[ $rc -eq 0 ] && ok "gpu_train_rolling_restarts_run_finishes ($gaps)" || fail gpu_train_rolling_restarts_run_finishes "exit $rc: $(tail -3 "$T/d.out"; tail -5 "$T/d.ctl")"
nd=$(grep -c "re-imported the training state" "$T/d/logs/drafter-0.log")
nt=$(grep -c "re-imported pool 0" "$T/d/logs/target-0.log")
[ "$nd" -ge 2 ] && [ "$nt" -ge 2 ] && ok "gpu_train_rolling_workers_reimported (drafter $nd, target $nt times)" ||
    fail gpu_train_rolling_workers_reimported "drafter re-imported its state $nd times, target its pool $nt times"
if msg=$(check_ledger d $STEPS 1); then ok "gpu_train_rolling_ledger_exactly_once ($msg)"; else fail gpu_train_rolling_ledger_exactly_once "$msg"; fi
cmp -s "$(final_weights a)" "$(final_weights d)" && ok gpu_train_rolling_bitwise_identical ||
    fail gpu_train_rolling_bitwise_identical "the run with rolling restarts differs from the one without"
[ $FAILED -eq 0 ] || for f in "$T"/*/logs/drafter-0.log; do echo "--- $f"; tail -8 "$f"; done
exit $FAILED
