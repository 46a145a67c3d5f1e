# TIMEOUT=150
# dflash attention backward, dq from the dk/dv CTAs' dS tiles (engineer dq): every dflash_attention row of the kernel
# case table (the head_dim 128 ones on the new path, each also checking the recompute path's dq; the timed ones time
# both), the drafter bench with the new path, with DFLASH_ATTENTION_DKV_SPLIT=0 and with DFLASH_ATTENTION_DQ=recompute,
# the drafter goldens.
set -u
echo "== test_kernel_cases_gpu dflash_attention rows"
timeout 60 build/gpu/test_kernel_cases_gpu dflash_attention > /tmp/kc.log 2>&1
echo "rc=$?"
grep -v "^ok .*\(padding\|bitwise\|determinism\|wide_window\)" /tmp/kc.log | grep -v "^ok .* \(out\|lse\|dkc\|dvc\|dkb\|dvb\) max_abs" | cut -c1-300
echo "== the timed 8B row with DFLASH_ATTENTION_DKV_SPLIT=0"
DFLASH_ATTENTION_DKV_SPLIT=0 timeout 15 build/gpu/test_kernel_cases_gpu "hd=128 B=16 window=0 pad=0 wide_check=0 timing=1" 2>&1 | grep "^timing\|FAIL\|rows"
echo "== bench_drafter (dS workspace, context dk/dv tiles split in 2)"
timeout 15 build/bench/bench_drafter --iters 5 2>&1 | grep "forward_backward\|time split"
echo "== bench_drafter DFLASH_ATTENTION_DKV_SPLIT=0"
DFLASH_ATTENTION_DKV_SPLIT=0 timeout 15 build/bench/bench_drafter --iters 5 2>&1 | grep "forward_backward\|time split"
echo "== bench_drafter DFLASH_ATTENTION_DQ=recompute"
DFLASH_ATTENTION_DQ=recompute timeout 15 build/bench/bench_drafter --iters 5 2>&1 | grep "forward_backward\|time split"
echo "== test_drafter_gpu tests/goldens"
timeout 25 build/gpu/test_drafter_gpu tests/goldens > /tmp/td.log 2>&1
echo "rc=$? ok=$(grep -c '^ok' /tmp/td.log) fail=$(grep -c '^FAIL' /tmp/td.log)"
grep -m 10 "FAIL" /tmp/td.log; tail -n 3 /tmp/td.log | cut -c1-300
exit 0
