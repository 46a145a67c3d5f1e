#!/usr/bin/env bash
# Control plane with the real dflashd, workers and dflashctl (issue 5): status lists everyone; pause freezes the
# step counter and resume continues it; restarts and rolling restarts of every role while training, the step
# counter never going back; a worker that stops heartbeating is killed and replaced; bad input on the control
# socket (garbage, several frames, truncated protobuf, unknown version, oversized, unknown command, a stale epoch,
# an impostor, a user without permission) is refused while dflashd keeps serving; drain checkpoints and exits 0 with
# every batch in the ledger exactly once.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
CTL="$BIN/dflashctl"
PROBE=${BUILD:-build}/tests/system/ctl_probe
make_fixture || { fail control_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }

write_config ctl 1000000
sed -i -e 's/^checkpoint_every = .*/checkpoint_every = 0/' -e 's/^heartbeat_timeout_sec = .*/heartbeat_timeout_sec = 4/' \
    "$T/ctl.ini"
chmod 755 "$T" # other users may enter $T: only the run_dir's own mode (0750, set by dflashd) keeps them out
# --wait bounds pause, drain and restarts, so that a hang fails the test instead of stalling it
ctl() { "$CTL" -c "$T/ctl.ini" --wait 120 "$@"; }
step() { ctl status 2>/dev/null | awk 'NR == 2 { split($2, a, "/"); print a[1] }'; }
field() { # python expression over the status JSON `d`
    ctl status --json | python3 -c "import json, sys; d = json.load(sys.stdin); w = {x['name']: x for x in d['workers']}; print($1)"
}

"$BIN/dflash" run -c "$T/ctl.ini" >"$T/ctl.out" 2>&1 &
sup=$!
deadline=$((SECONDS + 60))
until [ "$(field "sum(x['state'] == 'running' and x['heartbeat_age_sec'] >= 0 for x in d['workers'])" 2>/dev/null)" = 5 ] &&
      [ "$(step)" -gt 5 ] 2>/dev/null; do
    [ $SECONDS -lt $deadline ] && kill -0 $sup 2>/dev/null || break
    sleep 0.2
done
ctl status >"$T/status.txt" 2>&1
names=$(field "' '.join(x['name'] + ':' + x['state'] for x in d['workers'])" 2>&1)
if [ "$names" = "prefetch-0:running target-0:running target-1:running drafter-0:running drafter-1:running" ] &&
   grep -q "^drafter-1 .* running" "$T/status.txt" && grep -q "^token-ring" "$T/status.txt"; then
    ok "control_status_lists_everyone"
    sed 's/^/    /' "$T/status.txt"
else
    fail control_status_lists_everyone "$names / $(cat "$T/status.txt")"
    exit 1
fi
if ctl config | grep -q "^steps = 1000000"; then ok control_config_readout; else fail control_config_readout "$(ctl config 2>&1 | head -3)"; fi

# a monitor of the step counter through everything that follows
( while kill -0 $sup 2>/dev/null; do step; sleep 0.2; done ) >"$T/steps.txt" 2>/dev/null &
mon=$!

# pause: the step in flight finishes, then the counter stands still; resume continues it
if out=$(ctl pause 2>&1); then
    s1=$(step); sleep 1; s2=$(step)
    held=$(field "d['held'] and all(w['drafter-%d' % i]['state'] == 'held' for i in range(2))")
    if [ -n "$s1" ] && [ "$s1" = "$s2" ] && [ "$held" = True ]; then ok "control_pause_freezes_step ($out; $s1 = $s2 one second later)"
    else fail control_pause_freezes_step "steps $s1 then $s2, held=$held"; fi
else
    fail control_pause_freezes_step "dflashctl pause: $out"
fi
# a restart while paused would wait for the resume without a word: refused, saying so
t0=$SECONDS
if out=$(ctl restart target-0 2>&1); then fail control_restart_while_paused_refused "exit 0: $out"
elif [ $? -eq 1 ] && echo "$out" | grep -q "paused" && [ $((SECONDS - t0)) -lt 10 ]; then ok "control_restart_while_paused_refused ($out)"
else fail control_restart_while_paused_refused "$out"; fi
ctl resume >/dev/null
deadline=$((SECONDS + 30))
until [ "$(step)" -gt "${s2:-0}" ] 2>/dev/null || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
if [ "$(step)" -gt "${s2:-0}" ] 2>/dev/null; then ok "control_resume_continues (step $(step))"; else fail control_resume_continues "step stays at $(step)"; fi

# restarts while training: each returns once the new instance is ready and healthy
for what in "rolling-restart target" "rolling-restart drafter" "restart prefetch-0"; do
    before=$(step)
    if out=$(ctl $what 2>&1); then
        after=$(step)
        if [ "$after" -gt "$before" ]; then ok "control_${what// /_} (step $before -> $after)"
        else fail "control_${what// /_}" "training did not continue: step $before -> $after"; fi
    else
        fail "control_${what// /_}" "$out"
    fi
done
r=$(field "' '.join('%s=%d' % (n, w[n]['restarts']) for n in sorted(w))")
if [ "$r" = "drafter-0=1 drafter-1=1 prefetch-0=1 target-0=1 target-1=1" ]; then ok "control_restart_counts ($r)"
else fail control_restart_counts "$r"; fi
# a rolling restart outlives a restart of dflashd itself: SIGKILL dflashd while the first target is being replaced;
# the restarted dflashd finds the operation in the job state and carries it on, dflashctl keeps following it
keeper=$(field "d['keeper_pid']")
nrestarting=$(grep -c "control: restarting target-" "$T/ctl/logs/dflashd.log")
( ctl rolling-restart target >"$T/roll.out" 2>"$T/roll.err"; echo $? >"$T/roll.rc" ) &
roller=$!
deadline=$((SECONDS + 30))
until [ "$(grep -c "control: restarting target-" "$T/ctl/logs/dflashd.log")" -gt "$nrestarting" ] || [ $SECONDS -ge $deadline ]; do
    sleep 0.05
done
kill -9 "$keeper"
wait $roller
r2=$(field "' '.join('%s=%d' % (n, w[n]['restarts']) for n in sorted(w) if n.startswith('target'))")
if [ "$(cat "$T/roll.rc")" = 0 ] && grep -q "restart of target complete" "$T/roll.out" &&
   grep -q "carrying on the restart of target 0..1" "$T/ctl/logs/dflashd.log" && [ "$r2" = "target-0=2 target-1=2" ] &&
   [ "$(field "d['keeper_pid']")" != "$keeper" ]; then
    ok "control_rolling_restart_outlives_dflashd ($(tr '\n' ';' <"$T/roll.out"); $r2)"
else
    fail control_rolling_restart_outlives_dflashd "exit $(cat "$T/roll.rc"): $(cat "$T/roll.out" "$T/roll.err" | tr '\n' ';'); $r2; $(grep -E "carrying|restart" "$T/ctl/logs/dflashd.log" | tail -3)"
fi
if out=$(ctl restart no-such-worker 2>&1); then fail control_restart_unknown_refused "exit 0: $out"
elif [ $? -eq 1 ]; then ok control_restart_unknown_refused; else fail control_restart_unknown_refused "$out"; fi

# a worker that stops heartbeating (SIGSTOP) is killed and a new instance takes its place
old=$(field "w['target-1']['pid']")
kill -STOP "$old"
deadline=$((SECONDS + 30))
until [ "$(field "w['target-1']['pid']" 2>/dev/null)" != "$old" ] && [ "$(field "w['target-1']['state']" 2>/dev/null)" = running ] ||
      [ $SECONDS -ge $deadline ]; do sleep 0.3; done
new=$(field "w['target-1']['pid']")
if [ "$new" != "$old" ] && ! kill -0 "$old" 2>/dev/null && grep -q "target-1 (pid $old) gave no sign of life" "$T/ctl/logs/dflashd.log"; then
    ok "control_silent_worker_killed (pid $old -> $new)"
else
    fail control_silent_worker_killed "pid $old -> $new; $(grep -i heartbeat "$T/ctl/logs/dflashd.log" | tail -2)"
    kill -9 "$old" 2>/dev/null
fi

# bad input on the control socket: each refused, and dflashd keeps serving
EP="ipc://$T/ctl/ctl"
stale=$(( $(field "w['target-0']['epoch']") - 1 ))
for c in empty garbage multiframe truncated version unknown reply-type oversized "stale $stale" impostor; do
    out=$("$PROBE" "$EP" $c 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && ctl status >/dev/null 2>&1; then ok "control_bad_input_${c%% *} ($out)"
    else fail "control_bad_input_${c%% *}" "probe exit $rc: $out"; fi
done
# a client that connects with a worker's name (as is, or with a made-up token) is refused and logged, and never
# takes the worker's connection over: the worker keeps heartbeating past heartbeat_timeout_sec and is not killed
for who in target-0 "target-0/$(printf '0%.0s' $(seq 32))"; do
    pid0=$(field "w['target-0']['pid']"); starts0=$(field "w['target-0']['restarts']")
    out=$("$PROBE" "$EP" pose "$who" 6 2>&1); rc=$?
    out="$(echo "$out" | wc -l) replies, last: $(echo "$out" | tail -1 | cut -c1-60)"
    if [ $rc -eq 0 ] && [ "$(field "w['target-0']['pid']")" = "$pid0" ] && [ "$(field "w['target-0']['restarts']")" = "$starts0" ] &&
       [ "$(field "w['target-0']['state']")" = running ] && ! grep -q "target-0 (pid $pid0) gave no sign of life" "$T/ctl/logs/dflashd.log" &&
       grep -q "without the token of its registration" "$T/ctl/logs/dflashd.log"; then
        ok "control_worker_name_claim_refused (${who%%/*}${who#target-0}: $out pid $pid0 kept)"
    else
        fail control_worker_name_claim_refused "$who: probe exit $rc: $out; pid $pid0 -> $(field "w['target-0']['pid']"); $(grep -E "target-0|token" "$T/ctl/logs/dflashd.log" | tail -3)"
    fi
done
# a flood of garbage: refused, and logged as a count rather than one line each (at most 20 lines a 10 s window; the
# flood may straddle the end of a window that earlier refusals opened, hence up to two windows' worth)
n0=$(grep -c "(refused)" "$T/ctl/logs/dflashd.log")
out=$("$PROBE" "$EP" flood 5000 2>&1); rc=$?
deadline=$((SECONDS + 15))
until grep -q "more refused messages in the last" "$T/ctl/logs/dflashd.log" || [ $SECONDS -ge $deadline ]; do sleep 0.3; done
n1=$(grep -c "(refused)" "$T/ctl/logs/dflashd.log")
if [ $rc -eq 0 ] && [ $((n1 - n0)) -le 40 ] && ctl status >/dev/null 2>&1 &&
   summary=$(grep -o "[0-9]* more refused messages in the last.*not logged one by one" "$T/ctl/logs/dflashd.log" | tail -1); then
    ok "control_flood_warnings_summarised ($((n1 - n0)) lines for 5000 messages; $summary)"
else
    fail control_flood_warnings_summarised "probe exit $rc: $out; $((n1 - n0)) refusal lines; $(tail -2 "$T/ctl/logs/dflashd.log")"
fi
if out=$(setpriv --reuid=nobody --regid=nogroup --clear-groups "$PROBE" "$EP" status 2>&1); then
    fail control_other_user_refused "user nobody got an answer: $out"
elif [ "$out" = "no reply" ] && [ "$(stat -c %a "$T/ctl")" = 750 ] && ctl status >/dev/null 2>&1; then
    ok "control_other_user_refused (run_dir mode 750: $out)"
else
    fail control_other_user_refused "$out"
fi
"$CTL" frobnicate >/dev/null 2>&1; a=$?
"$CTL" --endpoint "ipc://$T/nowhere/ctl" --timeout 1 status >/dev/null 2>&1; b=$?
if [ $a -eq 2 ] && [ $b -eq 2 ]; then ok control_ctl_usage_and_unreachable_exit_2
else fail control_ctl_usage_and_unreachable_exit_2 "unknown command: $a, unreachable: $b"; fi
# a missing ipc socket fails at once (not after --timeout); an endpoint of no known kind says so
t0=$(date +%s%N)
out1=$("$CTL" --endpoint "ipc://$T/nowhere/ctl" status 2>&1); b=$?
ms=$((($(date +%s%N) - t0) / 1000000))
out2=$("$CTL" --endpoint bogus://x status 2>&1); c=$?
if [ $b -eq 2 ] && [ $ms -lt 1000 ] && echo "$out1" | grep -q "no such socket" && [ $c -eq 2 ] &&
   echo "$out2" | grep -q "not an endpoint dflashd serves"; then ok "control_ctl_endpoint_errors ($ms ms: $out1 / $out2)"
else fail control_ctl_endpoint_errors "$b after $ms ms: $out1 / $c: $out2"; fi

# drain: every issued batch trained, a checkpoint, a clean exit
if out=$(ctl drain 2>&1); then
    wait $sup
    rc=$?
    stop=$(echo "$out" | sed -n 's/^drained: \([0-9]*\) steps.*/\1/p')
    if [ $rc -eq 0 ] && [ -n "$stop" ] && [ -d "$T/ctl/ckpt/$(printf 'step-%08d' "$stop")" ] && [ -e "$T/ctl/ckpt/latest" ]; then
        ok "control_drain_checkpoints_and_exits_0 (${out//$'\n'/; })"
    else
        fail control_drain_checkpoints_and_exits_0 "dflash run exit $rc; $out; $(ls "$T/ctl/ckpt" 2>&1 | tail -3)"
    fi
    if msg=$(check_ledger ctl "$stop" 2); then ok "control_ledger_exactly_once ($msg)"; else fail control_ledger_exactly_once "$msg"; fi
else
    fail control_drain_checkpoints_and_exits_0 "$out"
fi
wait $mon 2>/dev/null
if python3 - "$T/steps.txt" <<'EOP'
import sys
v = [int(l) for l in open(sys.argv[1]) if l.strip().isdigit()]
bad = [(a, b) for a, b in zip(v, v[1:]) if b < a]
print("%d samples, %d -> %d%s" % (len(v), v[0] if v else -1, v[-1] if v else -1, ", went back: %s" % bad[:3] if bad else ""))
sys.exit(1 if bad or len(v) < 10 else 0)
EOP
then ok control_step_never_went_back; else fail control_step_never_went_back "$(tail -3 "$T/steps.txt")"; fi

# a job stopped in the middle of a rolling restart: dflashd exits cleanly and removes its socket, and dflashctl, which
# follows the restart, says so and exits 2 soon after, instead of waiting out its --wait as for a dflashd restarting
write_config gone 1000000
sed -i -e 's/^checkpoint_every = .*/checkpoint_every = 0/' "$T/gone.ini"
gctl() { "$CTL" -c "$T/gone.ini" --wait 120 "$@"; }
"$BIN/dflash" run -c "$T/gone.ini" >"$T/gone.out" 2>&1 &
sup=$!
deadline=$((SECONDS + 60))
until [ "$(gctl status 2>/dev/null | awk 'NR == 2 { split($2, a, "/"); print a[1] }')" -gt 5 ] 2>/dev/null; do
    [ $SECONDS -lt $deadline ] && kill -0 $sup 2>/dev/null || break
    sleep 0.2
done
t0=$(date +%s%N)
( gctl rolling-restart drafter >"$T/gone-roll.out" 2>"$T/gone-roll.err"; echo $? >"$T/gone-roll.rc"
  echo $((($(date +%s%N) - t0) / 1000000)) >"$T/gone-roll.ms" ) &
roller=$!
deadline=$((SECONDS + 30))
until grep -q "control: restarting drafter-" "$T/gone/logs/dflashd.log" 2>/dev/null || [ $SECONDS -ge $deadline ]; do
    sleep 0.05
done
restarting=$(grep -c "control: restarting drafter-" "$T/gone/logs/dflashd.log" 2>/dev/null)
kill -TERM $sup
wait $sup
sup_rc=$?
# dflashd has exited by now; a socket file it left behind would leave dflashctl waiting out its --wait: say so now
if [ -e "$T/gone/ctl" ]; then
    kill -TERM $(pgrep -P $roller) 2>/dev/null # the dflashctl
    socket="left behind by the dflashd that exited"
else
    socket=removed
fi
wait $roller
left=$(pgrep -f "$T/gone" | tr '\n' ' ')
if [ "$restarting" -gt 0 ] 2>/dev/null && [ "$(cat "$T/gone-roll.rc")" = 2 ] &&
   grep -q "has stopped (its socket is gone)" "$T/gone-roll.err" && [ "$(cat "$T/gone-roll.ms")" -lt 60000 ] &&
   [ "$socket" = removed ] && [ -z "$left" ]; then
    ok "control_restart_follower_sees_job_stop (dflash run exit $sup_rc; dflashctl exit 2 after $(cat "$T/gone-roll.ms") ms: $(tail -1 "$T/gone-roll.err"))"
else
    fail control_restart_follower_sees_job_stop "restarting lines $restarting; dflash run exit $sup_rc; dflashctl exit $(cat "$T/gone-roll.rc") after $(cat "$T/gone-roll.ms") ms: $(cat "$T/gone-roll.out" "$T/gone-roll.err" | tr '\n' ';'); socket $T/gone/ctl $socket; left running: ${left:-none}; $(tail -2 "$T/gone/logs/dflashd.log")"
    [ -n "$left" ] && kill -9 $left 2>/dev/null
fi
exit $FAILED
