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
STEPS=${STEPS:-6000}
CTL="$BIN/dflashctl"

"$BIN/dflash-demo" make-target "$T/target" --seed 11 --hidden 128 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 \
    --intermediate 256 --vocab 512 --dtype bf16 >/dev/null 2>"$T/fixture.log" &&
"$BIN/dflash-demo" make-data -q --target "$T/target" -o "$T/data.jsonl" --samples 64 --answer-len 40 --seed 5 \
    >/dev/null 2>>"$T/fixture.log" &&
"$BIN/dflash-prepare" -o "$T/data" "$T/data.jsonl" >/dev/null 2>>"$T/fixture.log" ||
    { fail gpu_train_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }

gpu_config() { # NAME
    cat >"$T/$1.ini" <<EOC
[job]
name = t$$-$1
run_dir = $T/$1
seed = 77
backend = cuda
[data]
path = $T/data
max_batch_tokens = 256
max_batch_seqs = 8
[target]
model = $T/target
[drafter]
layers = 2
block_size = 4
num_taps = 3
max_anchors = 16
[train]
steps = $STEPS
warmup_steps = 3
checkpoint_every = 1000
lr = 3e-3
[workers]
targets = 1
drafters = 1
watchdog_sec = 120
heartbeat_timeout_sec = 120
[ring]
token_slots = 4
pool_slots = 3
EOC
}
ledger_lines() { [ -f "$T/$1/ledger.jsonl" ] && wc -l <"$T/$1/ledger.jsonl" || echo 0; }
wait_step() { # NAME STEP: until the ledger has STEP lines (or 300 s)
    local d=$((SECONDS + 300))
    until [ "$(ledger_lines "$1")" -ge "$2" ] || [ $SECONDS -ge $d ]; do sleep 0.05; done
}
kill_worker() { # NAME WORKER: SIGKILL the running instance of WORKER (drafter-0, target-0) of run NAME
    local pid
    pid=$(awk -v v="$2" '$1 == v && $2 > 0 {print $2}' "$T/$1/supervisor.state" 2>/dev/null)
    [ -n "$pid" ] && kill -9 "$pid"
}

t0=$SECONDS
gpu_config a
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

gpu_config b
run_job b && cmp -s "$(final_weights a)" "$(final_weights b)" && ok gpu_train_twice_bitwise_identical ||
    fail gpu_train_twice_bitwise_identical "two runs differ: $(tail -3 "$T/b.out")"

# SIGKILL the GPU drafter twice at moments picked at random (dflash run restarts it)
gpu_config c
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
gpu_config d
"$BIN/dflash" run -c "$T/d.ini" >"$T/d.out" 2>&1 &
sup=$!
# a poller notes when the ledger grows, so the longest commit gap during each operation can be read off
python3 - "$T/d/ledger.jsonl" >"$T/d.poll" <<'EOP' &
import os, sys, time
last = -1
while True:
    try: n = os.path.getsize(sys.argv[1])
    except OSError: n = 0
    if n != last: print("%.4f %d" % (time.time(), n), flush=True); last = n
    time.sleep(0.002)
EOP
poller=$!
op() { # LABEL COMMAND...: run it (it must succeed), note its window
    local label=$1 t_start rc n
    shift
    t_start=$(date +%s.%N)
    "$@" >>"$T/d.ctl" 2>&1
    rc=$?
    [ $rc -eq 0 ] || fail "gpu_train_$label" "exit $rc: $(tail -3 "$T/d.ctl")"
    n=$(ledger_lines d)
    wait_step d $((n + 20))
    echo "$label $t_start $(date +%s.%N)" >>"$T/d.ops"
}
wait_step d $((STEPS / 10))
op rolling_restart_target "$CTL" -c "$T/d.ini" --wait 300 rolling-restart target
op rolling_restart_drafter "$CTL" -c "$T/d.ini" --wait 300 rolling-restart drafter
op sigkill_target kill_worker d target-0
op sigkill_drafter kill_worker d drafter-0
still=$(ledger_lines d)
[ "$still" -lt $STEPS ] && ok "gpu_train_operations_under_load (done by step $still of $STEPS)" ||
    fail gpu_train_operations_under_load "the run ended before the operations did: raise STEPS"
wait $sup
rc=$?
kill $poller 2>/dev/null
gaps=$(python3 - "$T/d.poll" "$T/d.ops" <<'EOP'
import sys
poll = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if len(l.split()) == 2]
arrivals = [t for t, n in poll if n > 0]   # times the ledger was seen to grow
steady = [b - a for a, b in zip(arrivals, arrivals[1:])]
steady.sort()
out = ["median step %.3fs" % steady[len(steady) // 2]] if steady else []
for l in open(sys.argv[2]):
    name, t0, t1 = l.split(); t0, t1 = float(t0), float(t1)
    inside = [t for t in arrivals if t0 - 0.5 <= t <= t1]
    gap = max((b - a for a, b in zip(inside, inside[1:])), default=t1 - t0)
    out.append("%s: longest commit gap %.2fs" % (name, gap))
print("; ".join(out))
EOP
)
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
