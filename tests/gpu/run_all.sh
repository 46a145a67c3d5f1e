#!/usr/bin/env bash
# Every GPU test and benchmark in one go, for one device command on the GPU machine:
#   BUILD=<folder with bin/ gpu/ bench/> OUT=<log folder> GOLDENS=<goldens dir> TORCH=<torch_drafter_anchor.py>
#   tests/gpu/run_all.sh [quick | bench]
# Writes $OUT/tests.log (every test's lines, then "N passed, N failed") and $OUT/bench.log (bench_drafter, then the
# PyTorch reference in the same process tree, so the two figures come from one run; bench_decode; the hybrid target
# and transformers' model). quick: tests only; bench: benchmarks only (the two fit the device's 10-minute calls).
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/dflash-gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
GOLDENS=${GOLDENS:-tests/goldens}
export DFLASH_GOLDENS=${DFLASH_GOLDENS:-$GOLDENS} # test_target_gpu's goldens
log="$OUT/tests.log"
: >"$log"
pass=0 fail=0
one() { # LABEL COMMAND...
    local label=$1 t0=$SECONDS out
    shift
    out=$("$@" 2>&1)
    local rc=$?
    local p f
    p=$(grep -cE '^ok | ok$' <<<"$out"); f=$(grep -cE '^FAIL | FAIL$' <<<"$out")
    [ $rc -ne 0 ] && [ "$f" -eq 0 ] && f=1
    pass=$((pass + p)); fail=$((fail + f))
    { echo "=== $label: $p passed, $f failed, exit $rc ($((SECONDS - t0)) s)"; echo "$out"; } >>"$log"
    echo "$label: $p passed, $f failed, exit $rc ($((SECONDS - t0)) s)"
}
nvidia-smi -L >>"$log" 2>&1
if [ "${1:-}" != bench ]; then
one gpu_train env BUILD="$BUILD" STEPS="${STEPS:-4000}" timeout 300 bash tests/gpu/gpu_train.sh
# every kernel against its CPU reference, twice bitwise: the rows of the kernel case table (tests/kernel_cases.c)
for t in test_kernel_cases_gpu test_vmm_pool test_decode_gpu; do
    [ -x "$BUILD/gpu/$t" ] && one "$t" timeout 300 "$BUILD/gpu/$t"
done
# the target forward, one process per family (the hybrid one also writes checkpoints and runs CPU references)
one test_target_gpu timeout 300 "$BUILD/gpu/test_target_gpu" qwen3
# the Q side of qk_norm_rope folded into the attention (attention_qfold_applies; opt-in, measured slower)
one test_target_gpu_qfold env DFLASH_ATTENTION_QFOLD=1 timeout 300 "$BUILD/gpu/test_target_gpu" qwen3
one test_target_gpu_hybrid timeout 480 "$BUILD/gpu/test_target_gpu" hybrid
one test_target_gpu_qwen3_moe timeout 300 "$BUILD/gpu/test_target_gpu" qwen3_moe
one test_target_gpu_gpt_oss timeout 300 "$BUILD/gpu/test_target_gpu" gpt_oss
[ -n "${GOLDENS:-}" ] && one test_drafter_gpu timeout 180 "$BUILD/gpu/test_drafter_gpu" "$GOLDENS"
one gpu_pipeline env BUILD="$BUILD" timeout 180 bash tests/gpu/gpu_pipeline.sh
one gpu_keep_weights env BUILD="$BUILD" timeout 240 bash tests/gpu/gpu_keep_weights.sh
one gpu_hybrid_train env BUILD="$BUILD" timeout 240 bash tests/gpu/gpu_hybrid_train.sh
one gpu_moe_train env BUILD="$BUILD" timeout 300 bash tests/gpu/gpu_moe_train.sh
one generate_gpu env BUILD="$BUILD" timeout 300 bash tests/gpu/generate_gpu.sh
one eval_gpu env BUILD="$BUILD" timeout 300 bash tests/gpu/eval_gpu.sh
one swa_eval_gpu env BUILD="$BUILD" timeout 180 bash tests/gpu/swa_eval_gpu.sh
# z-lab's own loop on a sliding-window drafter (needs their model.py: ZLAB=, see the script)
[ -f "${ZLAB:-zlab-dflash/dflash/model.py}" ] && one zlab_swa_gpu env BUILD="$BUILD" timeout 200 bash tests/gpu/zlab_swa_gpu.sh
one gpu_eval_worker env BUILD="$BUILD" timeout 330 bash tests/gpu/gpu_eval_worker.sh
one poisoned_gpu env BUILD="$BUILD" timeout 180 bash tests/gpu/poisoned_gpu.sh
one demo_learns_gpu env BUILD="$BUILD" timeout 180 bash tests/gpu/demo_learns_gpu.sh
echo "$pass passed, $fail failed" | tee -a "$log"
fi
[ "${1:-}" = quick ] && exit $((fail > 0))
{ "$BUILD/bench/bench_drafter"; [ -n "${TORCH:-}" ] && python3 "$TORCH"
  "$BUILD/bench/bench_drafter" --family qwen3_5 # the drafter derived from the hybrid target: heads of 256, V 248320
  "$BUILD/bench/bench_decode"
  "$BUILD/bench/bench_decode" --family qwen3_5 # decoding the hybrid target: batch 1 and 64 against the weight-read bound
  # the hybrid (Qwen3.5-9B-shaped) target and transformers' model on the same batch
  "$BUILD/bench/bench_target" --family qwen3_5; python3 bench/torch_hybrid_anchor.py
  # the Qwen3.5-35B-A3B-shaped MoE target and transformers + flash-linear-attention on the same batch
  "$BUILD/bench/bench_target" --family qwen3_5_moe; python3 bench/torch_hybrid_anchor.py --family qwen3_5_moe --path fla
  # the gpt-oss-20b-shaped target and transformers' GptOssModel on the same batch
  "$BUILD/bench/bench_target" --family gpt_oss; python3 bench/torch_gptoss_anchor.py
  "$BUILD/bench/bench_moe"   # one of its MoE layers kernel by kernel
  # the Qwen3-30B-A3B-shaped qwen3_moe target and transformers' Qwen3MoeForCausalLM on the same batch (one after the other)
  "$BUILD/bench/bench_target" --family qwen3_moe; python3 bench/torch_moe_anchor.py
  # the delta rule alone: today's kernel and the tensor-core chunked one on the same batch
  [ -x "$BUILD/bench/bench_gdn" ] && "$BUILD/bench/bench_gdn"; } >"$OUT/bench.log" 2>&1
cat "$OUT/bench.log"
exit $((fail > 0))
