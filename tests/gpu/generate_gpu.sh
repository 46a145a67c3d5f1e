#!/usr/bin/env bash
# GPU system test (GPU machine): `dflash-cuda generate --backend cuda` on make_fixture's prompts, against the CPU
# path (`dflash generate`) on the same target (a bf16 copy of make_fixture's shape, so both read the same weights).
# bf16 activations on the GPU against fp32 on the CPU can flip a greedy choice where two logits nearly tie, and
# every later token of that answer then follows another prefix; so the check counts flips: each GPU answer is walked
# against the CPU's greedy continuation of the same prefix (the CPU regenerates from the GPU's own prefix after each
# flip), and flips must be at most MAX_FLIP_PCT (default 5) % of the GPU's tokens. A wrong position, cache slot or
# mask gives wrong tokens nearly everywhere. Also: one line per prompt, in order, the same prompts, EOS and
# --suppress honoured, --batch smaller than the prompt count (slots reused), hybrid targets (the qwen35 goldens: the
# same walk against their CPU decoding), dflash-prepare reads the output, the
# summary and progress lines, and resume after SIGKILL (plus a partial last line): every prompt answered once, in
# order, the lines written before the kill kept byte for byte.
# Usage: BUILD=build tests/gpu/generate_gpu.sh   (needs $BUILD/bin/dflash, dflash-cuda, dflash-demo, dflash-prepare)
# A dry run of the script's logic without a GPU: CAND_BACKEND=cpu CAND_TARGET=f32 (the candidate is the CPU path on
# make_fixture's fp32 target: its flips come from the weights' bf16 rounding instead).
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
make_fixture || { fail generate_gpu_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
V=256
"$BIN/dflash-demo" make-target "$T/target16" --seed 11 --hidden 32 --layers 4 --heads 4 --kv-heads 2 --head-dim 8 \
    --intermediate 64 --vocab $V --dtype bf16 >/dev/null 2>>"$T/fixture.log" ||
    { fail generate_gpu_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
TGT=$T/target16
CAND_TARGET=${CAND_TARGET:-$TGT}
[ "$CAND_TARGET" = f32 ] && CAND_TARGET=$T/target
CAND_BACKEND=${CAND_BACKEND:-cuda}
MAX_FLIP_PCT=${MAX_FLIP_PCT:-5}
CPU=("$BIN/dflash" generate --target "$TGT")
GPU=("$BIN/dflash-cuda" generate --target "$CAND_TARGET" --backend "$CAND_BACKEND")
# prompts_of DATA OUT: the prompts of DATA's samples (their tokens before the first answer token), one a line, to OUT
prompts_of() {
    python3 - "$1" "$2" <<'EOP'
import json, sys
with open(sys.argv[2], "w") as f:
    for l in open(sys.argv[1]):
        l = json.loads(l)
        f.write(json.dumps({"input_ids": l["input_ids"][:l["loss_mask"].index(1)]}) + "\n")
EOP
}
# eos_of ANSWERS: the 6th answer token of the first line of ANSWERS (as an EOS id it ends some answers early)
eos_of() {
    python3 -c 'import json, sys; l = json.loads(open(sys.argv[1]).readline())
print(l["input_ids"][l["loss_mask"].index(1) + 5])' "$1"
}
# the prompts of make_fixture's data, and an EOS id that ends some answers early (so slots free at different steps)
prompts_of "$T/data.jsonl" "$T/prompts.jsonl"
"${CPU[@]}" --prompts "$T/prompts.jsonl" -o "$T/probe.jsonl" --max-new-tokens 24 --suppress $((V - 1)) -q >/dev/null 2>&1
eos=$(eos_of "$T/probe.jsonl")
ARGS=(--prompts "$T/prompts.jsonl" --max-new-tokens 24 --suppress $((V - 1)) --eos "$eos")

# ---- the GPU's answers against the CPU's ----
"${CPU[@]}" "${ARGS[@]}" -o "$T/cpu.jsonl" -q >/dev/null 2>"$T/cpu.err" || fail generate_gpu_cpu_reference "$(cat "$T/cpu.err")"
"${GPU[@]}" "${ARGS[@]}" --batch 16 -o "$T/gpu.jsonl" >"$T/gpu.out" 2>"$T/gpu.err"
rc=$?
[ $rc -eq 0 ] && ok generate_gpu_runs || fail generate_gpu_runs "exit $rc: $(tail -3 "$T/gpu.err")"
grep -qE "^generated 48 answers \([0-9]+ tokens, .* tokens/s on the GPU, batch 16\)" "$T/gpu.out" \
    && grep -q "48/48 prompts done" "$T/gpu.err" && ok generate_gpu_summary_and_progress \
    || [ "$CAND_BACKEND" != cuda ] || fail generate_gpu_summary_and_progress "$(cat "$T/gpu.out" "$T/gpu.err")"
# the same run with every decoding step launched kernel by kernel (no CUDA graphs): the same answers, byte for byte
DFLASH_DECODE_GRAPHS=0 "${GPU[@]}" "${ARGS[@]}" --batch 16 -o "$T/gpu_nograph.jsonl" >/dev/null 2>"$T/gpu_nograph.err"
cmp -s "$T/gpu.jsonl" "$T/gpu_nograph.jsonl" && ok generate_gpu_graphs_same_answers \
    || [ "$CAND_BACKEND" != cuda ] || fail generate_gpu_graphs_same_answers "$(tail -3 "$T/gpu_nograph.err")"
"$BIN/dflash-prepare" -o "$T/prep" "$T/gpu.jsonl" >"$T/prep.out" 2>&1 && grep -q "^prepared 48 samples" "$T/prep.out" \
    && ok generate_gpu_output_prepares || fail generate_gpu_output_prepares "$(cat "$T/prep.out")"
# The walk: prints "ok ..." or "FAIL ..." lines; the CPU regenerations run through $T/regen.sh.
cat >"$T/regen.sh" <<EOF
#!/usr/bin/env bash
rm -f "\$2" && exec $(printf '%q ' "${CPU[@]}") --prompts "\$1" -o "\$2" --max-new-tokens 24 --suppress $((V - 1)) --eos $eos -q >/dev/null
EOF
chmod +x "$T/regen.sh"
# walk.py PROMPTS CPU GPU REGEN TMP MAX_PCT EOS SUPPRESS [LABEL]   (MAX_PCT < 0: print the flip percentage only)
cat >"$T/walk.py" <<'EOF'
import json, subprocess, sys
prompts_f, cpu_f, gpu_f, regen, tmp, max_pct, eos, sup = sys.argv[1:9]
label = sys.argv[9] if len(sys.argv) > 9 else ""
max_pct, eos, sup, M = float(max_pct), int(eos), int(sup), 24
prompts = [json.loads(l)["input_ids"] for l in open(prompts_f)]
cpu = [json.loads(l) for l in open(cpu_f)]
gpu = [json.loads(l) for l in open(gpu_f)]
def split(line):
    p = line["loss_mask"].index(1)
    assert line["loss_mask"] == [0] * p + [1] * (len(line["input_ids"]) - p)
    return line["input_ids"][:p], line["input_ids"][p:]
bad = None
if len(gpu) != len(prompts): bad = "%d lines, want %d" % (len(gpu), len(prompts))
for i, g in enumerate(gpu if not bad else []):
    p, a = split(g)
    if g["prompt_line"] != i + 1 or p != prompts[i]: bad = "line %d: prompt_line %s or its prompt differs" % (i + 1, g["prompt_line"]); break
    if sup in a: bad = "line %d: the suppressed id %d was generated" % (i + 1, sup); break
    if eos in a[:-1] or (a[-1] != eos and len(a) != M) or g["stop"] != ("eos" if a[-1] == eos else "max_new_tokens"):
        bad = "line %d: answer of %d tokens, stop %s: EOS %d or --max-new-tokens %d not honoured" % (i + 1, len(a), g["stop"], eos, M); break
if max_pct >= 0 or bad:
    print(("FAIL generate_gpu_lines_prompts_eos_suppress%s: " % label + bad) if bad else "ok generate_gpu_lines_prompts_eos_suppress" + label)
if bad: sys.exit(1 if max_pct < 0 else 0)
ans = [split(g)[1] for g in gpu]
ref = [split(c)[1] for c in cpu]           # the CPU's greedy answer from what the GPU holds at k[i]
k = [0] * len(ans)                        # GPU answer tokens checked so far
flips = [0] * len(ans)
rounds = 0
while True:
    redo = []
    for i, a in enumerate(ans):
        if k[i] >= len(a): continue
        c, j = ref[i], 0
        while k[i] + j < len(a) and j < len(c) and a[k[i] + j] == c[j]: j += 1
        k[i] += j
        if k[i] < len(a) or j < len(c):   # a differs at k[i] (or one answer ends before the other)
            flips[i] += 1
            k[i] += 1
            if k[i] < len(a): redo.append(i)
    if not redo: break
    rounds += 1
    with open(tmp + ".jsonl", "w") as f:
        for i in redo: f.write(json.dumps({"input_ids": prompts[i] + ans[i][:k[i]]}) + "\n")
    subprocess.run([regen, tmp + ".jsonl", tmp + ".out"], check=True)
    out = [json.loads(l) for l in open(tmp + ".out")]
    for i, o in zip(redo, out): ref[i] = split(o)[1][:M - k[i]]
ntok = sum(len(a) for a in ans)
same = sum(f == 0 for f in flips)
pct = 100.0 * sum(flips) / ntok
if max_pct < 0: print("%.2f" % pct); sys.exit()  # a gauge: the flip percentage alone
print("%s generate_gpu_tokens_match_cpu%s: %d of %d lines identical to the CPU's (%.1f%%); %d greedy flips in %d tokens "
      "(%.2f%%, at most %.1f%%; %d CPU regeneration rounds)" % ("ok" if pct <= max_pct else "FAIL", label, same, len(ans),
      100.0 * same / len(ans), sum(flips), ntok, pct, max_pct, rounds))
EOF
python3 "$T/walk.py" "$T/prompts.jsonl" "$T/cpu.jsonl" "$T/gpu.jsonl" "$T/regen.sh" "$T/regen" "$MAX_FLIP_PCT" "$eos" $((V - 1))

# ---- hybrid Qwen3.5 targets (the goldens, dense and MoE): decoding on the GPU (conv histories and delta-rule states
# carried per sequence) against the CPU's, which generate.sh holds to the full forward's greedy text token for token;
# the same walk. Prompts: make-data's on the target. The goldens' greedy text is far more sensitive to rounding than
# the dense fixture's (test_target_gpu.c: a bf16 hybrid forward lands 0.1-0.4 norm_rel from fp32 on them, and moves
# as far under 1e-6 perturbations): rounding the weights alone to bf16 already flips ~8% (qwen35-tiny) and ~28%
# (qwen35moe-tiny) of the CPU's greedy tokens. So the flip bound is measured in the same run: the walk of the CPU on
# a bf16 copy of the weights (the gauge G), and the GPU, which also rounds every activation, may flip at most
# 2 G + 5 % (a wrong position, state or slot flips nearly every token: ~100% of a 512-token vocabulary).
# bf16_copy SRC DST: the safetensors file with every F32 tensor rounded to BF16 (round to nearest even)
bf16_copy() {
    python3 - "$1" "$2" <<'EOP'
import array, json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h, data, out, hdr, off = json.loads(b[8:8 + n]), b[8 + n:], [], {}, 0
for k, v in sorted(((k, v) for k, v in h.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0]):
    raw = data[v["data_offsets"][0]:v["data_offsets"][1]]
    if v["dtype"] == "F32":
        a = array.array("I")
        a.frombytes(raw)
        raw = array.array("H", [((x + 0x7FFF + ((x >> 16) & 1)) >> 16) & 0xFFFF for x in a]).tobytes()
        v = dict(v, dtype="BF16")
    hdr[k] = dict(v, data_offsets=[off, off + len(raw)])
    out.append(raw)
    off += len(raw)
hb = json.dumps(hdr).encode()
hb += b" " * (-len(hb) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hb)) + hb + b"".join(out))
EOP
}
for c in qwen35-tiny qwen35moe-tiny; do
    HYB=${DFLASH_GOLDENS:-tests/goldens}/$c/target
    [ -f "$HYB/config.json" ] || { fail "generate_gpu_hybrid_$c" "no golden target at $HYB"; continue; }
    HV=$(python3 -c "import json; print(json.load(open('$HYB/config.json'))['vocab_size'])")
    "$BIN/dflash-demo" make-data -q --target "$HYB" -o "$T/$c.ref.jsonl" --samples 24 --answer-len 24 --seed 7 \
        >/dev/null 2>"$T/$c.err"
    prompts_of "$T/$c.ref.jsonl" "$T/$c.prompts.jsonl"
    HEOS=$(eos_of "$T/$c.ref.jsonl")
    HARGS=(--prompts "$T/$c.prompts.jsonl" --max-new-tokens 24 --suppress $((HV - 1)) --eos "$HEOS")
    "$BIN/dflash" generate --target "$HYB" "${HARGS[@]}" -o "$T/$c.cpu.jsonl" -q >/dev/null 2>>"$T/$c.err" ||
        fail "generate_gpu_hybrid_cpu_reference_$c" "$(tail -3 "$T/$c.err")"
    "$BIN/dflash-cuda" generate --target "$HYB" "${HARGS[@]}" --backend "$CAND_BACKEND" --batch 8 -o "$T/$c.gpu.jsonl" -q \
        >/dev/null 2>>"$T/$c.err"
    rc=$?
    [ $rc -eq 0 ] && ok "generate_gpu_hybrid_runs_$c" || fail "generate_gpu_hybrid_runs_$c" "exit $rc: $(tail -3 "$T/$c.err")"
    cat >"$T/$c.regen.sh" <<EOF
#!/usr/bin/env bash
rm -f "\$2" && exec $(printf '%q ' "$BIN/dflash" generate --target "$HYB") --prompts "\$1" -o "\$2" --max-new-tokens 24 --suppress $((HV - 1)) --eos $HEOS -q >/dev/null
EOF
    chmod +x "$T/$c.regen.sh"
    mkdir -p "$T/$c.b16" && cp "$HYB/config.json" "$T/$c.b16/" && bf16_copy "$HYB/model.safetensors" "$T/$c.b16/model.safetensors" &&
    "$BIN/dflash" generate --target "$T/$c.b16" "${HARGS[@]}" -o "$T/$c.b16.jsonl" -q >/dev/null 2>>"$T/$c.err" &&
    gauge=$(python3 "$T/walk.py" "$T/$c.prompts.jsonl" "$T/$c.cpu.jsonl" "$T/$c.b16.jsonl" "$T/$c.regen.sh" \
        "$T/$c.regen" -1 "$HEOS" $((HV - 1))) || { fail "generate_gpu_hybrid_gauge_$c" "$(tail -3 "$T/$c.err")"; continue; }
    python3 "$T/walk.py" "$T/$c.prompts.jsonl" "$T/$c.cpu.jsonl" "$T/$c.gpu.jsonl" "$T/$c.regen.sh" "$T/$c.regen" \
        "$(python3 -c "print(2 * $gauge + 5)")" "$HEOS" $((HV - 1)) " ($c; bf16 weights alone flip $gauge% on the CPU)"
done

# ---- resume: SIGKILL part-way, a partial last line, rerun: every prompt once, in order, the kept lines kept ----
python3 - "$T/prompts.jsonl" "$T/many.jsonl" <<'EOF'
import sys
lines = open(sys.argv[1]).read().splitlines()
with open(sys.argv[2], "w") as f:
    for i in range(2000): f.write(lines[i % len(lines)] + "\n" + ("\n" if i % 7 == 0 else ""))
EOF
LONG=(--prompts "$T/many.jsonl" --max-new-tokens 120 --suppress $((V - 1)) --batch 16 -q)
"${GPU[@]}" "${LONG[@]}" -o "$T/cut.jsonl" >/dev/null 2>"$T/cut.err" &
pid=$!
for _ in $(seq 1 3000); do
    [ -f "$T/cut.jsonl" ] && [ "$(wc -l <"$T/cut.jsonl")" -ge 30 ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.02
done
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
n=$(wc -l <"$T/cut.jsonl")
if [ "$n" -ge 30 ] && [ "$n" -lt 2000 ]; then ok generate_gpu_killed_part_way; else fail generate_gpu_killed_part_way "$n of 2000 lines when killed: $(tail -2 "$T/cut.err")"; fi
cp "$T/cut.jsonl" "$T/cut.before"
head -n 1 "$T/cut.before" | head -c 40 >>"$T/cut.jsonl" # a crash in the middle of a write
"${GPU[@]}" "${LONG[@]}" -o "$T/cut.jsonl" >"$T/resume.out" 2>"$T/resume.err"
rc=$?
grep -q "dropping a partial last line" "$T/resume.err" && grep -q "already answers $n of the 2000 prompts" "$T/resume.err" \
    && ok generate_gpu_resume_skips_done_and_drops_partial \
    || fail generate_gpu_resume_skips_done_and_drops_partial "exit $rc: $(tail -3 "$T/resume.err")"
d=$(python3 - "$T/many.jsonl" "$T/cut.jsonl" <<'EOF'
import json, sys
prompts = [json.loads(l)["input_ids"] for l in open(sys.argv[1]) if l.strip()]
out = [json.loads(l) for l in open(sys.argv[2])]
lineno = [i + 1 for i, l in enumerate(open(sys.argv[1])) if l.strip()]
if len(out) != len(prompts): print("%d lines, want %d" % (len(out), len(prompts))); sys.exit()
for i, o in enumerate(out):
    p = o["loss_mask"].index(1)
    if o["prompt_line"] != lineno[i] or o["input_ids"][:p] != prompts[i]:
        print("line %d: prompt_line %s, want %d (or its prompt differs)" % (i + 1, o["prompt_line"], lineno[i])); break
EOF
)
[ $rc -eq 0 ] && [ -z "$d" ] && cmp -s "$T/cut.before" <(head -n "$n" "$T/cut.jsonl") && ok generate_gpu_resume_complete_in_order \
    || fail generate_gpu_resume_complete_in_order "exit $rc: $d"
"$BIN/dflash-prepare" -o "$T/prep2" "$T/cut.jsonl" >"$T/prep2.out" 2>&1 && grep -q "^prepared 2000 samples" "$T/prep2.out" \
    && ok generate_gpu_resumed_output_prepares || fail generate_gpu_resumed_output_prepares "$(cat "$T/prep2.out")"
exit $FAILED
