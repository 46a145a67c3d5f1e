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
. tests/gpu/lib.bash
GOLDENS=${DFLASH_GOLDENS:-tests/goldens}
STEPS=${STEPS:-200}

CASES=("$@"); [ $# -gt 0 ] || CASES=(qwen3moe-tiny qwen3moe-tiny-bf16 gptoss-tiny gptoss-mxfp4)
for c in "${CASES[@]}"; do
    rm -rf "$T/target" "$T/data" && cp -r "$GOLDENS/$c/target" "$T/target" && chmod -R u+w "$T/target" &&
    prepared_data "$T/target" "$T/data" || { fail "gpu_moe_${c}_fixture" "$(tail -3 "$T/fixture.log")"; continue; }
    gpu_config "$c" train.checkpoint_every=100
    train_checks "gpu_moe_$c" "$c"
done
exit $FAILED
