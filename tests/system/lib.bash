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

# make_fixture [make-target options]: a tiny target (those options added, e.g. --kind repeat) and a small
# self-distilled data set under $T.
make_fixture() {
    "$BIN/dflash-demo" make-target "$T/target" --seed 11 --hidden 32 --layers 4 --heads 4 --kv-heads 2 \
        --head-dim 8 --intermediate 64 --vocab 256 "$@" >/dev/null 2>"$T/fixture.log" &&
    prepared_data "$T/target" "$T/data" --samples 48 --answer-len 24 --seed 5
}

# prepared_data TARGET OUT [make-data options]: TARGET's self-distilled data set (make-data; default 64 samples, answers
# of 40 tokens, seed 5) written to OUT.jsonl and prepared into OUT; messages to $T/fixture.log; non-zero on failure.
prepared_data() {
    local target=$1 out=$2
    shift 2
    [ $# -gt 0 ] || set -- --samples 64 --answer-len 40 --seed 5
    "$BIN/dflash-demo" make-data -q --target "$target" -o "$out.jsonl" "$@" >/dev/null 2>>"$T/fixture.log" &&
    "$BIN/dflash-prepare" -o "$out" "$out.jsonl" >/dev/null 2>>"$T/fixture.log"
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

# set_ini FILE SECTION.KEY=VALUE... | -SECTION...: edits a job config in place: a key is replaced where its section has
# it, else added at the end of the section (the section is added at the end of the file if it has none); -SECTION
# drops that section. The one way the tests vary a config written by write_config or taken from deploy/.
set_ini() {
    python3 - "$@" <<'EOP'
import sys
path, edits = sys.argv[1], sys.argv[2:]
lines = open(path).read().splitlines()
def bounds(sec):  # [start, end) of SECTION's lines, header included; None if absent
    start = None
    for i, l in enumerate(lines):
        h = l.strip()
        if h.startswith("[") and h.endswith("]"):
            if start is not None: return start, i
            if h[1:-1].strip() == sec: start = i
    return (start, len(lines)) if start is not None else None
for e in edits:
    if e.startswith("-"):
        b = bounds(e[1:])
        if b: del lines[b[0]:b[1]]
        continue
    name, sep, value = e.partition("=")
    sec, dot, key = name.partition(".")
    if not sep or not dot: sys.exit("set_ini: '%s' is not SECTION.KEY=VALUE or -SECTION" % e)
    b = bounds(sec)
    if b is None:
        lines += ["[%s]" % sec, "%s = %s" % (key, value)]
        continue
    for i in range(b[0] + 1, b[1]):
        if lines[i].split("=", 1)[0].strip() == key and "=" in lines[i]:
            lines[i] = "%s = %s" % (key, value)
            break
    else:
        end = b[1]
        while end > b[0] + 1 and not lines[end - 1].strip(): end -= 1  # before the blank lines ending the section
        lines.insert(end, "%s = %s" % (key, value))
open(path, "w").write("\n".join(lines) + "\n")
EOP
}

# demo_config NAME STEPS [SECTION.KEY=VALUE...]: deploy/demo.ini's job (the repeat target's model and training
# settings) at $T/NAME.ini: run_dir $T/NAME, target $T/target, data $T/data, STEPS steps, no [eval]; then the edits.
demo_config() {
    local name=$1 steps=$2
    shift 2
    cp deploy/demo.ini "$T/$name.ini" &&
    set_ini "$T/$name.ini" -eval job.name="t$$-$name" job.run_dir="$T/$name" target.model="$T/target" \
        data.path="$T/data" train.steps="$steps" "$@"
}

# ledger_lines NAME: how many steps run NAME has committed (0 before its ledger exists).
ledger_lines() { [ -f "$T/$1/ledger.jsonl" ] && wc -l <"$T/$1/ledger.jsonl" || echo 0; }

# wait_step NAME STEP: until run NAME's ledger has STEP lines, or 300 s (the caller checks what it needs).
wait_step() {
    local d=$((SECONDS + 300))
    until [ "$(ledger_lines "$1")" -ge "$2" ] || [ $SECONDS -ge $d ]; do sleep 0.05; done
}

# worker_pid NAME WORKER: the pid of the running instance of WORKER (target-0, drafter-0, ...) of `dflash run` NAME.
worker_pid() { awk -v v="$2" '$1 == v && $2 > 0 {print $2}' "$T/$1/supervisor.state" 2>/dev/null; }

# kill_worker NAME WORKER [wait]: SIGKILL that instance (non-zero if none runs); with "wait", then until dflash run
# has started a new one (or 120 s).
kill_worker() {
    local pid d=$((SECONDS + 120))
    pid=$(worker_pid "$1" "$2")
    [ -n "$pid" ] && kill -9 "$pid"
    local rc=$?
    [ "${3:-}" = wait ] &&
        until [ -n "$(worker_pid "$1" "$2")" ] && [ "$(worker_pid "$1" "$2")" != "$pid" ] || [ $SECONDS -ge $d ]; do
            sleep 0.05
        done
    return $rc
}

# decode_equals_walk TARGET DRAFTER PROMPTS OUT [PARTIAL [EVAL ARGS...]]: `dflash eval` of DRAFTER on the first
# ${LIMIT:-6} prompts of PROMPTS, ${NEW:-20} new tokens each, by decoding (KV cache, crops) and by the walk (one full
# forward a prompt), JSON and stderr to OUT.*; prints what differs (else "tau T, blocks N, longest L") and fails unless
# both give every prompt with the same accepted lengths, tau and histogram, every prompt its NEW tokens (the blocks
# commit all but the prefill's first), tau within [1, block size], and the speculative output equals greedy.
# PARTIAL 1: also some block kept only part of its draft (a crop inside a block ran). EVAL ARGS go to both runs.
decode_equals_walk() {
    local target=$1 drafter=$2 prompts=$3 out=$4 partial=${5:-0} limit=${LIMIT:-6} new=${NEW:-20}
    shift $(($# < 5 ? $# : 5))
    local args=(--target "$target" --drafter "$drafter" --prompts "$prompts" --limit "$limit" --max-new-tokens "$new"
        --json "$@")
    "$BIN/dflash" eval "${args[@]}" >"$out.decode.json" 2>"$out.eval.err" &&
        "$BIN/dflash" eval "${args[@]}" --walk >"$out.walk.json" 2>>"$out.eval.err" ||
        { echo "eval: $(tail -3 "$out.eval.err")"; return 1; }
    python3 - "$out.decode.json" "$out.walk.json" "$partial" "$limit" "$new" <<'EOP'
import json, sys
d, w = (json.load(open(p)) for p in sys.argv[1:3])
limit, new = int(sys.argv[4]), int(sys.argv[5])
errs = []
if sys.argv[3] == "1" and not any(1 < a < d["block_size"] for p in d["per_prompt"] for a in p["accepted"]):
    errs.append("no block kept part of its draft (tau %s): no crop inside a block was tested" % d["tau"])
if d["mode"] != "decode" or w["mode"] != "walk": errs.append("modes %s/%s" % (d["mode"], w["mode"]))
if d["prompts"] != limit or w["prompts"] != limit: errs.append("prompts %d/%d" % (d["prompts"], w["prompts"]))
if d["outputs_differ"] != 0: errs.append("%d prompts' speculative output differs from greedy" % d["outputs_differ"])
for a, b in zip(d["per_prompt"], w["per_prompt"]):
    if a["accepted"] != b["accepted"] or a["new_tokens"] != b["new_tokens"] or a["new_tokens"] != new:
        errs.append("line %d: decode %s, walk %s" % (a["line"], a["accepted"], b["accepted"])); break
    if sum(a["accepted"]) + 1 != new: errs.append("line %d: blocks commit %d tokens" % (a["line"], sum(a["accepted"])))
if d["tau"] != w["tau"] or d["histogram"] != w["histogram"]: errs.append("tau %s vs %s" % (d["tau"], w["tau"]))
if not 1 <= d["tau"] <= d["block_size"] or d["speedup"] <= 0: errs.append("tau %s speedup %s" % (d["tau"], d["speedup"]))
print("; ".join(errs) if errs else "tau %.4f, blocks %d, longest %d" % (d["tau"], sum(len(p["accepted"]) for p in
      d["per_prompt"]), max(x for p in d["per_prompt"] for x in p["accepted"])))
sys.exit(1 if errs else 0)
EOP
}
