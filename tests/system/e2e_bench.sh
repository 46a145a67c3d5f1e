#!/usr/bin/env bash
# bench/e2e.sh's family switch on the CPU (the GPU runs of FAMILY=qwen3_5 / qwen3_moe / gpt_oss are blind): (1) the
# config.json that bench/e2e_fixture.py --family qwen3_5 (qwen3_moe, gpt_oss) has transformers write (its arguments
# over the key set of the qwen35-tiny (qwen3moe-tiny, gptoss-tiny-bf16) golden's config.json, which transformers wrote
# from the same class) is accepted by dflash's parser at the full Qwen3.5-9B (Qwen3-30B-A3B, gpt-oss-20b) shape, every
# argument being a key transformers writes; (2) e2e.sh's job config runs to the end under `dflash run` (BACKEND=cpu)
# on a tiny hybrid target and on tiny gpt_oss ones (bf16 experts in transformers' layout and no quantization_config,
# and MXFP4 blocks + scales with the published quantization_config, as the fixture writes them with and without
# --mxfp4) laid out as the fixture's (its layer_types rule, 8 layers, weights under "model." as
# save_pretrained writes them), the drafter taking the spec's default taps of the target's layers; (3) bench/e2e_gpu.sh
# FAMILY=gpt_oss parses: its family switch, the anchors taken from an ANCHOR_LOG in the anchors' own line formats (the
# drafter's from torch_drafter_anchor_shape.py --dry-run) and its summary reading them, the GPU steps skipped
# (LIMIT=1); an unknown FAMILY is refused.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
GOLDENS=${DFLASH_GOLDENS:-tests/goldens}
G=$GOLDENS/qwen35-tiny/target
if [ ! -f "$G/model.safetensors" ]; then
    echo "skipped: no hybrid golden target at $G"
    exit 77
fi

# (1) the full-shape config.json of each family, read by dflash (a target folder with no weights: the parser's
# verdict comes first): qwen3_5 over the qwen35-tiny golden's keys, qwen3_moe (the Qwen3-30B-A3B shape) over the
# qwen3moe-tiny golden's (transformers 5 writes num_experts as num_local_experts; both goldens written by transformers)
full_config() { # FAMILY[+mxfp4] GOLDEN_TARGET_DIR
    local fam=$1 g=$2 msg out
    [ -f "$g/config.json" ] || { echo "skipped e2e_bench_fixture_config_$fam: no golden $g"; return; }
    mkdir -p "$T/full-$fam"
    msg=$(python3 - "$g/config.json" "$T/full-$fam/config.json" "$fam" 2>&1 <<'EOP'
import json, subprocess, sys
g = json.load(open(sys.argv[1]))
fam, q = (sys.argv[3].split("+") + [""])[:2]
f = json.loads(subprocess.check_output([sys.executable, "bench/e2e_fixture.py", "-", "--family", fam,
                                        "--print-config"] + (["--" + q] if q else [])))
if f.get("quantization_config") != g.get("quantization_config"):
    sys.exit("fixture's quantization_config %r, the golden's %r" % (f.get("quantization_config"),
                                                                   g.get("quantization_config")))
kw = f["kwargs"]
if "num_experts" in kw and "num_local_experts" in g: kw["num_local_experts"] = kw.pop("num_experts")
unknown = sorted(set(kw) - set(g))
if f["model"] != g["architectures"][0] or unknown:
    sys.exit("fixture %s / %s, golden %s; arguments not among the golden's keys: %s" % (f["config"], f["model"],
             g["architectures"], unknown))
g.update(kw); g["dtype"] = "bfloat16"
json.dump(g, open(sys.argv[2], "w"), indent=2)
lt = g.get("layer_types") or []
print("%d layers%s, model_type %s" % (g["num_hidden_layers"], " (%d full attention)" % lt.count("full_attention")
      if lt else "", g["model_type"]))
EOP
) || { fail "e2e_bench_fixture_config_$fam" "$msg"; return; }
    out=$("$BIN/dflash" generate --target "$T/full-$fam" --prompts "$T/p.jsonl" -o "$T/g.jsonl" 2>&1)
    if grep -q "no model.safetensors" <<<"$out" && ! grep -q "config.json" <<<"$out"; then
        ok "e2e_bench_fixture_config_parsed_$fam ($msg)"
    else fail "e2e_bench_fixture_config_parsed_$fam" "$(tail -2 <<<"$out")"; fi
}
echo '{"input_ids": [1, 2, 3]}' >"$T/p.jsonl"
full_config qwen3_5 "$G"
full_config qwen3_moe "$GOLDENS/qwen3moe-tiny/target"
full_config gpt_oss "$GOLDENS/gptoss-tiny-bf16/target"
full_config gpt_oss+mxfp4 "$GOLDENS/gptoss-mxfp4/target"

# (2) a tiny target with the fixture's layer pattern: the golden's tensors, a layer's of the same kind (linear or
# full attention; sliding or full) for each layer; data from a Qwen3 demo target of its vocabulary
tiny_run() { # FAMILY[+mxfp4] GOLDEN_TARGET_DIR VOCAB HIDDEN RUNS_TEST_NAME DRAFTER_TEST_NAME
    local fam=$1 g=$2 vocab=$3 hidden=$4 runs=$5 follows=$6 W=$T/w-$1 msg out rc check
    [ -f "$g/model.safetensors" ] || { echo "skipped $runs: no golden $g"; return; }
    mkdir -p "$W"
    "$BIN/dflash-demo" make-target "$T/datagen-$fam" --seed 11 --hidden 32 --layers 2 --heads 4 --kv-heads 2 \
        --head-dim 8 --intermediate 64 --vocab "$vocab" >/dev/null 2>"$T/fixture.log" &&
    "$BIN/dflash-demo" make-data -q --target "$T/datagen-$fam" -o "$W/data.jsonl" --samples 40 --answer-len 24 \
        --seed 5 >/dev/null 2>>"$T/fixture.log" || { fail "$runs" "data: $(tail -3 "$T/fixture.log")"; return; }
    msg=$(python3 - "$g" "$W/target" 8 "$fam" 2>&1 <<'EOP'
import json, os, struct, subprocess, sys
g, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
fam, q = (sys.argv[4].split("+") + [""])[:2]
f = json.loads(subprocess.check_output([sys.executable, "bench/e2e_fixture.py", "-", "--family", fam,
                                        "--layers", str(n), "--print-config"] + (["--" + q] if q else [])))
lt = f["kwargs"]["layer_types"]
cfg = json.load(open(os.path.join(g, "config.json")))
if f.get("quantization_config") != cfg.get("quantization_config"):
    sys.exit("golden %s's quantization_config %r, the fixture's %r" % (g, cfg.get("quantization_config"),
                                                                        f.get("quantization_config")))
src = open(os.path.join(g, "model.safetensors"), "rb").read()
hn = struct.unpack("<Q", src[:8])[0]
hdr = json.loads(src[8:8 + hn]); meta = hdr.pop("__metadata__", None)
like = {t: cfg["layer_types"].index(t) for t in set(lt)}     # a golden layer of each kind
names = [k for k in hdr if not k.startswith("model.layers.")]
src_of = {k: k for k in names}
for i, t in enumerate(lt):
    pre = "model.layers.%d." % like[t]
    for k in hdr:
        if k.startswith(pre):
            src_of["model.layers.%d.%s" % (i, k[len(pre):])] = k
new, blobs, off = {}, [], 0
for k, s in src_of.items():
    e = hdr[s]; a, b = e["data_offsets"]
    blobs.append(src[8 + hn + a:8 + hn + b])
    new[k] = {"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [off, off + b - a]}; off += b - a
if meta: new["__metadata__"] = meta
h = json.dumps(new).encode(); h += b" " * (-len(h) % 8)
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "model.safetensors"), "wb") as w:
    w.write(struct.pack("<Q", len(h))); w.write(h); [w.write(b) for b in blobs]
cfg["num_hidden_layers"], cfg["layer_types"] = n, lt
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
print(",".join(t.split("_")[0] for t in lt))
EOP
) || { fail "$runs" "tiny target: $msg"; return; }
    out=$(WORK=$W OUT=$T/out-$fam BACKEND=cpu STEPS=6 RUN_TIMEOUT=120 bash bench/e2e.sh 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && grep -q "^e2e: 6 steps" <<<"$out"; then ok "$runs (layers $msg)"
    else fail "$runs" "rc $rc: $(tail -5 <<<"$out")"; fi
    check=$(python3 - "$W/run/ckpt/latest/config.json" "$hidden" "$vocab" 2>&1 <<'EOP'
import json, sys
c = json.load(open(sys.argv[1]))
want = {"num_hidden_layers": 5, "num_target_layers": 8, "block_size": 16, "hidden_size": int(sys.argv[2]),
        "vocab_size": int(sys.argv[3]), "model_type": "qwen3"}
errs = ["%s = %r, want %r" % (k, c.get(k), v) for k, v in want.items() if c.get(k) != v]
taps = c.get("dflash_config", {}).get("target_layer_ids")
if taps != [1, 2, 3, 4, 5]: errs.append("taps %r, want the spec's [1, 2, 3, 4, 5] of 8 layers" % taps)
print("; ".join(errs) if errs else "5 layers, taps %s of 8 target layers" % taps)
sys.exit(1 if errs else 0)
EOP
) && ok "$follows ($check)" || fail "$follows" "$check"
}
tiny_run qwen3_5 "$G" 512 64 e2e_bench_hybrid_runs e2e_bench_drafter_follows

# SEQS=2: the same WORK (target and data; the run has its own folder, run-seqs2), two samples a batch. The packing is
# a function of (data, seed, batch id), the shuffle of (seed, epoch) alone, so batch b of this run holds batches 2b and
# 2b + 1 of the run above: its ledger's tokens are theirs added, and the summary counts two samples a step
if [ -f "$T/w-qwen3_5/run/ledger.jsonl" ]; then
    out=$(WORK=$T/w-qwen3_5 OUT=$T/out-seqs2 BACKEND=cpu STEPS=3 SEQS=2 RUN_TIMEOUT=120 bash bench/e2e.sh 2>&1)
    rc=$?
    msg=$(python3 - "$T/w-qwen3_5/run/ledger.jsonl" "$T/w-qwen3_5/run-seqs2/ledger.jsonl" 2>&1 <<'EOP'
import json, sys
one = {l["batches"][0]: l["tokens"] for l in map(json.loads, open(sys.argv[1]))}
two = {l["batches"][0]: l["tokens"] for l in map(json.loads, open(sys.argv[2]))}
bad = [(b, t, one.get(2 * b), one.get(2 * b + 1)) for b, t in sorted(two.items())
       if one.get(2 * b) is None or one.get(2 * b + 1) is None or t != one[2 * b] + one[2 * b + 1]]
if len(two) != 3 or bad: sys.exit("batches of two %s, of one %s: %s" % (two, one, bad))
print(", ".join("%d = %d + %d" % (t, one[2 * b], one[2 * b + 1]) for b, t in sorted(two.items())))
EOP
)
    mrc=$?
    if [ $rc -eq 0 ] && [ $mrc -eq 0 ] && grep -q "^e2e: 3 steps (6 samples" <<<"$out"; then
        ok "e2e_bench_seqs2_packs_two (tokens a step: $msg)"
    else fail e2e_bench_seqs2_packs_two "rc $rc: $msg $(tail -3 <<<"$out")"; fi
    out=$(SEQS=0 STEPS=1 bash bench/e2e.sh 2>&1)
    [ $? -eq 2 ] && grep -q "SEQS=0: want the samples per batch" <<<"$out" && ok e2e_bench_seqs_checked ||
        fail e2e_bench_seqs_checked "$out"
fi
tiny_run gpt_oss "$GOLDENS/gptoss-tiny-bf16/target" 256 96 e2e_bench_gpt_oss_runs e2e_bench_drafter_follows_gpt_oss
tiny_run gpt_oss+mxfp4 "$GOLDENS/gptoss-mxfp4/target" 256 96 e2e_bench_gpt_oss_mxfp4_runs \
    e2e_bench_drafter_follows_gpt_oss_mxfp4

# (3) e2e_gpu.sh FAMILY=gpt_oss on the CPU: nothing runs (LIMIT=1 leaves no step its 15 s), the anchors come from a
# log in their own formats, and the summary reads them; no dflash figure, so exit 1
echo 'H, I, NH, NKV, HD, V, K, EPS, THETA = 1, 1, 1, 1, 1, 1, 1, 1.0, 1.0' >"$T/anchor.py"
{
    python3 bench/torch_drafter_anchor_shape.py "$T/anchor.py" --family gpt_oss --dry-run -- --seq 2936 --iters 3
    echo "torch drafter step: 250 ms -> 4.00 seq/s, 32768 block tok/s, 200 TFLOP/s useful (25% of 790)"
    echo "torch gpt_oss [8 layers, 1 x 2936 padded, 2936 tokens] forward alone: 5872 tok/s (500.0 ms, 3 iters;" \
        "padded batch 1 x 2936)"
} >"$T/anchors.log"
out=$(FAMILY=gpt_oss LIMIT=1 ANCHOR_LOG=$T/anchors.log BUILD=${BUILD:-build} bash bench/e2e_gpu.sh 2>&1)
rc=$?
want="anchors: transformers forward 0.500 s/sample + PyTorch drafter step 0.250 s/sample = 0.750 s/sample"
sum="^e2e gpt_oss summary (gpt-oss-20b shape, 8 layers, 50 steps, anchors at 2936 tokens).*$want"
if [ $rc -eq 1 ] && grep -q "$sum" <<<"$out" &&
    grep -q "LAYERS=8 (a cut of the gpt-oss-20b shape's 24 layers)" <<<"$out" &&
    grep -q "torch gpt_oss anchor: taken from" <<<"$out" && grep -q "torch drafter anchor: taken from" <<<"$out"
then ok "e2e_bench_gpu_script_gpt_oss (anchors read from the log, summary: $want)"
else fail e2e_bench_gpu_script_gpt_oss "rc $rc: $(tail -4 <<<"$out")"; fi
out=$(FAMILY=gpt_os LIMIT=1 bash bench/e2e_gpu.sh 2>&1)
rc=$?
[ $rc -eq 2 ] && grep -q "FAMILY=gpt_os: expected qwen3_5, qwen3_moe or gpt_oss" <<<"$out" &&
    ok "e2e_bench_gpu_script_family_refused" || fail e2e_bench_gpu_script_family_refused "rc $rc: $out"
# bench/dense8b.sh (issue 23's benchmark command): its help, and a build without the benchmarks refused before any run
out=$(bash bench/dense8b.sh --help 2>&1)
rc=$?
[ $rc -eq 0 ] && grep -q "^  BUILD=build \[ANCHORS=../shared/bench\] bench/dense8b.sh" <<<"$out" &&
    ok "dense8b_help" || fail dense8b_help "rc $rc: $out"
mkdir -p "$T/nobench/bench"
out=$(BUILD=$T/nobench bash bench/dense8b.sh 2>&1)
rc=$?
[ $rc -eq 2 ] && grep -q "dense8b.sh: $T/nobench/bench/bench_target is missing: build with make -j2 all first" <<<"$out" &&
    ! grep -q "^===" <<<"$out" && ok "dense8b_refuses_missing_build" || fail dense8b_refuses_missing_build "rc $rc: $out"
exit $FAILED
