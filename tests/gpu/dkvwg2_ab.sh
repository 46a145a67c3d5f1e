# TIMEOUT=120
# DFlash attention backward, the dk/dv CTAs of a producer and two consumer warpgroups (engineer dkvwg2, issue 23;
# kernels/dflash_attention.cu dkv_wg2_sm90, opt-in DFLASH_ATTENTION_DKV=wg2, default off, never run before this):
# 128 key rows a CTA, each consumer today's 64-key tile with today's steps in today's order: the same bits as the
# default dk/dv CTAs. In order of risk (time limits in brackets, 115 s in all):
#   1. [50 s] every dflash_attention row with the switch unset: each head_dim-128 row (the dS workspace on sm_90) also
#      runs the wg2 CTAs (dflash_attention_dkv_wg2) and compares dq, dkc, dvc, dkb, dvb bitwise with the first run
#      ("dkv wg2" lines); the timed Qwen3-8B rows print the backward both ways ("timing ... backward" and "timing ...
#      backward with the wg2 dk/dv CTAs"). A hang (the mbarrier ring, setmaxnreg) shows as a timeout here.
#   2. [22 s] the head_dim-128 rows (odd T: a consumer past the rows' end; B = 5, 12: blocks across 64-key tiles;
#      unsorted overlapping contexts; windows) with DFLASH_ATTENTION_DKV=wg2 (every backward wg2: against the CPU, twice
#      bitwise; the timed Qwen3-8B rows' "backward" line is then wg2 too: the timing again, for the noise).
#   3. [15 s] the head_dim-128 rows with DFLASH_ATTENTION_DKV_SPLIT=0 (context tiles unsplit, both ways bitwise).
#   4. [2 x 14 s] bench_drafter --iters 5, unset and DFLASH_ATTENTION_DKV=wg2.
# From the repo root, the build at build/.
set -u
nvidia-smi -L
rows() { # LABEL SECONDS ENV-ARGS... -- ROW-SUBSTRINGS...: a test_kernel_cases_gpu run, its counts and the lines that matter
    local label=$1 t=$2 s=$SECONDS rc out envs=()
    shift 2
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    out=$(env "${envs[@]}" timeout "$t" build/gpu/test_kernel_cases_gpu "$@" 2>&1); rc=$?
    echo "$label: $(grep -c '^ok' <<<"$out") ok, $(grep -c '^FAIL' <<<"$out") FAIL, exit $rc, $((SECONDS - s)) s"
    grep -E '^FAIL|^skip|^timing|test_kernel_cases_gpu' <<<"$out" | cut -c1-260
    echo "  dkv wg2 lines: $(grep -c '^ok .*dkv wg2' <<<"$out") ok, $(grep -c '^FAIL .*wg2' <<<"$out") FAIL"
    grep -E '^ok .*dkv wg2' <<<"$out" | head -n 2 | cut -c1-220
    if [ $rc = 124 ]; then echo "(timed out; its last lines:)"; tail -n 3 <<<"$out" | cut -c1-260; fi
}
echo "== 1. dflash_attention rows, switch unset (wg2 bitwise against the first run in every head_dim-128 row)"
rows "dflash_attention rows, unset" 50 -u DFLASH_ATTENTION_DKV -- dflash_attention
echo "== 2. head_dim-128 rows, DFLASH_ATTENTION_DKV=wg2"
rows "hd=128 rows, wg2" 22 DFLASH_ATTENTION_DKV=wg2 -- "hd=128 B="
echo "== 3. head_dim-128 rows, DFLASH_ATTENTION_DKV_SPLIT=0 (unsplit context tiles both ways)"
rows "hd=128 rows, split 0" 15 -u DFLASH_ATTENTION_DKV DFLASH_ATTENTION_DKV_SPLIT=0 -- "hd=128 B="
echo "== 4. bench_drafter --iters 5"
for sw in unset wg2; do
    if [ $sw = unset ]; then e="env -u DFLASH_ATTENTION_DKV"; else e="env DFLASH_ATTENTION_DKV=wg2"; fi
    echo "-- bench_drafter --iters 5, $e"
    $e timeout 14 build/bench/bench_drafter --iters 5 2>&1 | grep -E "forward_backward|time split|rror|FAIL|non-finite" |
        cut -c1-300
done
exit 0
