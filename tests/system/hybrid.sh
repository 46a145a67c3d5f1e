#!/usr/bin/env bash
# A job whose target is a hybrid Qwen3.5 model (Gated DeltaNet + gated attention; the qwen35-tiny golden's target,
# and the MoE one) trains end to end on the CPU: steps commit once each, the checkpoint's drafter config follows the
# target (hidden size, vocabulary, 6 target layers, taps inside them, a Qwen3-style drafter with full RoPE), and a
# run stopped part-way resumes to the same ledger; dflash eval of the drafters on the hybrid targets: decoding (KV
# cache + linear-attention states) commits the greedy tokens and agrees with the walk over the target's greedy text.
# The training data come from a Qwen3 demo target of the same vocabulary.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
GOLDENS=${DFLASH_GOLDENS:-tests/goldens}
for c in qwen35-tiny qwen35moe-tiny; do
    if [ ! -f "$GOLDENS/$c/target/model.safetensors" ]; then
        echo "skipped: no hybrid golden target at $GOLDENS/$c/target"
        exit 77
    fi
done
STEPS=24
MOE_STEPS=60 # room to stop it after its first checkpoint (step 10)

"$BIN/dflash-demo" make-target "$T/datagen" --seed 11 --hidden 32 --layers 2 --heads 4 --kv-heads 2 --head-dim 8 \
    --intermediate 64 --vocab 512 >/dev/null 2>"$T/fixture.log" &&
"$BIN/dflash-demo" make-data -q --target "$T/datagen" -o "$T/data.jsonl" --samples 48 --answer-len 24 --seed 5 \
    >/dev/null 2>>"$T/fixture.log" &&
"$BIN/dflash-prepare" -o "$T/data" "$T/data.jsonl" >/dev/null 2>>"$T/fixture.log" &&
cp -r "$GOLDENS/qwen35-tiny/target" "$T/target" && chmod -R u+w "$T/target" ||
    { fail hybrid_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }

# check_ckpt NAME: the drafter checkpoint's config.json follows the hybrid target
check_ckpt() {
    python3 - "$T/$1/ckpt/latest/config.json" <<'EOP'
import json, sys
c = json.load(open(sys.argv[1]))
want = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 64, "vocab_size": 512,
        "num_target_layers": 6, "num_hidden_layers": 1, "block_size": 4}
errs = ["%s = %r, want %r" % (k, c.get(k), v) for k, v in want.items() if c.get(k) != v]
taps = c.get("dflash_config", {}).get("target_layer_ids", [])
if len(taps) != 2 or any(not 0 <= t < 6 for t in taps): errs.append("target_layer_ids %r" % taps)
if c.get("layer_types") != ["full_attention"]: errs.append("layer_types %r" % c.get("layer_types"))
for k in ("partial_rotary_factor", "linear_num_key_heads", "num_experts", "text_config"):
    if k in c: errs.append("hybrid field %s leaked into the drafter config" % k)
print("; ".join(errs) if errs else "drafter: hidden 64, vocab 512, taps %s of 6 target layers" % taps)
sys.exit(1 if errs else 0)
EOP
}

# eval_agrees NAME: dflash eval of NAME's drafter on the hybrid target: speculative decoding with the target's KV cache
# and linear-attention states (crops inside every verified block) commits the target-only greedy tokens, and gives
# the accepted lengths of the walk over the target's own greedy text (one full forward), block by block. PROMPTS
# (default: held-out prompts) given: its first 6 lines, and some block must keep part of its draft (a crop inside it)
eval_agrees() { # NAME [PROMPTS]: decode == walk for run NAME's drafter (with PROMPTS: its fitted ones, crops inside blocks)
    local n=$1 prompts=${2:-$T/$1.greedy.jsonl}
    [ -n "${2:-}" ] || "$BIN/dflash-demo" make-data -q --target "$T/target" -o "$prompts" --samples 6 --answer-len 20 \
        --seed 9 >/dev/null 2>"$T/$n.eval.err" || { tail -3 "$T/$n.eval.err"; return 1; }
    decode_equals_walk "$T/target" "$T/$n/ckpt/latest" "$prompts" "$T/$n" "$([ -n "${2:-}" ] && echo 1)"
}

write_config dense $STEPS
if run_job dense; then ok hybrid_dense_run_completes
else fail hybrid_dense_run_completes "$(tail -5 "$T/dense.out")"; fi
if msg=$(check_ledger dense $STEPS 2); then ok "hybrid_dense_ledger ($msg)"; else fail hybrid_dense_ledger "$msg"; fi
if msg=$(check_ckpt dense); then ok "hybrid_dense_checkpoint_config ($msg)"
else fail hybrid_dense_checkpoint_config "$msg"; fi
if msg=$(eval_agrees dense); then ok "hybrid_dense_eval_decode_equals_walk ($msg)"
else fail hybrid_dense_eval_decode_equals_walk "$msg"; fi

# a drafter fitted (300 steps, lr 1e-2) to the hybrid target's own greedy text: on its training prompts blocks keep
# part of their drafts, so decoding crops inside verified blocks at every length
"$BIN/dflash-demo" make-data -q --target "$T/target" -o "$T/fit.jsonl" --samples 48 --answer-len 20 --seed 5 \
    >/dev/null 2>>"$T/fixture.log" &&
    "$BIN/dflash-prepare" -o "$T/fitdata" "$T/fit.jsonl" >/dev/null 2>>"$T/fixture.log"
write_config fit 300
sed -i "s|^checkpoint_every = .*|checkpoint_every = 0|; s|^lr = .*|lr = 1e-2|; s|^path = .*|path = $T/fitdata|" \
    "$T/fit.ini"
if run_job fit && msg=$(eval_agrees fit "$T/fit.jsonl"); then ok "hybrid_fitted_eval_decode_equals_walk ($msg)"
else fail hybrid_fitted_eval_decode_equals_walk "${msg:-} $(tail -3 "$T/fit.out")"; fi

# the MoE target, and a run stopped part-way then resumed
rm -rf "$T/target" && cp -r "$GOLDENS/qwen35moe-tiny/target" "$T/target" && chmod -R u+w "$T/target"
write_config moe $MOE_STEPS
"$BIN/dflash" run -c "$T/moe.ini" >"$T/moe.out" 2>&1 &
sup=$!
deadline=$((SECONDS + 120))
until [ -f "$T/moe/ckpt/step-00000010/trainer_state.json" ] || [ $SECONDS -ge $deadline ]; do sleep 0.05; done
kill -TERM $sup
wait $sup
stopped_at=$(wc -l <"$T/moe/ledger.jsonl" 2>/dev/null || echo 0)
if [ "$stopped_at" -ge 10 ] && [ "$stopped_at" -lt $MOE_STEPS ]; then
    ok "hybrid_moe_stopped_part_way (step $stopped_at of $MOE_STEPS)"
else fail hybrid_moe_stopped_part_way "ledger has $stopped_at steps: $(tail -3 "$T/moe.out")"; fi
if run_job moe --resume; then ok hybrid_moe_resume_completes
else fail hybrid_moe_resume_completes "$(tail -5 "$T/moe.out")"; fi
grep -q "resuming from" "$T/moe/logs/dflashd.log" && ok hybrid_moe_resumed_from_checkpoint ||
    fail hybrid_moe_resumed_from_checkpoint "dflashd did not say it resumed"
if msg=$(check_ledger moe $MOE_STEPS 2); then ok "hybrid_moe_ledger_exactly_once ($msg)"
else fail hybrid_moe_ledger_exactly_once "$msg"; fi
if msg=$(check_ckpt moe); then ok "hybrid_moe_checkpoint_config ($msg)"; else fail hybrid_moe_checkpoint_config "$msg"; fi
if msg=$(eval_agrees moe); then ok "hybrid_moe_eval_decode_equals_walk ($msg)"
else fail hybrid_moe_eval_decode_equals_walk "$msg"; fi
exit $FAILED
