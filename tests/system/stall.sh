#!/usr/bin/env bash
# No silent stall (issue 14, item 9): when no step commits for workers.stall_warn_sec while the job runs, dflashd
# logs it and `dflashctl status` shows it, with what the pipeline waits on; once steps commit again it is gone.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
CTL="$BIN/dflashctl"
make_fixture || { fail stall_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
write_config stall 1000000 "[workers]
stall_warn_sec = 2"
sed -i 's/^checkpoint_every = .*/checkpoint_every = 0/' "$T/stall.ini"
ctl() { "$CTL" -c "$T/stall.ini" --wait 60 "$@"; }
step() { ctl status 2>/dev/null | awk 'NR == 2 { split($2, a, "/"); print a[1] }'; }
"$BIN/dflash" run -c "$T/stall.ini" >"$T/stall.out" 2>&1 &
sup=$!
deadline=$((SECONDS + 60))
until [ "$(step)" -gt 3 ] 2>/dev/null || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
pf=$(ctl status --json | python3 -c "import json,sys; print([w['pid'] for w in json.load(sys.stdin)['workers'] if w['name']=='prefetch-0'][0])")
kill -STOP "$pf"
# What is tested is the stall the stopped prefetcher causes, once the buffered batches are used up (a slow machine
# may report a short stall of its own first).
deadline=$((SECONDS + 40))
until ctl status 2>/dev/null | grep -q "^STALLED.*waiting on prefetch-0" || [ $SECONDS -ge $deadline ]; do sleep 0.3; done
line=$(ctl status 2>/dev/null | grep "^STALLED")
sleep 0.5
if echo "$line" | grep -q "waiting on prefetch-0" && grep -q "WARN.*stalled: no step committed for .* waiting on prefetch-0" "$T/stall.out" && grep -q "stalled: no step committed for .* waiting on prefetch-0" "$T/stall/logs/dflashd.log"; then
    ok "stall_reported (dflashctl status, dflashd.log and dflash run's console: $line)"
else
    fail stall_reported "status: '$line'; console: $(grep stalled "$T/stall.out" | tail -1); log: $(grep stalled "$T/stall/logs/dflashd.log" | tail -1)"
fi
kill -CONT "$pf"
s0=$(step)
deadline=$((SECONDS + 15))
until [ "$(step)" -gt "$s0" ] 2>/dev/null || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
if [ "$(step)" -gt "$s0" ] && ! ctl status | grep -q "^STALLED"; then ok "stall_cleared_when_steps_commit (step $s0 -> $(step))"
else fail stall_cleared_when_steps_commit "step $s0 -> $(step): $(ctl status | head -3)"; fi
ctl drain >/dev/null 2>&1
wait $sup
exit $FAILED
