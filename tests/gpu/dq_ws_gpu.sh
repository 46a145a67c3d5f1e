# TIMEOUT=150
# dflash attention backward, dq from the dk/dv CTAs' dS tiles (engineer dq): the head_dim 128 rows of the kernel case
# table (new path; each also checks the recompute path's dq and times both where timed), the drafter bench with the
# new path and with DFLASH_ATTENTION_DQ=recompute, the drafter goldens.
set -u
echo "== test_kernel_cases_gpu hd=128 rows"
timeout 70 build/gpu/test_kernel_cases_gpu "hd=128 B=" > /tmp/kc.log 2>&1
echo "rc=$?"
grep -v "^ok .*\(padding\|bitwise\|determinism\)" /tmp/kc.log | cut -c1-400
echo "== bench_drafter (dS workspace)"
timeout 30 build/bench/bench_drafter --iters 5 2>&1 | tail -n 12
echo "== bench_drafter DFLASH_ATTENTION_DQ=recompute"
DFLASH_ATTENTION_DQ=recompute timeout 30 build/bench/bench_drafter --iters 5 2>&1 | tail -n 12
echo "== test_drafter_gpu tests/goldens"
timeout 15 build/gpu/test_drafter_gpu tests/goldens > /tmp/td.log 2>&1
echo "rc=$? ok=$(grep -c '^ok' /tmp/td.log)"
grep -m 10 "FAIL" /tmp/td.log
exit 0
