# Shared helpers of the GPU system tests and the restart benchmark (sourced after tests/system/lib.bash): their
# fixture, their job config, the checks of a training run, and the commit-gap measurement of an operation on a
# running job. BACKEND (default cuda) is the backend of every job and command they run: BACKEND=cpu runs a script on
# the CPU workers, the way to check it off the GPU machine (checks of what only the GPU does then fail: device
# weights and pools re-imported, warm-up lines, GPU memory).
BACKEND=${BACKEND:-cuda}
CTL="$BIN/dflashctl"   # the control client (rolling restarts)

# gpu_target [SEED]: the tiny bf16 target at $T/target (hidden 128, 4 layers, 4/2 heads of 32, FFN 256, vocabulary
# 512; seed 11 by default; another seed gives other weights of the same shape). Messages to $T/fixture.log.
gpu_target() {
    "$BIN/dflash-demo" make-target "$T/target" --seed "${1:-11}" --hidden 128 --layers 4 --heads 4 --kv-heads 2 \
        --head-dim 32 --intermediate 256 --vocab 512 --dtype bf16 >/dev/null 2>>"$T/fixture.log"
}

# gpu_fixture: gpu_target and its self-distilled data prepared at $T/data (64 samples, answers of 40 tokens).
gpu_fixture() { gpu_target 11 && prepared_data "$T/target" "$T/data"; }

# ONE_DEVICE: the set_ini edits that put a job on one device: job.backend = $BACKEND, one target and one drafter,
# 120 s watchdog and heartbeat timeout (a CUDA worker's start is slow).
ONE_DEVICE=(job.backend="$BACKEND" workers.targets=1 workers.drafters=1 workers.watchdog_sec=120
            workers.heartbeat_timeout_sec=120)

# gpu_config NAME [SECTION.KEY=VALUE...]: write_config's job of $STEPS steps on one device; then the edits.
gpu_config() {
    local name=$1
    shift
    write_config "$name" "$STEPS" && set_ini "$T/$name.ini" "${ONE_DEVICE[@]}" "$@"
}

# gpu_train_config NAME [SECTION.KEY=VALUE...]: gpu_config's job with the training load of gpu_train.sh (256-token
# batches, a 2-layer drafter with 3 taps and 16 anchors, 3 pool slots, a checkpoint every 1000 steps); then the edits.
gpu_train_config() {
    local name=$1
    shift
    gpu_config "$name" data.max_batch_tokens=256 drafter.layers=2 drafter.num_taps=3 drafter.max_anchors=16 \
        ring.pool_slots=3 train.checkpoint_every=1000 "$@"
}

# ledger_poller NAME PID: until process PID (the run's `dflash run`) has ended, appends "TIME LINES" to $T/NAME.poll
# each time run NAME's ledger is seen to grow (polled every 2 ms, reading only what was added). Run it in the
# background; it ends by itself after PID.
ledger_poller() {
    python3 - "$T/$1/ledger.jsonl" "$2" >>"$T/$1.poll" <<'EOP'
import os, sys, time
path, pid = sys.argv[1], int(sys.argv[2])
f, n, last = None, 0, -1
while True:
    alive = os.path.exists("/proc/%d" % pid)
    if f is None:
        try: f = open(path, "rb")
        except OSError: pass
    if f is not None: n += f.read().count(b"\n")
    if n != last: print("%.4f %d" % (time.time(), n), flush=True); last = n
    if not alive: break
    time.sleep(0.002)
EOP
}

# op NAME GAP LABEL COMMAND...: runs COMMAND against run NAME (its output appended to $T/NAME.ctl), then waits until
# the run has committed GAP more steps; notes "LABEL START END" (the operation's window) in $T/NAME.ops for
# commit_gaps. Returns COMMAND's status.
op() {
    local name=$1 gap=$2 label=$3 t_start rc
    shift 3
    t_start=$(date +%s.%N)
    "$@" >>"$T/$name.ctl" 2>&1
    rc=$?
    wait_step "$name" $(($(ledger_lines "$name") + gap))
    echo "$label $t_start $(date +%s.%N)" >>"$T/$name.ops"
    return $rc
}

# commit_gaps NAME: one line: the median interval between two commits of run NAME, and for each operation op noted
# the longest interval between two commits inside its window (from 0.5 s before it); from ledger_poller's record.
commit_gaps() {
    python3 - "$T/$1.poll" "$T/$1.ops" <<'EOP'
import sys
poll = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if len(l.split()) == 2]
arrivals = [t for t, n in poll if n > 0]   # times the ledger was seen to grow
steady = sorted(b - a for a, b in zip(arrivals, arrivals[1:]))
out = ["median step %.3fs" % steady[len(steady) // 2]] if steady else []
for l in open(sys.argv[2]):
    name, t0, t1 = l.split(); t0, t1 = float(t0), float(t1)
    inside = [t for t in arrivals if t0 - 0.5 <= t <= t1]
    gap = max((b - a for a, b in zip(inside, inside[1:])), default=t1 - t0)
    out.append("%s: longest commit gap %.2fs" % (name, gap))
print("; ".join(out))
EOP
}

# train_checks PREFIX NAME: runs job NAME ($T/NAME.ini, $STEPS steps on the target at $T/target) and checks it:
# PREFIX_run_completes, PREFIX_ledger (every step once), PREFIX_loss_falls (dflash run's "loss A -> B": B < A) and
# PREFIX_checkpoint_follows_target (the drafter checkpoint's config: a dense qwen3 of the target's hidden size,
# vocabulary and layer count, its taps inside those layers). Non-zero when the run failed (nothing else checked).
train_checks() {
    local p=$1 c=$2 msg loss
    if run_job "$c"; then ok "${p}_run_completes"
    else fail "${p}_run_completes" "$(tail -5 "$T/$c.out")"; return 1; fi
    if msg=$(check_ledger "$c" "$STEPS" 1); then ok "${p}_ledger ($msg)"
    else fail "${p}_ledger" "$msg"; fi
    loss=$(grep -o "loss [0-9.]* -> [0-9.]*" "$T/$c.out" | tail -1)
    if python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if b < a else 1)" \
        $(echo "$loss" | awk '{ print $2, $4 }') 2>/dev/null; then ok "${p}_loss_falls ($loss)"
    else fail "${p}_loss_falls" "'$loss': $(tail -3 "$T/$c.out")"; fi
    python3 - "$T/$c/ckpt/latest/config.json" "$T/target/config.json" <<'EOP' && ok "${p}_checkpoint_follows_target" ||
import json, sys
c, t = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
taps, n = c.get("dflash_config", {}).get("target_layer_ids", []), t["num_hidden_layers"]
ok = c.get("hidden_size") == t["hidden_size"] and c.get("vocab_size") == t["vocab_size"] and \
     c.get("num_target_layers") == n and taps and all(0 <= x < n for x in taps) and c.get("model_type") == "qwen3" \
     and "num_experts" not in c and "num_local_experts" not in c
sys.exit(0 if ok else 1)
EOP
        fail "${p}_checkpoint_follows_target" "$(head -c 300 "$T/$c/ckpt/latest/config.json")"
    return 0
}
