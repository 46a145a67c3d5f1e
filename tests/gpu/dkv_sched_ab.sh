# TIMEOUT=540
# The schedules of the wg2 dk/dv CTAs (issue 23; kDkvVariants in kernels/dflash_attention.cu: DFLASH_ATTENTION_DKV=
# wg2 | wg2_tracked | wg2_tracked4 | wg2_pipe | wg2_tracked4_pipe | wg2_turns | wg2_tracked4_turns).
# 1. every dflash_attention row of the kernel case table: each head_dim-128 row runs every dk/dv variant bitwise
#    against its first run (a hang here is a ring or a turn that never completes: the timeout says so); the timed 8B
#    row times each.
# 2. bench_drafter --iters 5 with each variant, two rounds in turn (the drafter step and its time split).
# 3. the drafter goldens with the tracked, pipelined and turn-taking schedules.
# From the repo root, the build at build/.
set -u
echo "== test_kernel_cases_gpu dflash_attention rows"
timeout 120 build/gpu/test_kernel_cases_gpu dflash_attention > /tmp/sched_kc.log 2>&1
echo "rc=$? ok=$(grep -c '^ok' /tmp/sched_kc.log) FAIL=$(grep -c '^FAIL' /tmp/sched_kc.log)"
grep "^FAIL\|^timing\|dkv wg2" /tmp/sched_kc.log | grep -v "^ok .*rows_differing=0$" | cut -c1-300 | head -60
for round in 1 2; do
    for v in wg2 wg2_tracked wg2_tracked4 wg2_pipe wg2_tracked4_pipe wg2_turns wg2_tracked4_turns; do
        echo "== bench_drafter --iters 5, DFLASH_ATTENTION_DKV=$v (round $round)"
        DFLASH_ATTENTION_DKV=$v timeout 25 build/bench/bench_drafter --iters 5 2>&1 | grep "forward_backward\|time split\|rror"
    done
done
for v in wg2_tracked wg2_tracked4_pipe wg2_tracked4_turns; do
    echo "== test_drafter_gpu tests/goldens, DFLASH_ATTENTION_DKV=$v"
    DFLASH_ATTENTION_DKV=$v timeout 40 build/gpu/test_drafter_gpu tests/goldens > /tmp/sched_td.log 2>&1
    echo "rc=$? ok=$(grep -c '^ok' /tmp/sched_td.log) fail=$(grep -c '^FAIL' /tmp/sched_td.log)"
    grep -m 10 "FAIL" /tmp/sched_td.log | cut -c1-300
done
exit 0
