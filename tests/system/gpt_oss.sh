#!/usr/bin/env bash
# A job whose target is a gpt-oss model (gpt_oss: the gptoss-tiny golden's target: sliding-window and full layers,
# sinks, biases, the clamped SwiGLU experts, YaRN) trains end to end on the CPU on the target's own greedy text: every
# step commits once, the checkpoint's drafter config follows the target (hidden size, vocabulary, its 4 layers, its
# intermediate_size as the MLP width) as a plain Qwen3 model with no gpt_oss field (sliding window, layer kinds
# besides full, biases, YaRN, quantisation), and dflash eval of the drafter (speculative decoding over the target's
# KV cache with its windows, crops inside verified blocks) commits the target's greedy tokens and agrees with the
# walk over its greedy text.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
GOLDENS=${DFLASH_GOLDENS:-tests/goldens}
if [ ! -f "$GOLDENS/gptoss-tiny/target/model.safetensors" ]; then
    echo "skipped: no gpt_oss golden target at $GOLDENS/gptoss-tiny/target"
    exit 77
fi
STEPS=200

cp -r "$GOLDENS/gptoss-tiny/target" "$T/target" && chmod -R u+w "$T/target" &&
"$BIN/dflash-demo" make-data -q --target "$T/target" -o "$T/fit.jsonl" --samples 48 --answer-len 20 --seed 5 \
    >/dev/null 2>"$T/fixture.log" &&
"$BIN/dflash-prepare" -o "$T/data" "$T/fit.jsonl" >/dev/null 2>>"$T/fixture.log" ||
    { fail gpt_oss_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }

write_config fit $STEPS
sed -i "s|^checkpoint_every = .*|checkpoint_every = 0|; s|^lr = .*|lr = 1e-2|" "$T/fit.ini"
if run_job fit; then ok gpt_oss_run_completes; else fail gpt_oss_run_completes "$(tail -5 "$T/fit.out")"; fi
if msg=$(check_ledger fit $STEPS 2); then ok "gpt_oss_ledger ($msg)"; else fail gpt_oss_ledger "$msg"; fi
msg=$(python3 - "$T/fit/ckpt/latest/config.json" <<'EOP'
import json, sys
c = json.load(open(sys.argv[1]))
want = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 96, "vocab_size": 256,
        "num_target_layers": 4, "intermediate_size": 32, "block_size": 4}
errs = ["%s = %r, want %r" % (k, c.get(k), v) for k, v in want.items() if c.get(k) != v]
taps = c.get("dflash_config", {}).get("target_layer_ids", [])
if len(taps) != 2 or any(not 0 <= t < 4 for t in taps): errs.append("target_layer_ids %r" % taps)
if any(t != "full_attention" for t in c.get("layer_types", [])): errs.append("layer_types %r" % c["layer_types"])
if c.get("attention_bias", False) is not False: errs.append("attention_bias %r" % c["attention_bias"])
for k in ("num_experts", "num_local_experts", "num_experts_per_tok", "sliding_window", "rope_scaling", "quantization_config", "swiglu_limit"):
    if k in c: errs.append("gpt_oss field %s leaked into the drafter config" % k)
print("; ".join(errs) if errs else "drafter: hidden 96, vocab 256, taps %s of 4 target layers" % taps)
sys.exit(1 if errs else 0)
EOP
) && ok "gpt_oss_checkpoint_config ($msg)" || fail gpt_oss_checkpoint_config "$msg"

# dflash eval on the drafter's training prompts: decode (KV cache, crops) == walk (one full forward per prompt)
"$BIN/dflash" eval --target "$T/target" --drafter "$T/fit/ckpt/latest" --prompts "$T/fit.jsonl" --limit 6 \
    --max-new-tokens 20 --json >"$T/decode.json" 2>"$T/eval.err" &&
"$BIN/dflash" eval --target "$T/target" --drafter "$T/fit/ckpt/latest" --prompts "$T/fit.jsonl" --limit 6 \
    --max-new-tokens 20 --json --walk >"$T/walk.json" 2>>"$T/eval.err"
rc=$?
msg=$(python3 - "$T/decode.json" "$T/walk.json" <<'EOP'
import json, sys
d, w = (json.load(open(p)) for p in sys.argv[1:3])
errs = []
if not any(1 < a < d["block_size"] for p in d["per_prompt"] for a in p["accepted"]):
    errs.append("no block kept part of its draft (tau %s): no crop inside a block was tested" % d["tau"])
if d["mode"] != "decode" or w["mode"] != "walk": errs.append("modes %s/%s" % (d["mode"], w["mode"]))
if d["outputs_differ"] != 0: errs.append("%d prompts' speculative output differs from greedy" % d["outputs_differ"])
for a, b in zip(d["per_prompt"], w["per_prompt"]):
    if a["accepted"] != b["accepted"] or a["new_tokens"] != b["new_tokens"] or a["new_tokens"] != 20:
        errs.append("line %d: decode %s, walk %s" % (a["line"], a["accepted"], b["accepted"])); break
if d["tau"] != w["tau"] or d["histogram"] != w["histogram"]: errs.append("tau %s vs %s" % (d["tau"], w["tau"]))
print("; ".join(errs) if errs else "tau %.4f, blocks %d" % (d["tau"], sum(len(p["accepted"]) for p in d["per_prompt"])))
sys.exit(1 if errs else 0)
EOP
)
same=$?
[ $rc -eq 0 ] && [ $same -eq 0 ] && ok "gpt_oss_eval_decode_equals_walk ($msg)" || fail gpt_oss_eval_decode_equals_walk "exit $rc: $msg $(tail -2 "$T/eval.err")"

exit $FAILED
