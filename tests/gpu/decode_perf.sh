# TIMEOUT=70
# Issue 23's device run: the decoding step at batch 1 and 64 against its weight-read bound (bench_decode: the linear
# layers alone, cuBLASLt against the GEMVs, the CUDA-core one with and without its k split; the step kernel by kernel
# and as graphs), then the same steps with DFLASH_GEMV_SPLIT=1 (the GEMV before the k split and the SwiGLU fold) and
# DFLASH_KV_COMBINE=2 (kv_attention's combine as a kernel of its own): the A/B in one command; then the tests of what it runs (the gemv, swiglu and kv_attention rows of the kernel case
# table; test_decode_gpu with the goldens: graph_exact).
# Usage (the GPU queue): /work/gpuq/submit.sh NAME tests/gpu/decode_perf.sh, after make all.
export DFLASH_GOLDENS=tests/goldens
summary() { # LABEL: the ok/FAIL counts and every line that is not an ok
    local label=$1 out=$2 rc=$3
    echo "=== $label: $(grep -cE '^ok ' <<<"$out") ok, $(grep -cE '^FAIL ' <<<"$out") FAIL, exit $rc"
    grep -vE '^ok |^== ' <<<"$out" | head -30
}
nvidia-smi -L
t0=$SECONDS
timeout 14 build/bench/bench_decode --batch 1 --batch 64 --new 48
echo "bench_decode (the default): exit $?, $((SECONDS - t0)) s"
t0=$SECONDS
DFLASH_GEMV_SPLIT=1 DFLASH_KV_COMBINE=2 timeout 9 build/bench/bench_decode --batch 1 --batch 64 --new 48 --no-linear
echo "bench_decode DFLASH_GEMV_SPLIT=1 DFLASH_KV_COMBINE=2 (the kernels before): exit $?, $((SECONDS - t0)) s"
t0=$SECONDS
DFLASH_KV_COMBINE=2 timeout 9 build/bench/bench_decode --batch 1 --batch 64 --new 48 --no-linear
echo "bench_decode DFLASH_KV_COMBINE=2 (the new GEMV, kv_attention's combine as its own kernel): exit $?, $((SECONDS - t0)) s"
t0=$SECONDS; out=$(timeout 16 build/gpu/test_kernel_cases_gpu --no-timings gemv swiglu kv_attention 2>&1)
summary "test_kernel_cases_gpu gemv swiglu kv_attention" "$out" $?; echo "($((SECONDS - t0)) s)"
t0=$SECONDS; out=$(timeout 8 build/gpu/test_decode_gpu 2>&1)
summary "test_decode_gpu" "$out" $?; echo "($((SECONDS - t0)) s)"
grep -E 'graph_exact' <<<"$out" | head -12
