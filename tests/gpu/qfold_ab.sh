# TIMEOUT=150
# The Q side of qk_norm_rope folded into the Hopper attention (engineer qfold, issue 23; DFLASH_ATTENTION_QFOLD=1, or
# =begin for the variant without passes ahead; default off). 1. the attention_qfold rows of the kernel case table
# (each row twice bitwise by the driver): folded vs the CPU reference, vs qk_norm_rope_cuda + attention bitwise,
# cp.async vs TMA staging, k of the k-only call, q raw in memory; with the switch unset (the public path must stay
# unfused; the by-name launches fold ahead), =1 and =begin. 2. bench_target (Qwen3-8B shape) unset, =1 and =begin:
# tok/s and the time split (the fold moves q's pass out of "other" into "attention"). 3. test_target_gpu qwen3 with
# =1 (attn_block_cuda.c's k-only qk_norm_rope + the folded attention against the CPU forward). From the repo root,
# the build at build/.
set -u
for sw in unset 1 begin; do
    echo "== test_kernel_cases_gpu attention_qfold, DFLASH_ATTENTION_QFOLD=$sw"
    if [ $sw = unset ]; then e="env -u DFLASH_ATTENTION_QFOLD"; else e="env DFLASH_ATTENTION_QFOLD=$sw"; fi
    $e timeout 12 build/gpu/test_kernel_cases_gpu attention_qfold > /tmp/qfold_kc_$sw.log 2>&1
    echo "rc=$? ok=$(grep -c '^ok' /tmp/qfold_kc_$sw.log) FAIL=$(grep -c '^FAIL' /tmp/qfold_kc_$sw.log)"
    grep -v "^== " /tmp/qfold_kc_$sw.log | cut -c1-260
done
for sw in unset 1 begin; do
    echo "== bench_target --iters 3, DFLASH_ATTENTION_QFOLD=$sw"
    if [ $sw = unset ]; then e="env -u DFLASH_ATTENTION_QFOLD"; else e="env DFLASH_ATTENTION_QFOLD=$sw"; fi
    $e timeout 25 build/bench/bench_target --iters 3 > /tmp/qfold_bt_$sw.log 2>&1
    echo "rc=$?"
    grep "target step\|forward alone\|time split\|rates\|non-finite\|rror\|FAIL" /tmp/qfold_bt_$sw.log | cut -c1-300
done
echo "== test_target_gpu qwen3, DFLASH_ATTENTION_QFOLD=1"
DFLASH_ATTENTION_QFOLD=1 timeout 35 build/gpu/test_target_gpu qwen3 > /tmp/qfold_tt.log 2>&1
echo "rc=$? ok=$(grep -c '^ok' /tmp/qfold_tt.log) FAIL=$(grep -c '^FAIL' /tmp/qfold_tt.log)"
grep -m 12 "FAIL" /tmp/qfold_tt.log | cut -c1-300
tail -n 3 /tmp/qfold_tt.log | cut -c1-300
exit 0
