# TIMEOUT=50
# Issue 23's device run: the decoding step at batch 1 and 64 against its weight-read bound (bench_decode: the linear
# layers alone, cuBLASLt against both GEMVs; the step kernel by kernel and as graphs; without and with programmatic
# dependent launch, DFLASH_PDL=1), then the tests of what it runs (the kv_attention rows of the kernel case table,
# test_decode_gpu with the goldens: graph_exact; the gemv rows of the kernel case table).
# Usage (the GPU queue): /work/gpuq/submit.sh decode tests/gpu/decode_perf.sh, after make all.
export DFLASH_GOLDENS=tests/goldens
summary() { # LABEL: the ok/FAIL counts and every line that is not an ok
    local label=$1 out=$2 rc=$3
    echo "=== $label: $(grep -cE '^ok ' <<<"$out") ok, $(grep -cE '^FAIL ' <<<"$out") FAIL, exit $rc"
    grep -vE '^ok |^== ' <<<"$out" | head -30
}
nvidia-smi -L
t0=$SECONDS
timeout 10 build/bench/bench_decode --batch 1 --batch 64 --new 48
echo "bench_decode (the default): exit $?, $((SECONDS - t0)) s"
t0=$SECONDS
DFLASH_PDL=1 timeout 7 build/bench/bench_decode --batch 1 --batch 64 --new 48 --no-linear
echo "bench_decode DFLASH_PDL=1: exit $?, $((SECONDS - t0)) s"
for pdl in 0 1; do # the tests without programmatic dependent launch (the default) and with
    t0=$SECONDS; out=$(DFLASH_PDL=$pdl timeout 3 build/gpu/test_kernel_cases_gpu --no-timings kv_attention 2>&1)
    summary "DFLASH_PDL=$pdl test_kernel_cases_gpu kv_attention" "$out" $?; echo "($((SECONDS - t0)) s)"
    t0=$SECONDS; out=$(DFLASH_PDL=$pdl timeout 5 build/gpu/test_decode_gpu 2>&1)
    summary "DFLASH_PDL=$pdl test_decode_gpu" "$out" $?; echo "($((SECONDS - t0)) s)"
    grep -E 'graph_exact' <<<"$out" | head -12
done
t0=$SECONDS; out=$(timeout 16 build/gpu/test_kernel_cases_gpu --no-timings gemv 2>&1)
summary "test_kernel_cases_gpu gemv" "$out" $?; echo "($((SECONDS - t0)) s)"
