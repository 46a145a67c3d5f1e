#!/usr/bin/env bash
# dflash generate end to end on the tiny fixture: the answers equal dflash-demo make-data's (greedy decoding by the
# full forward, argmax over [0, vocab-1)), token for token; the output is what dflash-prepare reads; it does not
# depend on --threads; EOS (from --eos or the target's generation_config.json) ends an answer and is kept; a run
# killed with SIGKILL (and a partial last line) resumes to the file of an uninterrupted run, with no duplicate; bad
# input fails naming the file and line; hybrid Qwen3.5 targets decode to the full forward's greedy text too (on the GPU: tests/gpu/generate_gpu.sh).
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
make_fixture || { fail generate_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
GEN=("$BIN/dflash" generate --target "$T/target")
V=256

# Prints nothing when OUT (generate's) answers the prompts of REF (make-data's) with the same tokens, else why.
cat >"$T/same.py" <<'EOF'
import json, sys
ref = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = [json.loads(l) for l in open(sys.argv[2])]
if len(ref) != len(out): print("%d lines, want %d" % (len(out), len(ref))); sys.exit()
for i, (r, o) in enumerate(zip(ref, out)):
    if o["prompt_line"] != i + 1: print("line %d: prompt_line %s" % (i + 1, o["prompt_line"])); break
    if (o["input_ids"], o["loss_mask"]) != (r["input_ids"], r["loss_mask"]):
        print("line %d differs: %s vs %s" % (i + 1, o["input_ids"], r["input_ids"])); break
EOF

# ---- the same tokens as make-data's greedy continuations; readable by dflash-prepare; --threads-independent ----
"${GEN[@]}" --prompts "$T/data.jsonl" -o "$T/out2.jsonl" --max-new-tokens 24 --suppress $((V - 1)) --threads 2 \
    >"$T/gen2.out" 2>"$T/gen2.err"
rc=$?
d=$(python3 "$T/same.py" "$T/data.jsonl" "$T/out2.jsonl" 2>&1)
[ $rc -eq 0 ] && [ -z "$d" ] && ok generate_equals_full_forward_greedy || fail generate_equals_full_forward_greedy "exit $rc: $d $(tail -2 "$T/gen2.err")"
grep -q "^generated 48 answers (1152 tokens" "$T/gen2.out" && grep -q "48/48 prompts done, 1152 tokens generated, .* tokens/s" "$T/gen2.err" \
    && ok generate_summary_and_progress || fail generate_summary_and_progress "$(cat "$T/gen2.out" "$T/gen2.err")"
"$BIN/dflash-prepare" -o "$T/prep" "$T/out2.jsonl" >"$T/prep.out" 2>&1 && grep -q "^prepared 48 samples" "$T/prep.out" \
    && ok generate_output_prepares || fail generate_output_prepares "$(cat "$T/prep.out")"
"${GEN[@]}" --prompts "$T/data.jsonl" -o "$T/out1.jsonl" --max-new-tokens 24 --suppress $((V - 1)) --threads 1 -q \
    >/dev/null 2>&1
cmp -s "$T/out1.jsonl" "$T/out2.jsonl" && ok generate_threads_independent || fail generate_threads_independent

# ---- EOS: --eos and generation_config.json end answers after the EOS token, which is kept and trained ----
eos=$(python3 -c "import json; l=json.loads(open('$T/out2.jsonl').readline()); print(l['input_ids'][l['loss_mask'].index(1) + 3])")
"${GEN[@]}" --prompts "$T/data.jsonl" -o "$T/eos.jsonl" --max-new-tokens 24 --suppress $((V - 1)) --eos "$eos" -q >/dev/null 2>&1
cp -r "$T/target" "$T/target_eos" && echo "{\"eos_token_id\": [$eos]}" >"$T/target_eos/generation_config.json"
"$BIN/dflash" generate --target "$T/target_eos" --prompts "$T/data.jsonl" -o "$T/eos2.jsonl" --max-new-tokens 24 \
    --suppress $((V - 1)) -q >/dev/null 2>&1
d=$(python3 - "$T/out2.jsonl" "$T/eos.jsonl" "$eos" <<'EOF'
import json, sys
full = [json.loads(l) for l in open(sys.argv[1])]
cut = [json.loads(l) for l in open(sys.argv[2])]
eos, n_eos = int(sys.argv[3]), 0
for f, c in zip(full, cut):
    p = f["loss_mask"].index(1)
    ans = f["input_ids"][p:]
    k = ans.index(eos) + 1 if eos in ans else len(ans)
    want = f["input_ids"][:p + k]
    if c["input_ids"] != want or c["loss_mask"] != [0] * p + [1] * k:
        print("prompt_line %d: %s, want %s" % (c["prompt_line"], c["input_ids"], want)); break
    if c["stop"] != ("eos" if eos in ans else "max_new_tokens"): print("prompt_line %d: stop %s" % (c["prompt_line"], c["stop"])); break
    n_eos += eos in ans
if len(cut) != len(full): print("%d lines" % len(cut))
elif n_eos == 0: print("no answer met the eos id")
EOF
)
[ -z "$d" ] && ok generate_stops_at_eos || fail generate_stops_at_eos "$d"
# the same answers, and the same recorded settings but for the target's path
d=$(python3 -c "
import json
a = [json.loads(l) for l in open('$T/eos.jsonl')]
b = [json.loads(l) for l in open('$T/eos2.jsonl')]
for l in a + b: l['decoding'].pop('target')
print('' if a == b else 'differ')")
[ -z "$d" ] && ok generate_eos_from_generation_config || fail generate_eos_from_generation_config

# ---- resume: SIGKILL part-way, rerun: the uninterrupted run's file, each prompt once ----
python3 - "$T/data.jsonl" "$T/many.jsonl" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2], "w") as f:
    for i in range(400):
        l = lines[i % len(lines)]
        p = l["loss_mask"].index(1)
        f.write(json.dumps({"input_ids": l["input_ids"][:p]}) + "\n" + ("\n" if i % 7 == 0 else ""))
EOF
LONG=(--prompts "$T/many.jsonl" --max-new-tokens 120 --suppress $((V - 1)) --threads 2 -q)
"${GEN[@]}" "${LONG[@]}" -o "$T/ref.jsonl" >/dev/null 2>"$T/ref.err" || fail generate_reference_run "$(cat "$T/ref.err")"
"${GEN[@]}" "${LONG[@]}" -o "$T/cut.jsonl" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 1 400); do
    [ -f "$T/cut.jsonl" ] && [ "$(wc -l <"$T/cut.jsonl")" -ge 30 ] && break
    sleep 0.02
done
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
n=$(wc -l <"$T/cut.jsonl")
total=$(wc -l <"$T/ref.jsonl")
if [ "$n" -ge 30 ] && [ "$n" -lt "$total" ]; then ok generate_killed_part_way; else fail generate_killed_part_way "$n of $total lines when killed"; fi
# a crash in the middle of a write: half of the next line, without its newline
sed -n "$((n + 1))p" "$T/ref.jsonl" | head -c 40 >>"$T/cut.jsonl"
"${GEN[@]}" "${LONG[@]}" -o "$T/cut.jsonl" >"$T/resume.out" 2>"$T/resume.err"
rc=$?
grep -q "dropping a partial last line" "$T/resume.err" && grep -q "already answers $n of the 400 prompts" "$T/resume.err" \
    && ok generate_resume_skips_done_and_drops_partial || fail generate_resume_skips_done_and_drops_partial "exit $rc: $(cat "$T/resume.err")"
dups=$(python3 -c "import json,collections; c=collections.Counter(json.loads(l)['prompt_line'] for l in open('$T/cut.jsonl')); print(sum(v > 1 for v in c.values()))")
[ $rc -eq 0 ] && cmp -s "$T/cut.jsonl" "$T/ref.jsonl" && [ "$dups" = 0 ] && ok generate_resume_equals_uninterrupted \
    || fail generate_resume_equals_uninterrupted "exit $rc, $dups duplicates, $(wc -l <"$T/cut.jsonl") lines"
cp "$T/cut.jsonl" "$T/cut.before"
"${GEN[@]}" "${LONG[@]}" -o "$T/cut.jsonl" >"$T/again.out" 2>&1
grep -q "^generated 0 answers" "$T/again.out" && cmp -s "$T/cut.jsonl" "$T/cut.before" && ok generate_rerun_when_done_is_noop \
    || fail generate_rerun_when_done_is_noop "$(cat "$T/again.out")"
# an output made from other prompts (with the same settings) is refused, untouched
"${GEN[@]}" --prompts "$T/data.jsonl" -o "$T/cut.jsonl" --max-new-tokens 120 --suppress $((V - 1)) -q >/dev/null 2>"$T/other.err"
rc=$?
[ $rc -eq 1 ] && grep -q "cut.jsonl:[0-9]*: prompt_line [0-9]*: its prompt differs" "$T/other.err" && cmp -s "$T/cut.jsonl" "$T/cut.before" \
    && ok generate_refuses_output_of_other_prompts || fail generate_refuses_output_of_other_prompts "exit $rc: $(cat "$T/other.err")"

# a second run on the same output while one holds it is refused
if command -v flock >/dev/null; then
    flock "$T/cut.jsonl" "${GEN[@]}" "${LONG[@]}" -o "$T/cut.jsonl" >/dev/null 2>"$T/lock.err"
    rc=$?
    [ $rc -eq 1 ] && grep -q "cut.jsonl: another dflash generate is writing it" "$T/lock.err" && cmp -s "$T/cut.jsonl" "$T/cut.before" \
        && ok generate_refuses_concurrent_writer || fail generate_refuses_concurrent_writer "exit $rc: $(cat "$T/lock.err")"
fi

# ---- sampling: a pure function of (seed, prompt line, position): --threads-independent, resumable, recorded ----
SAMP=(--prompts "$T/data.jsonl" --max-new-tokens 24 --suppress $((V - 1)) -q)
"${GEN[@]}" "${SAMP[@]}" --temperature 1 --seed 7 --threads 1 -o "$T/s1.jsonl" >/dev/null 2>"$T/s1.err"
rc1=$?
"${GEN[@]}" "${SAMP[@]}" --temperature 1 --seed 7 --threads 3 -o "$T/s3.jsonl" >/dev/null 2>&1
"${GEN[@]}" "${SAMP[@]}" --temperature 1 --seed 8 --threads 2 -o "$T/s8.jsonl" >/dev/null 2>&1
d=$(python3 - "$T/out2.jsonl" "$T/s1.jsonl" "$T/s8.jsonl" <<'EOF2'
import json, sys
greedy, s7, s8 = ([json.loads(l) for l in open(f)] for f in sys.argv[1:4])
if len(s7) != len(greedy): print("%d lines, want %d" % (len(s7), len(greedy))); sys.exit()
for g, a in zip(greedy, s7):
    p = g["loss_mask"].index(1)
    if a["input_ids"][:p] != g["input_ids"][:p] or a["loss_mask"] != [0] * p + [1] * (len(a["input_ids"]) - p):
        print("prompt_line %d: prompt or mask changed" % a["prompt_line"]); sys.exit()
    if a.get("sampling") != {"temperature": 1, "top_p": 1, "seed": 7}: print("sampling %s" % a.get("sampling")); sys.exit()
    if "sampling" in g: print("a greedy line records sampling"); sys.exit()
diff = sum(a["input_ids"] != g["input_ids"] for g, a in zip(greedy, s7))
other = sum(a["input_ids"] != b["input_ids"] for a, b in zip(s7, s8))
if diff < len(greedy) // 2: print("only %d of %d sampled answers differ from greedy" % (diff, len(greedy)))
elif other < len(greedy) // 2: print("seeds 7 and 8 differ on %d of %d answers only" % (other, len(greedy)))
else: print("ok %d of %d differ from greedy, %d between seeds" % (diff, len(greedy), other))
EOF2
)
[ $rc1 -eq 0 ] && [ "${d#ok}" != "$d" ] && ok "generate_samples_with_temperature (${d#ok })" || fail generate_samples_with_temperature "exit $rc1: $d $(tail -2 "$T/s1.err")"
cmp -s "$T/s1.jsonl" "$T/s3.jsonl" && ok generate_sampling_threads_independent || fail generate_sampling_threads_independent
"$BIN/dflash-prepare" -o "$T/sprep" "$T/s1.jsonl" >"$T/sprep.out" 2>&1 && grep -q "^prepared 48 samples" "$T/sprep.out" \
    && ok generate_sampled_output_prepares || fail generate_sampled_output_prepares "$(cat "$T/sprep.out")"
# a nucleus of (almost) nothing is the greedy choice; so is temperature 1e-6 (bar exact ties)
"${GEN[@]}" "${SAMP[@]}" --temperature 1 --top-p 1e-9 -o "$T/nucleus.jsonl" >/dev/null 2>&1
d=$(python3 -c "
import json, sys
g = [json.loads(l)['input_ids'] for l in open('$T/out2.jsonl')]
n = [json.loads(l)['input_ids'] for l in open('$T/nucleus.jsonl')]
print('' if g == n else '%d of %d answers differ from greedy' % (sum(a != b for a, b in zip(g, n)), len(g)))")
[ -z "$d" ] && ok generate_top_p_tiny_is_greedy || fail generate_top_p_tiny_is_greedy "$d"
# resumed after a cut: the same draws; a rerun with other settings on the same output is refused, the file untouched
head -n 20 "$T/s1.jsonl" >"$T/sres.jsonl"
"${GEN[@]}" "${SAMP[@]}" --temperature 1 --seed 7 --threads 2 -o "$T/sres.jsonl" >/dev/null 2>"$T/sres.err"
cmp -s "$T/sres.jsonl" "$T/s1.jsonl" && grep -q "already answers 20 of the 48" "$T/sres.err" && ok generate_sampling_resumes_same_draws \
    || fail generate_sampling_resumes_same_draws "$(cat "$T/sres.err")"
head -n 20 "$T/s1.jsonl" >"$T/smix.jsonl"
cp "$T/smix.jsonl" "$T/smix.before"
"${GEN[@]}" "${SAMP[@]}" --temperature 1 --seed 9 -o "$T/smix.jsonl" >/dev/null 2>"$T/smix.err"
rc=$?
"${GEN[@]}" "${SAMP[@]}" -o "$T/smix.jsonl" >/dev/null 2>"$T/smix2.err"
rc2=$?
[ $rc -eq 1 ] && [ $rc2 -eq 1 ] && cmp -s "$T/smix.jsonl" "$T/smix.before" &&
    grep -q "smix.jsonl:1: prompt_line 1: decoded with temperature 1, top_p 1, seed 7, this run with temperature 1, top_p 1, seed 9" "$T/smix.err" &&
    grep -q "smix.jsonl:1: prompt_line 1: decoded with temperature 1, top_p 1, seed 7, this run greedily" "$T/smix2.err" \
    && ok generate_refuses_other_sampling_settings || fail generate_refuses_other_sampling_settings "exit $rc/$rc2: $(cat "$T/smix.err" "$T/smix2.err")"
sed '1s/"sampling": {[^}]*}/"sampling": "hot"/' "$T/smix.before" >"$T/sbad.jsonl"
"${GEN[@]}" "${SAMP[@]}" --temperature 1 --seed 7 -o "$T/sbad.jsonl" >/dev/null 2>"$T/sbad.err"
[ $? -eq 1 ] && grep -q 'sbad.jsonl:1: prompt_line 1: its "sampling" needs numbers' "$T/sbad.err" && ok generate_refuses_bad_sampling_record \
    || fail generate_refuses_bad_sampling_record "$(cat "$T/sbad.err")"
# every other setting that changes the text is recorded too ("decoding"): a rerun with another is refused, naming the
# file, the line and both values, the file untouched; the same target's files under another path resume
head -n 10 "$T/out2.jsonl" >"$T/set.jsonl"
cp "$T/set.jsonl" "$T/set.before"
"$BIN/dflash-demo" make-target "$T/target2" --seed 12 --hidden 32 --layers 4 --heads 4 --kv-heads 2 --head-dim 8 \
    --intermediate 64 --vocab 256 >/dev/null 2>&1
digest() { python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['decoding']['target_digest'])" "$1"; }
refused() { # name, expected message (fixed string), generate's arguments
    local name=$1 want=$2
    shift 2
    "$BIN/dflash" generate --prompts "$T/data.jsonl" -q "$@" -o "$T/set.jsonl" >/dev/null 2>"$T/set_$name.err"
    local rc=$?
    [ $rc -eq 1 ] && grep -qF -- "set.jsonl:1: prompt_line 1: decoded with $want (rerun with its settings)" "$T/set_$name.err" &&
        cmp -s "$T/set.jsonl" "$T/set.before" && ok "generate_refuses_other_$name" \
        || fail "generate_refuses_other_$name" "exit $rc: $(cat "$T/set_$name.err")"
}
S=(--suppress $((V - 1)))
refused max_new_tokens "--max-new-tokens 24, this run with --max-new-tokens 30" --target "$T/target" "${S[@]}" --max-new-tokens 30
refused max_len "--max-len 4096, this run with --max-len 100" --target "$T/target" "${S[@]}" --max-new-tokens 24 --max-len 100
refused suppress "--suppress $((V - 1)), this run with --suppress 7 $((V - 1))" --target "$T/target" "${S[@]}" --suppress 7 --max-new-tokens 24
refused eos "--eos none, this run with --eos 3" --target "$T/target" "${S[@]}" --eos 3 --max-new-tokens 24
"${GEN[@]}" --prompts "$T/data.jsonl" -o "$T/t2probe.jsonl" --limit 1 --max-new-tokens 2 -q >/dev/null 2>&1
"$BIN/dflash" generate --target "$T/target2" --prompts "$T/data.jsonl" -o "$T/t2.jsonl" --limit 1 --max-new-tokens 2 -q >/dev/null 2>&1
refused target "--target $T/target (digest $(digest "$T/t2probe.jsonl")), this run with --target $T/target2 (digest $(digest "$T/t2.jsonl"))" \
    --target "$T/target2" "${S[@]}" --max-new-tokens 24
cp -r "$T/target" "$T/target_copy"
"$BIN/dflash" generate --target "$T/target_copy" --prompts "$T/data.jsonl" "${S[@]}" --max-new-tokens 24 --threads 1 \
    -o "$T/set.jsonl" >"$T/set_copy.out" 2>"$T/set_copy.err"
rc=$?
d=$(python3 -c "
import json, sys
a = [json.loads(l)['input_ids'] for l in open('$T/set.jsonl')]
b = [json.loads(l)['input_ids'] for l in open('$T/out2.jsonl')]
print('' if a == b else 'the resumed answers differ')")
[ $rc -eq 0 ] && [ -z "$d" ] && grep -q "already answers 10 of the 48" "$T/set_copy.err" && ok generate_same_target_elsewhere_resumes \
    || fail generate_same_target_elsewhere_resumes "exit $rc: $d $(cat "$T/set_copy.err")"
grep -q "tokens/s on 1 thread); 10 already in" "$T/set_copy.out" && ok generate_summary_says_1_thread \
    || fail generate_summary_says_1_thread "$(cat "$T/set_copy.out")"
# usage errors name the flag
"${GEN[@]}" "${SAMP[@]}" --temperature -1 -o "$T/x.out" >/dev/null 2>"$T/t1.err"; a=$?
"${GEN[@]}" "${SAMP[@]}" --temperature 1 --top-p 0 -o "$T/x.out" >/dev/null 2>"$T/t2.err"; b=$?
"${GEN[@]}" "${SAMP[@]}" --seed 3 -o "$T/x.out" >/dev/null 2>"$T/t3.err"; c=$?
[ $a -eq 2 ] && [ $b -eq 2 ] && [ $c -eq 2 ] && grep -q -- "--temperature: '-1' is not a number in \[0, 100\]" "$T/t1.err" &&
    grep -q -- "--top-p: '0' is not a number in (0, 1\]" "$T/t2.err" && grep -q -- "--seed needs --temperature > 0" "$T/t3.err" &&
    [ ! -e "$T/x.out" ] && ok generate_sampling_usage_errors || fail generate_sampling_usage_errors "$a $b $c: $(cat "$T/t1.err" "$T/t2.err" "$T/t3.err")"

# ---- bad input: exit 1, the message names the file and line (or the field); usage errors exit 2 ----
bad() { # name, expected message (grep -E), file content; runs generate on it
    local name=$1 want=$2
    printf '%b' "$3" >"$T/$name.jsonl"
    "${GEN[@]}" --prompts "$T/$name.jsonl" -o "$T/$name.out" "${@:4}" >/dev/null 2>"$T/$name.err"
    local rc=$?
    if [ $rc -eq 1 ] && grep -qE -- "$want" "$T/$name.err" && [ ! -s "$T/$name.out" ]; then ok "generate_bad_$name"
    else fail "generate_bad_$name" "exit $rc: $(cat "$T/$name.err")"; fi
}
bad json "bad_json.jsonl|json.jsonl:3: invalid JSON" '{"input_ids": [1, 2]}\n\n{"input_ids": [1,\n'
bad no_prompt "no_prompt.jsonl:2: loss_mask\\[0\\] is trained" '{"input_ids": [1, 2]}\n{"input_ids": [1, 2], "loss_mask": [1, 1]}\n'
bad id_range "id_range.jsonl:1: input_ids\\[1\\] = $V outside" "{\"input_ids\": [1, $V]}\n"
bad empty "empty.jsonl: no prompt" '\n\n'
bad too_long "too_long.jsonl:2: prompt of 12 tokens leaves no room in the cache of 12 positions \\(--max-len\\)" \
    '{"input_ids": [1, 2]}\n{"input_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]}\n' --max-len 12
bad no_ids "no_ids.jsonl:1: input_ids: missing" '{"messages": [{"role": "user", "content": "hi"}]}\n'
"${GEN[@]}" --prompts "$T/missing.jsonl" -o "$T/x.out" >/dev/null 2>"$T/missing.err"
rc=$?
[ $rc -eq 1 ] && grep -q "missing.jsonl" "$T/missing.err" && ok generate_bad_missing_file || fail generate_bad_missing_file "exit $rc: $(cat "$T/missing.err")"
"$BIN/dflash" generate --prompts "$T/data.jsonl" -o "$T/x.out" >/dev/null 2>"$T/usage.err"
rc=$?
[ $rc -eq 2 ] && grep -q "missing --target" "$T/usage.err" && ok generate_usage_error || fail generate_usage_error "exit $rc: $(cat "$T/usage.err")"
"${GEN[@]}" --prompts "$T/data.jsonl" -o "$T/x.out" --max-new-tokens 0 >/dev/null 2>"$T/usage2.err"
[ $? -eq 2 ] && grep -q -- "--max-new-tokens" "$T/usage2.err" && ok generate_usage_bad_value || fail generate_usage_bad_value "$(cat "$T/usage2.err")"
"$BIN/dflash" generate --help | grep -q -- "--max-new-tokens" && ok generate_help || fail generate_help
# the CPU-only build names the build that has the CUDA backend (tests/gpu/generate_gpu.sh runs that one)
"${GEN[@]}" --prompts "$T/data.jsonl" -o "$T/cuda.out" --backend cuda >/dev/null 2>"$T/cuda.err"
[ $? -eq 1 ] && grep -q "no CUDA backend; run dflash-cuda" "$T/cuda.err" && [ ! -e "$T/cuda.out" ] && ok generate_cpu_build_refuses_cuda \
    || fail generate_cpu_build_refuses_cuda "$(cat "$T/cuda.err")"
# hybrid Qwen3.5 targets (the goldens, when present; dense and MoE): decoding with their linear-attention states
# gives make-data's greedy continuations (the full forward) token for token
# (and the qwen3_moe goldens: their KV cache with the MoE block on the new rows; the gpt_oss ones: sliding layers
# reading a window of their cache, sinks, MXFP4 experts)
for c in qwen35-tiny qwen35moe-tiny qwen3moe-tiny qwen3moe-tiny-bf16 gptoss-tiny gptoss-mxfp4; do
    HYB=${DFLASH_GOLDENS:-tests/goldens}/$c/target
    [ -f "$HYB/config.json" ] || continue
    "$BIN/dflash-demo" make-data -q --target "$HYB" -o "$T/$c.ref.jsonl" --samples 8 --answer-len 20 --seed 7 \
        >/dev/null 2>"$T/$c.err" &&
    "$BIN/dflash" generate --target "$HYB" --prompts "$T/$c.ref.jsonl" -o "$T/$c.out" --max-new-tokens 20 \
        --suppress "$(python3 -c "import json; print(json.load(open('$HYB/config.json'))['vocab_size'] - 1)")" -q \
        >/dev/null 2>>"$T/$c.err"
    rc=$?
    d=$(python3 "$T/same.py" "$T/$c.ref.jsonl" "$T/$c.out" 2>&1)
    kind=hybrid; [ "${c#qwen3moe}" != "$c" ] && kind=qwen3_moe; [ "${c#gptoss}" != "$c" ] && kind=gpt_oss
    [ $rc -eq 0 ] && [ -z "$d" ] && ok "generate_${kind}_equals_full_forward_greedy ($c)" \
        || fail "generate_${kind}_equals_full_forward_greedy ($c)" "exit $rc: $d $(tail -2 "$T/$c.err")"
done
exit $FAILED
