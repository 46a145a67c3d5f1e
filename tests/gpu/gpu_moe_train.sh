#!/usr/bin/env bash
# GPU training with the MoE families' targets (GPU machine): dflash run with job.backend = cuda on the goldens'
# qwen3_moe targets (qwen3moe-tiny(-bf16): experts on some layers, a dense MLP on the others) and gpt_oss targets
# (gptoss-tiny, and gptoss-mxfp4 whose experts load from MXFP4 blocks + scales), dflash-target-cuda and
# dflash-drafter-cuda on one GPU, on the target's own greedy text: the run finishes, every step commits once, the loss
# falls, and the checkpoint's drafter follows the target (its hidden size and vocabulary, taps inside its layers). The
# CPU twin is tests/system/family_jobs.sh (its qwen3_moe and gpt_oss rows).
# Usage: BUILD=build DFLASH_GOLDENS=tests/goldens tests/gpu/gpu_moe_train.sh [GOLDEN...]   (needs the -cuda workers)
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
GOLDENS=${DFLASH_GOLDENS:-tests/goldens}
STEPS=${STEPS:-200}
BACKEND=${BACKEND:-cuda} # BACKEND=cpu runs the same checks on the CPU (the script's own test)

CASES=("$@"); [ $# -gt 0 ] || CASES=(qwen3moe-tiny qwen3moe-tiny-bf16 gptoss-tiny gptoss-mxfp4)
for c in "${CASES[@]}"; do
    rm -rf "$T/target" "$T/data" && cp -r "$GOLDENS/$c/target" "$T/target" && chmod -R u+w "$T/target" &&
    "$BIN/dflash-demo" make-data -q --target "$T/target" -o "$T/data.jsonl" --samples 64 --answer-len 40 --seed 5 \
        >/dev/null 2>"$T/fixture.log" &&
    "$BIN/dflash-prepare" -o "$T/data" "$T/data.jsonl" >/dev/null 2>>"$T/fixture.log" ||
        { fail "gpu_moe_${c}_fixture" "$(tail -3 "$T/fixture.log")"; continue; }
    write_config "$c" "$STEPS"
    sed -i -e "s/^seed = 77$/seed = 77\\nbackend = $BACKEND/" -e 's/^targets = 2$/targets = 1/' \
        -e 's/^drafters = 2$/drafters = 1/' -e 's/^checkpoint_every = 10$/checkpoint_every = 100/' "$T/$c.ini"
    if run_job "$c"; then ok "gpu_moe_${c}_run_completes"
    else fail "gpu_moe_${c}_run_completes" "$(tail -5 "$T/$c.out")"; continue; fi
    if msg=$(check_ledger "$c" "$STEPS" 1); then ok "gpu_moe_${c}_ledger ($msg)"
    else fail "gpu_moe_${c}_ledger" "$msg"; fi
    loss=$(grep -o "loss [0-9.]* -> [0-9.]*" "$T/$c.out" | tail -1)
    if python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if b < a else 1)" \
        $(echo "$loss" | awk '{ print $2, $4 }') 2>/dev/null; then ok "gpu_moe_${c}_loss_falls ($loss)"
    else fail "gpu_moe_${c}_loss_falls" "'$loss': $(tail -3 "$T/$c.out")"; fi
    python3 - "$T/$c/ckpt/latest/config.json" "$T/target/config.json" <<'EOP' && ok "gpu_moe_${c}_checkpoint_follows_target" ||
import json, sys
c, t = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
taps, n = c.get("dflash_config", {}).get("target_layer_ids", []), t["num_hidden_layers"]
ok = c.get("hidden_size") == t["hidden_size"] and c.get("vocab_size") == t["vocab_size"] and \
     c.get("num_target_layers") == n and taps and all(0 <= x < n for x in taps) and c.get("model_type") == "qwen3" \
     and "num_experts" not in c and "num_local_experts" not in c
sys.exit(0 if ok else 1)
EOP
        fail "gpu_moe_${c}_checkpoint_follows_target" "$(head -c 300 "$T/$c/ckpt/latest/config.json")"
done
exit $FAILED
