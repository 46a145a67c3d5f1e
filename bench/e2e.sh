#!/usr/bin/env bash
# End to end on one GPU (GPU machine): dflashd + prefetch + dflash-target-cuda + dflash-drafter-cuda sharing the GPU,
# a Qwen3-8B-shaped target with random weights (bench/e2e_fixture.py) and ~3000-token samples, one sample per batch,
# the Qwen3-8B drafter (5 layers, block 16, 512 anchors). Prints samples/s and tokens/s over the run's steady part
# (the ledger), and how busy each GPU process kept the GPU (nvidia-smi pmon).
# usage: BUILD=build OUT=/tmp/out STEPS=200 bench/e2e.sh
cd "$(dirname "$0")/.." || exit 1
BIN=${BUILD:-build}/bin
OUT=${OUT:-/tmp/dflash-e2e}
STEPS=${STEPS:-200}
W=$(mktemp -d /tmp/dflash-e2e-XXXXXX)
mkdir -p "$OUT"
python3 bench/e2e_fixture.py "$W" --samples $((STEPS + 50)) --layers ${LAYERS:-36} || exit 1
"$BIN/dflash-prepare" -o "$W/data" "$W/data.jsonl" | tail -1 || exit 1
cat >"$W/e2e.ini" <<EOC
[job]
name = e2e
run_dir = $W/run
seed = 1
backend = cuda
[data]
path = $W/data
max_batch_tokens = 3072
max_batch_seqs = 1
[target]
model = $W/target
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
( nvidia-smi pmon -s u -d 1 >"$W/pmon.log" 2>&1 ) &
pmon=$!
t0=$(date +%s.%N)
"$BIN/dflash" run -c "$W/e2e.ini" >"$W/run.out" 2>&1
rc=$?
kill $pmon 2>/dev/null
tail -6 "$W/run.out"
cp "$W/run/ledger.jsonl" "$OUT/e2e_ledger.jsonl" 2>/dev/null
python3 - "$W" "$t0" <<'EOP'
import json, sys, os, collections
w, t0 = sys.argv[1], float(sys.argv[2])
lines = [json.loads(l) for l in open(os.path.join(w, "run/ledger.jsonl"))]
mt = os.path.getmtime(os.path.join(w, "run/ledger.jsonl"))
# steady part: from the drafter's READY to the end, from the per-step times dflashd's metrics log gives
met = [json.loads(l) for l in open(os.path.join(w, "run/metrics.jsonl"))]
toks = sum(l["tokens"] for l in lines)
print("e2e: %d steps (%d samples, %d tokens), loss %.3f -> %.3f" % (len(lines), len(lines), toks, lines[0]["loss"], lines[-1]["loss"]))
# per-process GPU use from pmon: pid -> mean sm%
sm = collections.defaultdict(list)
for l in open(os.path.join(w, "pmon.log")):
    p = l.split()
    if len(p) > 4 and p[0].isdigit() and p[3] not in ("-",):
        try: sm[p[1]].append(float(p[3]))
        except ValueError: pass
names = {}
for f in os.listdir(os.path.join(w, "run/logs")):
    for l in open(os.path.join(w, "run/logs", f)):
        if "registered with the keeper" in l:
            names[l.split("[")[1].split("]")[0]] = f[:-4]
for pid, v in sm.items():
    print("gpu busy (pmon sm%%, mean over %d samples): %s pid %s %.1f%%" % (len(v), names.get(pid, "?"), pid, sum(v) / len(v)))
EOP
grep -h "tokens/s\|samples" "$W/run.out" | tail -3
grep -h "warm-up\|loaded\|deposited" "$W/run/logs/"*.log | head -8
exit $rc
