# TIMEOUT=580 (each of rows and bench; all: two calls' worth)
# The DFlash attention's rows not yet timed (issue 23): the forward staged by TMA or in FlashAttention-3's shape
# (DFLASH_ATTENTION_FWD=tma | ws | ws_turns), the
# schedules of the wg2 dk/dv CTAs (kDkvVariants in
# kernels/dflash_attention.cu: DFLASH_ATTENTION_DKV=wg2 | wg2_tracked | wg2_tracked4 | wg2_pipe | wg2_tracked4_pipe |
# wg2_turns | wg2_tracked4_turns | wg2_bulk | wg2_tracked4_bulk | wg2_tma | wg2_tma4 | wg2_tma4_bulk | wg2_tma4_turns)
# and the dq CTAs' (DFLASH_ATTENTION_DQ_WS=pair | tma).
# rows (1) and bench (2) fit one device call each; all (the default) runs both.
# 1. every dflash_attention row of the kernel case table: each head_dim-128 row runs every forward, dk/dv and dq row
#    bitwise against its first run (a hang is a ring or a turn that never completes: the row fails after 100 s, its
#    lines so far kept, and the rows after it go on);
#    the timed 8B row times each.
# 2. bench_drafter --iters 5 with each, two rounds in turn (the drafter step and its time split).
# (The drafter goldens' heads are not 128 wide: none of these kernels runs on them.)
#   BUILD=<folder with gpu/ bench/> OUT=<folder for the whole log> tests/gpu/dflash_bwd_ab.sh [rows | bench | all]
# (from the repo root)
set -u
BUILD=${BUILD:-build}
what=${1:-all}
case $what in rows | bench | all) ;; *) echo "usage: $0 [rows | bench | all]" >&2; exit 2 ;; esac
[ -n "${OUT:-}" ] && mkdir -p "$OUT" && exec > >(tee "$OUT/dflash_bwd_ab_$what.log") 2>&1
if [ "$what" != bench ]; then
echo "== test_kernel_cases_gpu dflash_attention rows"
timeout 300 $BUILD/gpu/test_kernel_cases_gpu --row-timeout 100 dflash_attention > /tmp/sched_kc.log 2>&1
echo "rc=$? ok=$(grep -c '^ok' /tmp/sched_kc.log) FAIL=$(grep -c '^FAIL' /tmp/sched_kc.log)"
echo "variant checks: ok $(grep -c '^ok .*\(dk/dv CTAs\|dq CTAs\|(forward \(tma\|ws\|ws_turns\))\)' /tmp/sched_kc.log)," \
    "FAIL $(grep -c '^FAIL .*\(dk/dv CTAs\|dq CTAs\|(forward \(tma\|ws\|ws_turns\))\)' /tmp/sched_kc.log)"
grep -m 40 "^FAIL" /tmp/sched_kc.log | cut -c1-300
grep "^timing" /tmp/sched_kc.log | cut -c1-300
fi
if [ "$what" != rows ]; then
for round in 1 2; do # (~12 s a bench_drafter, 2 x 18 of them)
    for v in DKV=wg2 DKV=wg2_tracked DKV=wg2_tracked4 DKV=wg2_pipe DKV=wg2_tracked4_pipe DKV=wg2_turns \
        DKV=wg2_tracked4_turns DKV=wg2_bulk DKV=wg2_tracked4_bulk DKV=wg2_tma DKV=wg2_tma4 DKV=wg2_tma4_bulk \
        DKV=wg2_tma4_turns DQ_WS=pair DQ_WS=tma FWD=tma FWD=ws FWD=ws_turns; do
        echo "== bench_drafter --iters 5, DFLASH_ATTENTION_$v (round $round)"
        env "DFLASH_ATTENTION_$v" timeout 25 $BUILD/bench/bench_drafter --iters 5 2>&1 | grep "forward_backward\|time split\|rror"
    done
done
fi
exit 0
