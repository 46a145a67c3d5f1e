#!/usr/bin/env bash
# A checkpoint that cannot be written (issue 14, item 4): a full disk, a read-only or forbidden ckpt folder is no
# crash loop. The job holds at the committed step with the reason in `dflashctl status`, dflashd.log and the console
# of `dflash run`; drafter-0 is not restarted; once the folder can be written again the job goes on and finishes
# with every step in the ledger once. Drained while it cannot write, the job ends and says that the checkpoint is
# missing. As a user the ckpt folder is made read-only (a real EACCES); as root, where that does not stop writes,
# the checkpoint writer's fault hook DFLASH_FAULT_CKPT_ENOSPC makes its writes fail with ENOSPC. The ledger on a
# full disk (fault hook DFLASH_FAULT_LEDGER_ENOSPC): dflashd says so once, keeps no partial line, the job holds, and
# goes on with an exact ledger once the line can be written.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
CTL="$BIN/dflashctl"
STEPS=30
make_fixture || { fail disk_full_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }

# block NAME / unblock NAME: make run_dir NAME's checkpoints fail, or succeed again
if [ "$(id -u)" = 0 ]; then
    block() { touch "$T/$1.full"; }
    unblock() { rm -f "$T/$1.full"; }
    reason="No space left on device"
else
    block() { until [ -f "$T/$1/ckpt/identity.json" ]; do sleep 0.05; done; chmod 0555 "$T/$1/ckpt"; }
    unblock() { chmod 0755 "$T/$1/ckpt"; }
    reason="Permission denied"
fi
start() { # NAME: dflash run in the background with the checkpoints blocked before the first one (step 10)
    write_config "$1" $STEPS "[train]
checkpoint_retry_sec = 0.5"
    [ "$(id -u)" = 0 ] && block "$1"
    DFLASH_FAULT_CKPT_ENOSPC="$T/$1.full" "$BIN/dflash" run -c "$T/$1.ini" >"$T/$1.out" 2>&1 &
    sup=$!
    [ "$(id -u)" = 0 ] || block "$1"
}
ctl() { "$CTL" -c "$T/$1.ini" --wait 60 "${@:2}"; }
restarts() { awk '$1 == "drafter-0" {print $3}' "$T/$1/supervisor.state" 2>/dev/null; }
wait_holding() { # NAME: until status says HOLDING (30 s)
    local deadline=$((SECONDS + 30))
    until ctl "$1" status 2>/dev/null | grep -q "^HOLDING" || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
}

start full
wait_holding full
st=$(ctl full status 2>/dev/null)
hold=$(echo "$st" | grep "^HOLDING")
if echo "$st" | head -1 | grep -q holding && echo "$hold" | grep -q "checkpoint of step 10 ($reason" &&
    echo "$st" | grep -q "^step 10/$STEPS"; then
    ok "disk_full_status_says_holding_and_why ($(echo "$hold" | cut -c1-150)...)"
else
    fail disk_full_status_says_holding_and_why "$st"
fi
pid1=$(awk '$1 == "drafter-0" {print $2}' "$T/full/supervisor.state")
sleep 3 # six retries
pid2=$(awk '$1 == "drafter-0" {print $2}' "$T/full/supervisor.state")
step=$(ctl full status 2>/dev/null | awk 'NR == 2 { split($2, a, "/"); print a[1] }')
if [ "$pid1" = "$pid2" ] && [ "$(restarts full)" = 0 ] && ! grep -q "restarting drafter" "$T/full.out" &&
    [ "$step" = 10 ] && kill -0 "$pid1" 2>/dev/null; then
    ok "disk_full_holds_without_restarts (drafter-0 pid $pid1 kept, step $step)"
else
    fail disk_full_holds_without_restarts "pid $pid1 -> $pid2, restarts $(restarts full), step $step: $(grep restarting "$T/full.out" | tail -1)"
fi
if grep -q "WARN.*cannot write the checkpoint of step 10 ($reason" "$T/full.out" &&
    grep -q "ERROR.*cannot write the checkpoint of step 10" "$T/full/logs/dflashd.log"; then
    ok "disk_full_reason_on_the_console_and_in_the_log"
else
    fail disk_full_reason_on_the_console_and_in_the_log "$(tail -3 "$T/full.out")"
fi
unblock full
deadline=$((SECONDS + 60))
while kill -0 $sup 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
wait $sup
rc=$?
if [ $rc -eq 0 ] && grep -q "checkpoint of step 10 is written (after [0-9]* attempts): the job goes on" "$T/full.out" &&
    [ -f "$T/full/ckpt/step-00000010/optimizer.safetensors" ] && [ "$(readlink "$T/full/ckpt/latest")" = step-00000030 ]; then
    ok "disk_full_goes_on_once_it_can_write"
else
    fail disk_full_goes_on_once_it_can_write "exit $rc: $(tail -3 "$T/full.out"); $(ls "$T/full/ckpt")"
fi
if msg=$(check_ledger full $STEPS 2); then ok "disk_full_ledger_exactly_once ($msg)"; else fail disk_full_ledger_exactly_once "$msg"; fi

# drained while it cannot write: the job ends at the committed step and says that its checkpoint is missing
start drain
wait_holding drain
out=$(ctl drain drain 2>&1)
deadline=$((SECONDS + 30))
while kill -0 $sup 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
wait $sup
rc=$?
unblock drain
if echo "$out" | grep -q "drained: 10 steps trained, but their checkpoint could not be written" &&
    [ ! -e "$T/drain/ckpt/latest" ] && grep -q "WARNING: no checkpoint was written" "$T/drain.out" &&
    msg=$(check_ledger drain 10 2); then
    ok "disk_full_drain_ends_without_the_checkpoint_and_says_so (exit $rc; $msg)"
else
    fail disk_full_drain_ends_without_the_checkpoint_and_says_so "exit $rc: $out; $(ls "$T/drain/ckpt"); $(tail -2 "$T/drain.out")"
fi
# the ledger cannot be written: held and reported once, no torn line, exact once it can write again
write_config led $STEPS
touch "$T/led.full"
DFLASH_FAULT_LEDGER_ENOSPC="$T/led.full" "$BIN/dflash" run -c "$T/led.ini" >"$T/led.out" 2>&1 &
sup=$!
wait_holding led
sleep 1
st=$(ctl led status 2>/dev/null)
if echo "$st" | grep -q "^HOLDING: dflashd cannot write the ledger line of step 0 (.*ledger.jsonl: No space left on device)" &&
    [ ! -s "$T/led/ledger.jsonl" ] && [ "$(grep -c "cannot write the line of step" "$T/led/logs/dflashd.log")" = 1 ] &&
    grep -q "WARN.*dflashd cannot write the ledger line of step 0" "$T/led.out"; then
    ok "disk_full_ledger_held_and_reported_once ($(echo "$st" | grep "^HOLDING" | cut -c1-90)...)"
else
    fail disk_full_ledger_held_and_reported_once "$(echo "$st" | head -3); $(grep -c "cannot write the line" "$T/led/logs/dflashd.log") log lines"
fi
rm -f "$T/led.full"
deadline=$((SECONDS + 60))
while kill -0 $sup 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
wait $sup
rc=$?
if [ $rc -eq 0 ] && grep -q "the ledger line of step 0 is written" "$T/led.out" && msg=$(check_ledger led $STEPS 2); then
    ok "disk_full_ledger_goes_on_exactly_once ($msg)"
else
    fail disk_full_ledger_goes_on_exactly_once "exit $rc: $(tail -2 "$T/led.out"); $(check_ledger led $STEPS 2)"
fi
exit $FAILED
