#!/usr/bin/env bash
# End to end on one GPU (GPU machine): dflashd + prefetch + dflash-target-cuda + dflash-drafter-cuda sharing the GPU,
# a target with random weights (bench/e2e_fixture.py: FAMILY=qwen3, the default, the Qwen3-8B shape; FAMILY=qwen3_5
# the Qwen3.5-9B hybrid shape; qwen3_moe the Qwen3-30B-A3B shape; gpt_oss the gpt-oss-20b shape) and ~3000-token
# samples, SEQS of them a batch (default 1; bench/e2e_job.bash), the drafter the job derives from the target (5 layers,
# its hidden size, block 16, 512 anchors a sequence, the spec's 5 default taps). Prints samples/s and tokens/s over the
# run's steady part (the ledger), and how busy each GPU process kept the GPU (nvidia-smi pmon).
# usage: BUILD=build OUT=/tmp/out STEPS=200 [FAMILY=qwen3|qwen3_5|qwen3_moe|gpt_oss] [LAYERS=N] [SEQS=N] bench/e2e.sh
# WORK=DIR: the work folder (default a new /tmp/dflash-e2e-XXXXXX, left in place); a WORK that already holds
# target/config.json and data.jsonl is used as it is (no fixture made). RUN_TIMEOUT=S ends the run after S seconds
# (the steady figure is then read off the steps committed by then). BACKEND=cpu runs the job on the CPU workers
# (e2e.sh's own test, tests/system/e2e_ini.sh, on a tiny hybrid target).
cd "$(dirname "$0")/.." || exit 1
BIN=${BUILD:-build}/bin
OUT=${OUT:-/tmp/dflash-e2e}
STEPS=${STEPS:-200}
SEQS=${SEQS:-1}
case $SEQS in [1-9] | [1-9][0-9]) ;; *) echo "e2e: SEQS=$SEQS: want the samples per batch, 1-99" >&2; exit 2 ;; esac
W=${WORK:-$(mktemp -d /tmp/dflash-e2e-XXXXXX)}
mkdir -p "$OUT" "$W"
if [ -f "$W/target/config.json" ] && [ -f "$W/data.jsonl" ]; then
    echo "e2e: the target and data already in $W are used as they are"
else
    python3 bench/e2e_fixture.py "$W" --family "${FAMILY:-qwen3}" --samples $((STEPS * SEQS + 50)) \
        ${LAYERS:+--layers $LAYERS} || exit 1
fi
"$BIN/dflash-prepare" -o "$W/data" "$W/data.jsonl" | tail -1 || exit 1
. bench/e2e_job.bash
# a SEQS=N > 1 run has its own run folder (run-seqsN), so one WORK serves both kinds of run
R=run; [ "$SEQS" = 1 ] || R=run-seqs$SEQS
e2e_job_config "$W/$R.ini" e2e "$W/$R" "$W"
# pmon's lines and the ledger's growth, each with the time it was seen: the steady part is read off them below
stamp='import sys, time
for l in sys.stdin: print("%.3f %s" % (time.time(), l.rstrip()), flush=True)'
: >"$W/pmon.log"
command -v nvidia-smi >/dev/null && { nvidia-smi pmon -s u -d 1 2>&1 | python3 -u -c "$stamp" >"$W/pmon.log" & }
python3 - "$W/$R/ledger.jsonl" >"$W/$R.poll" <<'EOP' &
import os, sys, time
last = -1
while True:
    try: n = open(sys.argv[1], "rb").read().count(b"\n")
    except OSError: n = 0
    if n != last: print("%.4f %d" % (time.time(), n), flush=True); last = n
    time.sleep(0.01)
EOP
poller=$!
t0=$(date +%s.%N)
${RUN_TIMEOUT:+timeout -k 15 $RUN_TIMEOUT} "$BIN/dflash" run -c "$W/$R.ini" >"$W/$R.out" 2>&1
rc=$?
kill $poller 2>/dev/null
pkill -f "nvidia-smi pmon" 2>/dev/null
tail -6 "$W/$R.out"
cp "$W/$R/ledger.jsonl" "$OUT/e2e_ledger.jsonl" 2>/dev/null
python3 - "$W/$R" "$t0" "$SEQS" <<'EOP'
import json, sys, os, collections
w, t0, seqs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])  # every batch holds seqs samples (e2e_job.bash)
try: lines = [json.loads(l) for l in open(os.path.join(w, "ledger.jsonl"))]
except OSError: lines = []
if not lines: sys.exit("e2e: no step committed (see %s.out and %s/logs)" % (w, w))
toks = sum(l["tokens"] for l in lines)
print("e2e: %d steps (%d samples, %d tokens), loss %.3f -> %.3f" % (len(lines), seqs * len(lines), toks,
                                                                     lines[0]["loss"], lines[-1]["loss"]))
# the steady part: from the 10th committed step to the last, timed by the poller
poll = [tuple(map(float, l.split())) for l in open(w + ".poll") if len(l.split()) == 2]
first = next(((t, n) for t, n in poll if n >= 10), None)
t_end, n_end = poll[-1]
if first and n_end > first[1]:
    t_a, n_a = first
    st_tok = sum(l["tokens"] for l in lines[int(n_a):int(n_end)])
    dt = t_end - t_a
    print("e2e steady (steps %d-%d, %.1f s): %.2f samples/s, %.0f tokens/s, %.0f ms a step" %
          (n_a, n_end, dt, seqs * (n_end - n_a) / dt, st_tok / dt, 1000 * dt / (n_end - n_a)))
else:
    t_a = t_end
    print("e2e steady: fewer than 10 steps, no steady figure")
# per-process GPU use from pmon (lines: time gpu pid type sm% ...), over the steady part only
sm = collections.defaultdict(list)
for l in open(os.path.join(os.path.dirname(w), "pmon.log")):
    p = l.split()
    if len(p) > 5 and p[2].isdigit() and t_a <= float(p[0]) <= t_end:
        try: sm[p[2]].append(float(p[4]))
        except ValueError: pass
names = {}
for f in os.listdir(os.path.join(w, "logs")):
    for l in open(os.path.join(w, "logs", f)):
        if "registered with the keeper" in l:
            names[l.split("[")[1].split("]")[0]] = f[:-4]
for pid, v in sm.items():
    print("gpu busy in the steady part (pmon sm%%, mean over %d samples): %s pid %s %.1f%%" %
          (len(v), names.get(pid, "?"), pid, sum(v) / len(v)))
EOP
grep -h "tokens/s\|samples" "$W/$R.out" | tail -3
grep -h "warm-up\|loaded\|deposited" "$W/$R/logs/"*.log | head -8
exit $rc
