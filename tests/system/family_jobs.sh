#!/usr/bin/env bash
# A job on each MoE target family's golden target, one row per family: it trains end to end on the CPU on the
# target's own greedy text (every step commits once); the checkpoint's drafter config follows the target (hidden
# size, vocabulary, its layer count, its MLP width) as a plain Qwen3 drafter with none of the family's own fields
# (experts, sliding windows, biases, YaRN, quantisation) and full-attention layers only; and dflash eval of the
# drafter (speculative decoding over the target's KV cache -- with its windows for gpt_oss -- crops inside verified
# blocks) commits the target's greedy tokens and agrees with the walk over its greedy text. A new family is a row.
# The GPU twin of the qwen3_moe and gpt_oss rows is tests/gpu/gpu_moe_train.sh.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
GOLDENS=${DFLASH_GOLDENS:-tests/goldens}
STEPS=200

# family | golden case | the drafter config's fields (JSON) | the family's fields that must not reach the drafter
ROWS=(
    'qwen3_moe|qwen3moe-tiny|{"hidden_size": 64, "vocab_size": 256, "num_target_layers": 6, "intermediate_size": 96}|num_experts num_local_experts moe_intermediate_size mlp_only_layers decoder_sparse_step'
    'gpt_oss|gptoss-tiny|{"hidden_size": 96, "vocab_size": 256, "num_target_layers": 4, "intermediate_size": 32}|num_experts num_local_experts num_experts_per_tok sliding_window rope_scaling quantization_config swiglu_limit'
)

family_job() { # FAMILY CASE WANT FORBIDDEN
    local fam=$1 case=$2 want=$3 forbidden=$4 d="$T/$1"
    if [ ! -f "$GOLDENS/$case/target/model.safetensors" ]; then
        echo "skipped $fam: no golden target at $GOLDENS/$case/target"
        return
    fi
    mkdir -p "$d"
    cp -r "$GOLDENS/$case/target" "$d/target" && chmod -R u+w "$d/target" &&
    "$BIN/dflash-demo" make-data -q --target "$d/target" -o "$d/fit.jsonl" --samples 48 --answer-len 20 --seed 5 \
        >/dev/null 2>"$d/fixture.log" &&
    "$BIN/dflash-prepare" -o "$d/data" "$d/fit.jsonl" >/dev/null 2>>"$d/fixture.log" ||
        { fail ${fam}_fixture "$(tail -3 "$d/fixture.log")"; return; }

    local job=fit_$fam msg rc same
    write_config $job $STEPS
    sed -i "s|^checkpoint_every = .*|checkpoint_every = 0|; s|^lr = .*|lr = 1e-2|; s|^path = .*|path = $d/data|; s|^model = .*|model = $d/target|" "$T/$job.ini"
    if run_job $job; then ok ${fam}_run_completes; else fail ${fam}_run_completes "$(tail -5 "$T/$job.out")"; fi
    if msg=$(check_ledger $job $STEPS 2); then ok "${fam}_ledger ($msg)"; else fail ${fam}_ledger "$msg"; fi
    msg=$(python3 - "$T/$job/ckpt/latest/config.json" "$want" "$forbidden" <<'EOP'
import json, sys
c = json.load(open(sys.argv[1]))
want = dict(json.loads(sys.argv[2]), architectures=["DFlashDraftModel"], model_type="qwen3", block_size=4)
errs = ["%s = %r, want %r" % (k, c.get(k), v) for k, v in want.items() if c.get(k) != v]
L = want["num_target_layers"]
taps = c.get("dflash_config", {}).get("target_layer_ids", [])
if len(taps) != 2 or any(not 0 <= t < L for t in taps): errs.append("target_layer_ids %r" % taps)
if any(t != "full_attention" for t in c.get("layer_types", [])): errs.append("layer_types %r" % c["layer_types"])
if c.get("attention_bias", False) is not False: errs.append("attention_bias %r" % c["attention_bias"])
for k in sys.argv[3].split():
    if k in c: errs.append("the target family's field %s leaked into the drafter config" % k)
print("; ".join(errs) if errs else "drafter: hidden %d, vocab %d, taps %s of %d target layers" %
      (c["hidden_size"], c["vocab_size"], taps, L))
sys.exit(1 if errs else 0)
EOP
    ) && ok "${fam}_checkpoint_config ($msg)" || fail ${fam}_checkpoint_config "$msg"

    # dflash eval on the drafter's training prompts: decode (KV cache, crops) == walk (one full forward per prompt)
    if msg=$(decode_equals_walk "$d/target" "$T/$job/ckpt/latest" "$d/fit.jsonl" "$d/eval" 1); then
        ok "${fam}_eval_decode_equals_walk ($msg)"
    else fail ${fam}_eval_decode_equals_walk "$msg"; fi
}

for row in "${ROWS[@]}"; do
    IFS='|' read -r fam case want forbidden <<<"$row"
    family_job "$fam" "$case" "$want" "$forbidden"
done
exit $FAILED
