#!/usr/bin/env bash
# Messages that said something else than what happened (issue 19, item 15): dflashctl on a path that is not a socket
# says so at once (it waited 5 s and said "no answer"); `resume` on a job that is not paused says it was not paused
# (it said "resumed"); the progress line has no made-up "ETA 0:00 ... 0 tok/s" before a rate is measured, and its
# last line after a drain says where the job ended, with no ETA. The job is held at a known step by the prefetcher's
# fault hook (DFLASH_FAULT_HOLD_BATCH), so nothing races it.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
CTL="$BIN/dflashctl"
make_fixture || { fail messages_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
write_config msg 60
touch "$T/not-a-socket"
"$CTL" --endpoint "ipc://$T/not-a-socket" status >"$T/file.out" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "is not a socket but a regular file" "$T/file.out" && ! grep -q "no answer" "$T/file.out"; then
    ok "ctl_not_a_socket ($(cat "$T/file.out"))"
else
    fail ctl_not_a_socket "exit $rc: $(cat "$T/file.out")"
fi

DFLASH_FAULT_HOLD_BATCH=20 "$BIN/dflash" run -c "$T/msg.ini" >"$T/msg.out" 2>&1 &
sup=$!
deadline=$((SECONDS + 300)) # a safety net: the job stops at step 10 for sure (step k trains batches 2k, 2k+1)
until [ "$(cat "$T/msg/ledger.jsonl" 2>/dev/null | wc -l)" -ge 10 ] || [ $SECONDS -ge $deadline ]; do sleep 0.1; done
"$CTL" -c "$T/msg.ini" resume >"$T/resume.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "^not paused: nothing to resume (step 10)" "$T/resume.out"; then ok "ctl_resume_not_paused ($(cat "$T/resume.out"))"
else fail ctl_resume_not_paused "exit $rc: $(cat "$T/resume.out")"; fi
"$CTL" -c "$T/msg.ini" drain >"$T/drain.out" 2>&1
wait $sup
rc=$?
if [ $rc -eq 0 ] && ! grep -q "ETA 0:00\| 0 tok/s" "$T/msg.out" && grep -q "last status drafter-0: drained at step 10/60  loss" "$T/msg.out"; then
    ok "progress_line_says_where_it_ended ($(grep -o "last status.*" "$T/msg.out" | cut -c1-60)...)"
else
    fail progress_line_says_where_it_ended "exit $rc: $(grep "ETA 0:00\| 0 tok/s\|last status" "$T/msg.out" | head -3)"
fi
exit $FAILED
