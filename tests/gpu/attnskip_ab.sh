# TIMEOUT=120
# The causal attention's skip (engineer attnskip, issue 23; kernels/attention_sm90.cu, opt-in DFLASH_ATTENTION_SKIP,
# default off): =1, consumer 0 computes S over the diagonal key tile's first 64 keys only and its item's last P·V over
# them; =2, also a non-paired item whose rows 64..127 all lie past the sequence's end (a last block of <= 64 rows:
# odd groups, or DFLASH_ATTENTION_PAIRS=0) is consumer 0's alone (consumer 1 passes it over; consumer 0 arrives for
# both and takes no turns there). Same bits as without. In order of risk (time limits in brackets, <= 119 s):
#   1. [3 x 15 s] the attention_wgmma rows (each against the CPU reference, then skip 1 and 2, TMA and cp.async, and
#      skip 0 bitwise against the first run; the driver runs each row twice bitwise) with the switch unset; the
#      attention_qfold rows with DFLASH_ATTENTION_QFOLD=begin (the skip has no instance with the fold ahead); the
#      attention_wgmma rows with DFLASH_ATTENTION_SKIP=2 (the by-name and dispatched runs take it too). A hang in
#      skip 2 (its barrier counts, its turns) shows as a timeout here.
#   2. [5 x 6 s] bench_attention: unset, =1, =2, then DFLASH_ATTENTION_PAIRS=0 unset and =2 (where solo items exist).
#   3. [2 x 22 s] bench_target --iters 3: unset, =1.
# Level 2 is not instantiated since 2d00dd9 (its consumer 1's parity waits after a passed item; launch_sm90 says why):
# every skip-2 run below runs level 1 (a second level-1 check; =2 timings are level 1's).
# From the repo root, the build at build/.
set -u
nvidia-smi -L
rows() { # LABEL ENV-ARGS...: `env ENV-ARGS` (a test_kernel_cases_gpu run), its counts and the lines that matter
    local label=$1 s=$SECONDS rc out
    shift
    out=$(env "$@" 2>&1); rc=$?
    echo "$label: $(grep -c '^ok' <<<"$out") ok, $(grep -c '^FAIL' <<<"$out") FAIL, exit $rc, $((SECONDS - s)) s"
    grep -E '^FAIL|^skip|rows|test_kernel_cases_gpu' <<<"$out" | cut -c1-260
    grep -E '^ok .*skip' <<<"$out" | head -n 3 | cut -c1-200
    if [ $rc = 124 ]; then echo "(timed out; its last lines:)"; tail -n 3 <<<"$out" | cut -c1-260; fi
}
echo "== 1. rows"
rows "attention_wgmma rows, switch unset" -u DFLASH_ATTENTION_SKIP timeout 15 build/gpu/test_kernel_cases_gpu \
    attention_wgmma
rows "attention_qfold rows, DFLASH_ATTENTION_QFOLD=begin" -u DFLASH_ATTENTION_SKIP DFLASH_ATTENTION_QFOLD=begin \
    timeout 15 build/gpu/test_kernel_cases_gpu attention_qfold
rows "attention_wgmma rows, DFLASH_ATTENTION_SKIP=2" DFLASH_ATTENTION_SKIP=2 timeout 15 build/gpu/test_kernel_cases_gpu \
    attention_wgmma
echo "== 2. bench_attention (TFLOP/s causal useful)"
for sw in unset 1 2 pairs0 pairs0_2; do
    case $sw in
    unset) e="env -u DFLASH_ATTENTION_SKIP" ;;
    pairs0) e="env -u DFLASH_ATTENTION_SKIP DFLASH_ATTENTION_PAIRS=0" ;;
    pairs0_2) e="env DFLASH_ATTENTION_SKIP=2 DFLASH_ATTENTION_PAIRS=0" ;;
    *) e="env DFLASH_ATTENTION_SKIP=$sw" ;;
    esac
    echo "-- bench_attention, $e"
    $e timeout 6 build/bench/bench_attention 2>&1 | grep -E "wgmma|sequence|batch|head_dim|rror" | cut -c1-200
done
echo "== 3. bench_target --iters 3"
for sw in unset 1; do
    if [ $sw = unset ]; then e="env -u DFLASH_ATTENTION_SKIP"; else e="env DFLASH_ATTENTION_SKIP=1"; fi
    echo "-- bench_target --iters 3, $e"
    $e timeout 22 build/bench/bench_target --iters 3 2>&1 |
        grep -E "target step|forward alone|time split|non-finite|rror|FAIL" | cut -c1-300
done
exit 0
