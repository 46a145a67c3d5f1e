# TIMEOUT=120
# dflash attention backward, the dS workspace laid out for the batch's longest context (dflash_attn_shape.max_ctx)
# instead of T (branch wsbound): every dflash_attention row of the kernel case table (each head_dim-128 row now also
# runs the backward with the tight layout, the rest of the workspace poisoned, and wants the first run's bits), the
# drafter's GPU tests (its steps set max_ctx from the batch).
set -u
echo "== test_kernel_cases_gpu dflash_attention rows"
timeout 60 build/gpu/test_kernel_cases_gpu dflash_attention > /tmp/kc.log 2>&1
echo "rc=$? ok=$(grep -c '^ok' /tmp/kc.log) fail=$(grep -c '^FAIL' /tmp/kc.log)"
grep "max_ctx\|^FAIL" /tmp/kc.log | cut -c1-300
echo "== test_drafter_gpu tests/goldens"
timeout 25 build/gpu/test_drafter_gpu tests/goldens > /tmp/td.log 2>&1
echo "rc=$? ok=$(grep -c '^ok' /tmp/td.log) fail=$(grep -c '^FAIL' /tmp/td.log)"
grep -m 10 "FAIL" /tmp/td.log
exit 0
