# TIMEOUT=150
# The Q side of qk_norm_rope folded into the Hopper attention (engineer qfold, issue 23; DFLASH_ATTENTION_QFOLD=1,
# default off). 1. the attention_qfold rows of the kernel case table (each row twice bitwise by the driver): folded
# vs the CPU reference, vs qk_norm_rope_cuda + attention bitwise, cp.async vs TMA staging, k of the k-only call, q
# raw in memory; once with the switch off (the public path must stay unfused) and once on (folded). 2. bench_target
# (Qwen3-8B shape) without and with the switch: tok/s and the time split (the fold moves q's pass out of "other").
# 3. test_target_gpu qwen3 with the switch on (attn_block_cuda.c's k-only qk_norm_rope + the folded attention
# against the CPU forward). Run from the repo root with the build at build/.
set -u
for sw in 0 1; do
    echo "== test_kernel_cases_gpu attention_qfold, DFLASH_ATTENTION_QFOLD=$sw"
    DFLASH_ATTENTION_QFOLD=$sw timeout 40 build/gpu/test_kernel_cases_gpu attention_qfold > /tmp/qfold_kc$sw.log 2>&1
    echo "rc=$? ok=$(grep -c '^ok' /tmp/qfold_kc$sw.log) FAIL=$(grep -c '^FAIL' /tmp/qfold_kc$sw.log)"
    grep -v "^== " /tmp/qfold_kc$sw.log | cut -c1-260
done
for sw in 0 1; do
    echo "== bench_target --iters 5, DFLASH_ATTENTION_QFOLD=$sw"
    DFLASH_ATTENTION_QFOLD=$sw timeout 25 build/bench/bench_target --iters 5 > /tmp/qfold_bt$sw.log 2>&1
    echo "rc=$?"
    grep "target step\|forward alone\|time split\|rates\|non-finite\|error\|FAIL" /tmp/qfold_bt$sw.log | cut -c1-300
done
echo "== test_target_gpu qwen3, DFLASH_ATTENTION_QFOLD=1"
DFLASH_ATTENTION_QFOLD=1 timeout 40 build/gpu/test_target_gpu qwen3 > /tmp/qfold_tt.log 2>&1
echo "rc=$? ok=$(grep -c '^ok' /tmp/qfold_tt.log) FAIL=$(grep -c '^FAIL' /tmp/qfold_tt.log)"
grep -m 12 "FAIL" /tmp/qfold_tt.log | cut -c1-300
tail -n 3 /tmp/qfold_tt.log | cut -c1-300
exit 0
