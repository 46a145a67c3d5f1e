#!/usr/bin/env bash
# ncu profiles of the kernels that stand between issue 23's figures and their aims, on the GPU machine:
#   BUILD=<folder with gpu/ bench/> OUT=<folder> tests/gpu/profile_kernels.sh [drafter | target | all] [ENV=VALUE...]
# drafter: the DFlash attention kernels of one bench_drafter step (dk/dv, forward, dq; the warm-up's launches
# skipped); target: the fused gate|up GEMM at the 8B shape (test_kernel_cases_gpu --timings-only) and the causal
# attention of bench_attention. Each kernel: ncu's full set (clocks left alone) into REP/<name>.ncu-rep (REP default
# /tmp/dflash-profile-rep), its details page appended to OUT/details.txt, its SASS with the per-instruction stall
# samples into OUT/<name>.sass.csv (one file a kernel: the device call brings back a few files only), and the lines
# that say where the time goes (throughputs, issue activity, the top stall reasons) printed. ENV=VALUE arguments are
# set for the profiled programs (a variant's switch, e.g. DFLASH_ATTENTION_DKV=wg2_turns or DFLASH_ATTENTION_DQ_WS=pair).
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/dflash-profile}
REP=${REP:-/tmp/dflash-profile-rep}
what=${1:-all}
case $what in drafter | target | all) shift || true ;; *=*) what=all ;; *)
    echo "usage: $0 [drafter | target | all] [ENV=VALUE...]" >&2; exit 2 ;; esac
for e in "$@"; do
    case $e in *=*) export "${e?}" ;; *) echo "profile_kernels: $e is not ENV=VALUE" >&2; exit 2 ;; esac
done
command -v ncu >/dev/null || { echo "profile_kernels: no ncu on PATH" >&2; exit 77; }
mkdir -p "$OUT" "$REP"
t0=$SECONDS
one() { # NAME KERNEL_REGEX SKIP COMMAND...
    local name=$1 re=$2 skip=$3
    shift 3
    echo "=== [$((SECONDS - t0)) s] $name: -k regex:$re --launch-skip $skip, $*"
    timeout 150 ncu --clock-control none --kernel-name-base demangled --set full --import-source no \
        -k "regex:$re" --launch-skip "$skip" -c 1 -f -o "$REP/$name" "$@" >"$REP/$name.log" 2>&1
    local rc=$?
    if [ ! -f "$REP/$name.ncu-rep" ]; then
        echo "no report (exit $rc):"; tail -n 5 "$REP/$name.log"; return
    fi
    ncu -i "$REP/$name.ncu-rep" --page details >"$REP/$name.details.txt" 2>&1
    { echo "######## $name ($*)"; cat "$REP/$name.details.txt"; } >>"$OUT/details.txt"
    ncu -i "$REP/$name.ncu-rep" --page source --csv --print-source sass >"$OUT/$name.sass.csv" 2>&1
    grep -E "^  [a-zA-Z_].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Executed Ipc Active|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Registers Per|Achieved Occupancy" \
        "$REP/$name.details.txt" | head -16
    # the stall reasons summed over the SASS lines (columns named "Warp Stall Sampling (All Samples)" and the like)
    python3 - "$OUT/$name.sass.csv" <<'EOP'
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
hdr = next((i for i, r in enumerate(rows) if "Source" in r), None)
if hdr is None: sys.exit(print("  (no SASS table in the report)"))
h = rows[hdr]
cols = [i for i, c in enumerate(h) if c.startswith("stall_") or "Stall" in c]
tot = {}
for r in rows[hdr + 1:]:
    for i in cols:
        try: tot[h[i]] = tot.get(h[i], 0) + float(r[i] or 0)
        except (ValueError, IndexError): pass
top = sorted(tot.items(), key=lambda kv: -kv[1])[:8]
print("  stalls: " + ", ".join("%s %.0f" % kv for kv in top))
EOP
}
if [ "$what" != target ]; then
    # bench_drafter's warm-up step runs each kernel once a layer (5), then the timed step
    for k in "dkv_wg2_(tma_)?sm90_kernel:dkv" "fwd_(tma_|ws_)?sm90_kernel:fwd" "dq_ws_(pair_|tma_)?sm90_kernel:dq"; do
        one "drafter_${k#*:}" "${k%%:*}" 5 "$BUILD/bench/bench_drafter" --iters 1
    done
fi
if [ "$what" != drafter ]; then
    one target_gateup 'matmul_swiglu_kernel' 2 "$BUILD/gpu/test_kernel_cases_gpu" --timings-only --timing matmul_swiglu
    one target_attention 'flash_fwd_sm90' 2 "$BUILD/bench/bench_attention"
fi
echo "=== done in $((SECONDS - t0)) s; reports in $REP, details and SASS in $OUT"
