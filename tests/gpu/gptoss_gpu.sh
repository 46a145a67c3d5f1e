# TIMEOUT=150
# gpt_oss on the H200: its kernel options against the CPU references, the CUDA forward on its goldens, decoding
# against the CPU forward, and bench_target on the gpt-oss-20b shape.
set -u
export DFLASH_GOLDENS=tests/goldens
nvidia-smi -L
for t in "build/gpu/test_gptoss_kernels_gpu" "build/gpu/test_target_gpu gpt_oss" "build/gpu/test_decode_gpu" \
         "build/gpu/test_target_gpu qwen3_moe"; do
    echo "=== $t"; timeout 150 $t >/tmp/gptoss_out 2>&1; rc=$?; tail -60 /tmp/gptoss_out; echo "=== exit $rc"
done
echo "=== bench_target --family gpt_oss"
timeout 150 build/bench/bench_target --family gpt_oss --iters 5 2>&1 | tail -20
