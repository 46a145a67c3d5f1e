#!/usr/bin/env bash
# How long a restart keeps the pipeline from committing a step, at 8B scale (GPU machine): the end-to-end job of
# bench/e2e.sh (a Qwen3-8B-shaped target with random weights, bench/e2e_fixture.py; the 5-layer drafter; ~3000-token
# samples) under `dflash run`, once with target.keep_weights = true and once with false. In each run, as in
# tests/gpu/gpu_train.sh: `dflashctl rolling-restart target`, a SIGKILL of target-0, `rolling-restart drafter`, a
# SIGKILL of drafter-0, one after the other, each followed by GAP_STEPS committed steps; a poller notes when the
# ledger grows and the longest gap between two commits inside each operation's window is printed, with the
# restarted target's own log lines (load or re-import, warm-up).
# usage: BUILD=build STEPS=150 bench/restart_gap.sh
cd "$(dirname "$0")/.." || exit 1
BIN=${BUILD:-build}/bin
CTL="$BIN/dflashctl"
STEPS=${STEPS:-150}
GAP_STEPS=${GAP_STEPS:-12}
W=$(mktemp -d /tmp/dflash-gap-XXXXXX)
python3 bench/e2e_fixture.py "$W" --samples $((2 * STEPS + 50)) --layers ${LAYERS:-36} || exit 1
"$BIN/dflash-prepare" -o "$W/data" "$W/data.jsonl" | tail -1 || exit 1

config() { # NAME KEEP
    cat >"$W/$1.ini" <<EOC
[job]
name = gap-$1
run_dir = $W/$1
seed = 1
backend = cuda
[data]
path = $W/data
max_batch_tokens = 3072
max_batch_seqs = 1
[target]
model = $W/target
keep_weights = $2
[drafter]
layers = 5
block_size = 16
num_taps = 5
max_anchors = 512
[train]
steps = $STEPS
warmup_steps = 10
checkpoint_every = 0
[workers]
targets = 1
drafters = 1
watchdog_sec = 300
heartbeat_timeout_sec = 300
[ring]
token_slots = 4
pool_slots = 3
EOC
}
lines() { [ -f "$W/$1/ledger.jsonl" ] && wc -l <"$W/$1/ledger.jsonl" || echo 0; }
wait_step() { local d=$((SECONDS + 300)); until [ "$(lines "$1")" -ge "$2" ] || [ $SECONDS -ge $d ]; do sleep 0.05; done; }
pid_of() { awk -v v="$2" '$1 == v && $2 > 0 {print $2}' "$W/$1/supervisor.state" 2>/dev/null; }
sigkill() { local p; p=$(pid_of "$1" "$2"); [ -n "$p" ] && kill -9 "$p"; }

one_run() { # NAME KEEP
    local name=$1 sup poller
    config "$name" "$2"
    "$BIN/dflash" run -c "$W/$name.ini" >"$W/$name.out" 2>&1 &
    sup=$!
    python3 - "$W/$name/ledger.jsonl" >"$W/$name.poll" <<'EOP' &
import os, sys, time
last = -1
while True:
    try: n = os.path.getsize(sys.argv[1])
    except OSError: n = 0
    if n != last: print("%.4f %d" % (time.time(), n), flush=True); last = n
    time.sleep(0.002)
EOP
    poller=$!
    op() { # LABEL COMMAND...
        local label=$1 t0 n
        shift
        t0=$(date +%s.%N)
        "$@" >>"$W/$name.ctl" 2>&1 || echo "$name: $label failed: $(tail -2 "$W/$name.ctl")"
        n=$(lines "$name")
        wait_step "$name" $((n + GAP_STEPS))
        echo "$label $t0 $(date +%s.%N)" >>"$W/$name.ops"
    }
    wait_step "$name" 15
    op rolling_restart_target "$CTL" -c "$W/$name.ini" --wait 300 rolling-restart target
    op sigkill_target sigkill "$name" target-0
    op rolling_restart_drafter "$CTL" -c "$W/$name.ini" --wait 300 rolling-restart drafter
    op sigkill_drafter sigkill "$name" drafter-0
    local done_at
    done_at=$(lines "$name")
    wait $sup
    echo "$name (target.keep_weights = $2): dflash run exit $?, operations done by step $done_at of $STEPS"
    kill $poller 2>/dev/null
    python3 - "$W/$name.poll" "$W/$name.ops" "$2" <<'EOP'
import sys
poll = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if len(l.split()) == 2]
arrivals = [t for t, n in poll if n > 0]
steady = sorted(b - a for a, b in zip(arrivals, arrivals[1:]))
out = ["median step %.3fs" % steady[len(steady) // 2]] if steady else []
for l in open(sys.argv[2]):
    name, t0, t1 = l.split(); t0, t1 = float(t0), float(t1)
    inside = [t for t in arrivals if t0 - 0.5 <= t <= t1]
    gap = max((b - a for a, b in zip(inside, inside[1:])), default=t1 - t0)
    out.append("%s %.2fs" % (name, gap))
print("restart gaps (keep_weights = %s): longest commit gap: %s" % (sys.argv[3], "; ".join(out)))
EOP
    grep -h "registered with the keeper\|re-imported the target's weights\|loaded the target's weights\|reloaded\|not reused\|warm-up\|up to layer" \
        "$W/$name/logs/target-0.log" | sed 's/^/  target: /' | cut -c1-260
    grep -h "re-imported the training state\|warm-up" "$W/$name/logs/drafter-0.log" | sed 's/^/  drafter: /' | cut -c1-200
}
one_run keep true
one_run nokeep false
rm -rf "$W"
