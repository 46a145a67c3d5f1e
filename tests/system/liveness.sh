#!/usr/bin/env bash
# Liveness does not depend on how long a step takes (issue 19, item 1). A step much longer than the watchdog and the
# heartbeat timeout (2 s here; a target of a real vocabulary, 151936 ids, and batches of up to 2048 tokens: the
# drafter's loss head alone takes seconds on the CPU) completes, because the workers' liveness thread keeps giving signs of
# life while the computation progresses; before, every such step was killed, forever. A step that hangs for real
# (fault hook DFLASH_FAULT_HANG_BATCH: the main thread blocks, no progress) is still killed, and after 5 kills in a
# row with no step committed `dflash run` gives up with the reason, after checkpointing the committed state.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
ulimit -c 0
make_fixture || { fail liveness_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
"$BIN/dflash-demo" make-target "$T/big" --seed 11 --hidden 32 --layers 4 --heads 4 --kv-heads 2 --head-dim 8 \
    --intermediate 64 --vocab 151936 >/dev/null 2>>"$T/fixture.log" || { fail liveness_fixture "big target"; exit 1; }
TIMEOUTS="watchdog_sec = 2
heartbeat_timeout_sec = 2"

write_config slow 3
sed -i -e "s|^model = .*|model = $T/big|" -e 's/^max_batch_tokens = .*/max_batch_tokens = 2048/' \
    -e 's/^max_batch_seqs = .*/max_batch_seqs = 64/' -e 's/^max_anchors = .*/max_anchors = 24/' \
    -e 's/^targets = .*/targets = 1/' \
    -e "/^watchdog_sec\|^heartbeat_timeout_sec/d" -e "s/^\[workers\]/[workers]\n$(echo "$TIMEOUTS" | sed -z 's/\n/\\n/g')/" \
    "$T/slow.ini"
printf '[control]\nheartbeat_sec = 0.5\n' >>"$T/slow.ini"
# a safety net only: a job that is killed forever must fail the test, not block the suite
timeout 600 "$BIN/dflash" run -c "$T/slow.ini" >"$T/slow.out" 2>&1
rc=$?
kills=$(grep -c "watchdog:\|no sign of life" "$T/slow.out")
if [ $rc -eq 0 ] && msg=$(check_ledger slow 3 2) && [ "$kills" -eq 0 ]; then
    ok "long_steps_complete ($msg, no kill)"
else
    fail long_steps_complete "exit $rc, $kills kills: $(grep -m2 "watchdog:\|no sign of life" "$T/slow.out") $(tail -2 "$T/slow.out")"
fi

write_config hang 40 "[control]
heartbeat_sec = 0.25"
sed -i -e "/^watchdog_sec\|^heartbeat_timeout_sec/d" -e "s/^\[workers\]/[workers]\nwatchdog_sec = 1\nheartbeat_timeout_sec = 1/" \
    "$T/hang.ini"
# batch 5 is drafter-1's batch of step 2 (step k trains batches 2k, 2k+1): steps 0 and 1 commit, step 2 never does
DFLASH_FAULT_HANG_BATCH=5 timeout 600 "$BIN/dflash" run -c "$T/hang.ini" >"$T/hang.out" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "ERROR.*gave up on the job: drafter-1 was killed 5 times in a row for showing no sign of life, with no step committed since step 2" "$T/hang.out"; then
    ok "hung_step_gives_up ($(grep -o "gave up on the job: .*" "$T/hang.out" | cut -c1-160)...)"
else
    fail hung_step_gives_up "exit $rc: $(tail -3 "$T/hang.out")"
fi
latest=$(readlink "$T/hang/ckpt/latest")
if [ "$latest" = step-00000002 ] && [ "$(wc -l <"$T/hang/ledger.jsonl")" -eq 2 ]; then
    ok "hung_step_checkpoints_the_committed_state ($latest)"
else
    fail hung_step_checkpoints_the_committed_state "latest '$latest', $(wc -l <"$T/hang/ledger.jsonl") ledger lines"
fi
exit $FAILED
