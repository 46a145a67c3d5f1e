# TIMEOUT=120
# The causal attention's skip (engineer attnskip, issue 23; kernels/attention_sm90.cu, opt-in DFLASH_ATTENTION_SKIP=1,
# default off): consumer 0 computes S over the diagonal key tile's first 64 keys only and its item's last P·V over
# them (the SKIP instances: a consumer body each, the choice at compile time). 1. the attention_wgmma and
# attention_qfold rows (each row against the CPU reference, the skip's runs skip 1 / 0, TMA and cp.async, bitwise
# against the first run; the driver runs each row twice bitwise) with the switch unset, the attention_qfold rows with
# DFLASH_ATTENTION_QFOLD=begin (the skip has no instance with the fold ahead, =1's), then the attention_wgmma rows
# with DFLASH_ATTENTION_SKIP=1 (the by-name and dispatched runs take the skip too). 2. bench_attention and
# bench_target --iters 3, switch unset and =1, in this one command. From the repo root, the build at build/.
set -u
nvidia-smi -L
rows() { # LABEL ENV-ARGS...: `env ENV-ARGS` (a test_kernel_cases_gpu run), its counts and the lines that matter
    local label=$1 s=$SECONDS rc out
    shift
    out=$(env "$@" 2>&1); rc=$?
    echo "$label: $(grep -c '^ok' <<<"$out") ok, $(grep -c '^FAIL' <<<"$out") FAIL, exit $rc, $((SECONDS - s)) s"
    grep -E '^FAIL|^skip|rows|test_kernel_cases_gpu' <<<"$out" | cut -c1-260
    grep -E '^ok .*skip' <<<"$out" | head -n 4 | cut -c1-200
    if [ $rc = 124 ]; then echo "(timed out; its last lines:)"; tail -n 3 <<<"$out" | cut -c1-260; fi
}
echo "== 1. rows"
rows "attention_wgmma rows, switch unset" -u DFLASH_ATTENTION_SKIP timeout 12 build/gpu/test_kernel_cases_gpu attention_wgmma
rows "attention_qfold rows, switch unset" -u DFLASH_ATTENTION_SKIP timeout 12 build/gpu/test_kernel_cases_gpu attention_qfold
rows "attention_qfold rows, DFLASH_ATTENTION_QFOLD=begin (the fold's SKIP instance)" -u DFLASH_ATTENTION_SKIP \
    DFLASH_ATTENTION_QFOLD=begin timeout 12 build/gpu/test_kernel_cases_gpu attention_qfold
rows "attention_wgmma rows, DFLASH_ATTENTION_SKIP=1" DFLASH_ATTENTION_SKIP=1 timeout 12 build/gpu/test_kernel_cases_gpu attention_wgmma
echo "== 2. bench_attention, then bench_target --iters 3: switch unset, then DFLASH_ATTENTION_SKIP=1"
for sw in unset 1; do
    if [ $sw = unset ]; then e="env -u DFLASH_ATTENTION_SKIP"; else e="env DFLASH_ATTENTION_SKIP=1"; fi
    echo "-- bench_attention, DFLASH_ATTENTION_SKIP=$sw"
    $e timeout 8 build/bench/bench_attention 2>&1 | grep -E "wgmma|sequence|batch|head_dim|rror" | cut -c1-200
done
for sw in unset 1; do
    if [ $sw = unset ]; then e="env -u DFLASH_ATTENTION_SKIP"; else e="env DFLASH_ATTENTION_SKIP=1"; fi
    echo "-- bench_target --iters 3, DFLASH_ATTENTION_SKIP=$sw"
    $e timeout 25 build/bench/bench_target --iters 3 2>&1 | grep -E "target step|forward alone|time split|non-finite|rror|FAIL" |
        cut -c1-300
done
exit 0
