# TIMEOUT=60
# Issue 23's device run: the decoding step at batch 1 and 64 against its weight-read bound (bench_decode: the linear
# layers alone, cuBLASLt against the GEMVs, the CUDA-core one with and without its k split and by split; the step
# kernel by kernel and as graphs), then the same steps with DFLASH_GEMV_SPLIT=1 DFLASH_KV_OLD=1 (the GEMV before the
# k split and the SwiGLU fold, kv_attention before the tensor cores, the chunks a CTA and the one-launch combine),
# with DFLASH_KV_OLD=1 alone, and with DFLASH_PDL=1: the A/B in one command; then the tests of what it runs (the
# gemv, swiglu, kv_attention and attention_opts rows of the kernel case table, not the tensor-core GEMV's m > 8 and
# lm_head rows: their kernels did not change, their CPU references take most of the time; kv_attention's rows again
# with DFLASH_KV_OLD=1; test_decode_gpu with the goldens: graph_exact).
# Usage (the GPU queue): /work/gpuq/submit.sh NAME tests/gpu/decode_perf.sh, after make all.
export DFLASH_GOLDENS=tests/goldens
summary() { # LABEL: the ok/FAIL counts and every line that is not an ok
    local label=$1 out=$2 rc=$3
    echo "=== $label: $(grep -cE '^ok ' <<<"$out") ok, $(grep -cE '^FAIL ' <<<"$out") FAIL, exit $rc"
    grep -vE '^ok |^== ' <<<"$out" | head -30
}
nvidia-smi -L
t0=$SECONDS
timeout 9 build/bench/bench_decode --batch 1 --batch 64 --new 48
echo "bench_decode (the default): exit $?, $((SECONDS - t0)) s"
t0=$SECONDS
DFLASH_GEMV_SPLIT=1 DFLASH_KV_OLD=1 timeout 6 build/bench/bench_decode --batch 1 --batch 64 --new 48 --no-linear
echo "bench_decode DFLASH_GEMV_SPLIT=1 DFLASH_KV_OLD=1 (the kernels before): exit $?, $((SECONDS - t0)) s"
t0=$SECONDS
DFLASH_KV_OLD=1 timeout 6 build/bench/bench_decode --batch 1 --batch 64 --new 48 --no-linear
echo "bench_decode DFLASH_KV_OLD=1 (the new GEMV, kv_attention before): exit $?, $((SECONDS - t0)) s"
t0=$SECONDS
DFLASH_PDL=1 timeout 6 build/bench/bench_decode --batch 1 --batch 64 --new 48 --no-linear
echo "bench_decode DFLASH_PDL=1: exit $?, $((SECONDS - t0)) s"
t0=$SECONDS; out=$(timeout 22 build/gpu/test_kernel_cases_gpu --no-timings gemv_rmsnorm vs_cublas=0 "m=1 n=6144 k=4096" \
    "m=1 n=4096 k=4096" "m=1 n=4096 k=12288" "m=4 n=4096 k=12288" "m=1 n=24576" kv_attention attention_opts \
    swiglu_forward 2>&1)
summary "test_kernel_cases_gpu gemv swiglu_forward kv_attention attention_opts" "$out" $?; echo "($((SECONDS - t0)) s)"
t0=$SECONDS; out=$(DFLASH_KV_OLD=1 timeout 4 build/gpu/test_kernel_cases_gpu --no-timings kv_attention attention_opts 2>&1)
summary "DFLASH_KV_OLD=1 test_kernel_cases_gpu kv_attention attention_opts" "$out" $?; echo "($((SECONDS - t0)) s)"
t0=$SECONDS; out=$(timeout 5 build/gpu/test_decode_gpu 2>&1)
summary "test_decode_gpu" "$out" $?; echo "($((SECONDS - t0)) s)"
grep -E 'graph_exact' <<<"$out" | head -12
