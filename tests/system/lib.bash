# Shared helpers of the pipeline system tests (sourced). Real processes, real shared memory, unique names per test.
# Needs BUILD (binaries in $BUILD/bin) and python3 for reading JSON.
set -u
BIN=${BUILD:-build}/bin
T=$(mktemp -d /tmp/dflash-sys-XXXXXX)
FAILED=0
ok()   { echo "ok $1"; }
fail() { echo "FAIL $1${2:+: $2}"; FAILED=1; }
cleanup() {
    local pids
    pids=$(pgrep -f "$T/" 2>/dev/null || true)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    rm -f /dev/shm/dflash-t$$-* 2>/dev/null
    [ "${KEEP:-0}" = 1 ] || rm -rf "$T"
}
trap cleanup EXIT

# make_fixture: a tiny target and a small self-distilled data set under $T.
make_fixture() {
    "$BIN/dflash-demo" make-target "$T/target" --seed 11 --hidden 32 --layers 4 --heads 4 --kv-heads 2 \
        --head-dim 8 --intermediate 64 --vocab 256 >/dev/null 2>"$T/fixture.log" &&
    "$BIN/dflash-demo" make-data -q --target "$T/target" -o "$T/data.jsonl" --samples 48 --answer-len 24 \
        --seed 5 >/dev/null 2>>"$T/fixture.log" &&
    "$BIN/dflash-prepare" -o "$T/data" "$T/data.jsonl" >/dev/null 2>>"$T/fixture.log"
}

# write_config NAME STEPS [extra lines]: a job config at $T/NAME.ini with run_dir $T/NAME.
write_config() {
    local name=$1 steps=$2
    shift 2
    cat >"$T/$name.ini" <<EOC
[job]
name = t$$-$name
run_dir = $T/$name
seed = 77
[data]
path = $T/data
max_batch_tokens = 128
max_batch_seqs = 8
[target]
model = $T/target
[drafter]
layers = 1
block_size = 4
num_taps = 2
max_anchors = 8
[train]
steps = $steps
warmup_steps = 3
checkpoint_every = 10
lr = 3e-3
[workers]
targets = 2
drafters = 2
watchdog_sec = 20
heartbeat_timeout_sec = 20
[ring]
token_slots = 4
pool_slots = 2
$*
EOC
}

# run_job NAME [args...]: dflash run in the foreground; returns its status.
run_job() {
    local name=$1
    shift
    "$BIN/dflash" run -c "$T/$name.ini" "$@" >"$T/$name.out" 2>&1
}

# check_ledger NAME STEPS DRAFTERS: every step once, in order, with batches [k*D .. k*D+D-1]; every batch once.
check_ledger() {
    python3 - "$T/$1/ledger.jsonl" "$2" "$3" <<'EOP'
import json, sys
path, steps, D = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lines = [json.loads(l) for l in open(path)]
seen = {}
for l in lines:
    for b in l["batches"]:
        seen[b] = seen.get(b, 0) + 1
errs = []
if [l["step"] for l in lines] != list(range(steps)):
    errs.append("steps are not 0..%d once each (%d lines)" % (steps - 1, len(lines)))
for l in lines:
    if l["batches"] != list(range(l["step"] * D, l["step"] * D + D)):
        errs.append("step %d has batches %s" % (l["step"], l["batches"]))
        break
dups = [b for b, n in seen.items() if n != 1]
if dups: errs.append("batches committed more than once: %s" % dups[:10])
if sorted(seen) != list(range(steps * D)): errs.append("batch set is not 0..%d" % (steps * D - 1))
print("; ".join(errs) if errs else "%d steps, %d batches, each committed once" % (len(lines), len(seen)))
sys.exit(1 if errs else 0)
EOP
}

# final_weights NAME: path of the final checkpoint's optimizer state (fp32 master weights and moments).
final_weights() { echo "$T/$1/ckpt/latest/optimizer.safetensors"; }
