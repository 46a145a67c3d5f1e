# TIMEOUT=150
# gpt_oss on the H200 (one run): its kernel options against the CPU references, the CUDA forward on its goldens,
# decoding against the CPU forward, bench_target on the gpt-oss-20b shape and transformers on the same batch.
set -u
export DFLASH_GOLDENS=tests/goldens PYTHONUNBUFFERED=1
s=$SECONDS
run() { # LIMIT COMMAND...
    local lim=$1; shift
    echo "=== $* (t=$((SECONDS - s)) s)"; timeout "$lim" "$@" >/tmp/gptoss_out 2>&1; local rc=$?
    tail -45 /tmp/gptoss_out; echo "=== exit $rc: $(grep -c '^ok ' /tmp/gptoss_out) ok, $(grep -c '^FAIL' /tmp/gptoss_out) FAIL"
}
run 12 build/gpu/test_kernel_cases_gpu attention_opts moe_gemm_opts bias_add
run 15 build/gpu/test_target_gpu gpt_oss
run 25 build/bench/bench_target --family gpt_oss --iters 3
run 50 python3 bench/torch_gptoss_anchor.py --iters 1 --layers 24
run 8 build/gpu/test_hybrid_kernels_gpu
run 15 build/gpu/test_decode_gpu
echo "=== done t=$((SECONDS - s)) s"
