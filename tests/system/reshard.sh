#!/usr/bin/env bash
# Resume onto another number of workers (issue 24, part 2). Run A: 2 drafters and 2 targets, killed (SIGKILL to every
# process) at step 25, resumed from checkpoint 20 with 3 drafters, killed at step 45, resumed from 40 with 1 drafter
# and 1 target, killed at 50, resumed with the same numbers to the end (60). Where each is killed is fixed by the
# prefetcher's fault hook (DFLASH_FAULT_HOLD_BATCH: no batch from that id on), so nothing races. The ledger holds
# every step once and every batch once over the whole run (batch ids contiguous), with "resharded" at steps 20 and
# 40 only; status and the summary say so. Run B, the same schedule with no work thrown away (each stage drained at
# its checkpoint step), ends with bitwise the same weights and the same batches per step.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
CTL="$BIN/dflashctl"
STEPS=60
make_fixture || { fail reshard_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
write_config a $STEPS
write_config b $STEPS

lines() { cat "$T/$1/ledger.jsonl" 2>/dev/null | wc -l; }
wait_lines() { # NAME N: until the ledger has N lines (a safety net of 120 s: the hold stops the job there)
    local deadline=$((SECONDS + 120))
    until [ "$(lines "$1")" -ge "$2" ] || [ $SECONDS -ge $deadline ]; do sleep 0.05; done
}
stage() { # NAME HOLD_BATCH STOP_AT HOW ARGS...: run until the ledger has STOP_AT lines, then kill (crash) or drain
    local name=$1 hold=$2 at=$3 how=$4
    shift 4
    DFLASH_FAULT_HOLD_BATCH=$hold "$BIN/dflash" run -c "$T/$name.ini" "$@" >>"$T/$name.out" 2>&1 &
    local sup=$!
    wait_lines "$name" "$at"
    if [ "$how" = status ]; then "$CTL" -c "$T/$name.ini" --wait 30 status >"$T/$name.status" 2>&1; how=kill; fi
    if [ "$how" = kill ]; then
        pkill -9 -f "$T/$name" 2>/dev/null
        wait $sup 2>/dev/null
    else
        "$CTL" -c "$T/$name.ini" --wait 60 drain >/dev/null 2>&1
        wait $sup
    fi
    return 0
}
latest() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"])' "$T/$1/ckpt/latest/trainer_state.json"; }

exec 3>&2 2>/dev/null # the shell's "Killed" notices of the crashed stages are not the test's output
# A: batches: steps 0..19 x 2 = 0..39, steps 20..39 x 3 = 40..99, steps 40..59 x 1 = 100..119
stage a 50 25 kill                                                  # step 25: batch 50 is held
a1=$(latest a)
stage a 115 45 kill --resume --set workers.drafters=3               # 40 + (45 - 20) x 3
a2=$(latest a)
stage a 110 50 status --resume --set workers.drafters=1 --set workers.targets=1   # 100 + (50 - 40)
a3=$(latest a)
"$BIN/dflash" run -c "$T/a.ini" --resume --set workers.drafters=1 --set workers.targets=1 >>"$T/a.out" 2>&1
rc=$?
if [ "$a1" = 20 ] && [ "$a2" = 40 ] && [ "$a3" = 50 ] && [ $rc -eq 0 ]; then
    ok "reshard_run_resumed_three_times (checkpoints $a1, $a2, $a3; 2 -> 3 -> 1 drafters, 2 -> 1 targets)"
else
    fail reshard_run_resumed_three_times "latest after each stage: $a1 $a2 $a3, last exit $rc: $(tail -3 "$T/a.out")"
fi
check=$(python3 - "$T/a/ledger.jsonl" $STEPS <<'EOP'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = int(sys.argv[2])
errs = []
if [l["step"] for l in lines] != list(range(steps)): errs.append("steps are not 0..%d once each" % (steps - 1))
want = lambda k: [2 * k, 2 * k + 1] if k < 20 else [40 + 3 * (k - 20) + r for r in range(3)] if k < 40 else [100 + k - 40]
bad = [l["step"] for l in lines if l["batches"] != want(l["step"])]
if bad: errs.append("steps %s have other batches than the plan's" % bad[:5])
seen = sorted(b for l in lines for b in l["batches"])
if seen != list(range(120)): errs.append("batches are not 0..119 once each")
marks = {l["step"]: l["resharded"] for l in lines if "resharded" in l}
if marks != {20: {"drafters": [2, 3]}, 40: {"drafters": [3, 1], "targets": [2, 1]}}: errs.append("resharded marks: %s" % marks)
print("; ".join(errs) if errs else "60 steps, 120 batches each once, resharded at 20 and 40: %s" % marks)
sys.exit(1 if errs else 0)
EOP
) && ok "reshard_ledger_exactly_once ($check)" || fail reshard_ledger_exactly_once "$check"
if grep -q "^resharded at step 20: drafters 2 -> 3; step 40: drafters 3 -> 1, targets 2 -> 1$" "$T/a.status"; then
    ok "reshard_status_says_so ($(grep resharded "$T/a.status"))"
else
    fail reshard_status_says_so "$(head -4 "$T/a.status")"
fi
if grep -q "^dflash: resharded at step 20: drafters 2 -> 3; step 40: drafters 3 -> 1, targets 2 -> 1 (" "$T/a.out" &&
   grep -q "resharded at step 20: drafters 2 -> 3, targets 2 -> 2; from step 20 on, each step trains 3 batches, from batch 40 on" "$T/a.out"; then
    ok "reshard_console_and_summary_say_so"
else
    fail reshard_console_and_summary_say_so "$(grep -i reshard "$T/a.out" | head -5)"
fi

# B: the same schedule, each stage drained exactly at the step A resumed from
stage b 40 20 drain
stage b 100 40 drain --resume --set workers.drafters=3
run_job b --resume --set workers.drafters=1 --set workers.targets=1
b_steps=$(lines b)
if [ "$b_steps" = $STEPS ] && cmp -s "$(final_weights a)" "$(final_weights b)"; then
    ok "reshard_same_weights_as_the_same_schedule_without_crashes"
else
    fail reshard_same_weights_as_the_same_schedule_without_crashes "B has $b_steps steps; weights $(cmp "$(final_weights a)" "$(final_weights b)" 2>&1)"
fi
if cmp -s <(python3 -c 'import json,sys; [print(json.loads(l)["batches"]) for l in open(sys.argv[1])]' "$T/a/ledger.jsonl") \
          <(python3 -c 'import json,sys; [print(json.loads(l)["batches"]) for l in open(sys.argv[1])]' "$T/b/ledger.jsonl"); then
    ok reshard_same_batches_per_step
else
    fail reshard_same_batches_per_step "the two ledgers' batches differ"
fi
exit $FAILED
