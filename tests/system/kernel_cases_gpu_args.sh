#!/usr/bin/env bash
# The GPU driver of the kernel case table (build/gpu/test_kernel_cases_gpu, built wherever nvcc is) reads its
# arguments without a GPU: --list names the rows (or with --timings-only the timings) and touches no device,
# --timings-only refuses row substrings, a --timing NAME that no timing has fails, an unknown option is refused, and a
# row that hangs is killed after --row-timeout and fails alone (DFLASH_KC_FAULT_HANG, the child's fault hook).
cd "$(dirname "$0")/../.." || exit 1
G=${BUILD:-build}/gpu/test_kernel_cases_gpu
[ -x "$G" ] || { echo "$G is not built here (no nvcc): nothing to check"; exit 77; }
FAILED=0
ok() { echo "ok $1"; }
fail() { echo "FAIL $1${2:+: $2}"; FAILED=1; }
expect() { # label, want status, want text (grep -E) in the output, command...
    local label=$1 want=$2 text=$3
    shift 3
    local out rc
    out=$("$@" 2>&1); rc=$?
    if [ "$rc" = "$want" ] && grep -Eq -- "$text" <<<"$out"; then ok "$label"
    else fail "$label" "status $rc (want $want), output: $(tail -n 3 <<<"$out" | tr '\n' '|')"; fi
}
rows=$("$G" --list | sed -n 's/^test_kernel_cases_gpu: \([0-9]*\) rows$/\1/p')
listed=$("$G" --list | grep -vc '^test_kernel_cases_gpu: ')
if [ -n "$rows" ] && [ "$rows" -gt 100 ] && [ "$rows" = "$listed" ]; then ok "--list: $rows rows named, as counted"
else fail "--list" "counted '$rows', named $listed"; fi
expect "--list SUBSTRING: only the rows that contain it" 0 "^test_kernel_cases_gpu: [1-9][0-9]* rows$" \
    "$G" --list dflash_attention
n=$("$G" --list dflash_attention | grep -v '^test_kernel_cases_gpu: ' | grep -vc dflash_attention)
[ "$n" = 0 ] && ok "--list dflash_attention names no other row" || fail "--list dflash_attention" "$n other rows"
expect "--timings-only --list: the timings" 0 "^test_kernel_cases_gpu: [1-9][0-9]* timings$" "$G" --timings-only --list
expect "--timings-only --timing matmul_swiglu --list: that timing" 0 "^matmul_swiglu$" \
    "$G" --timings-only --timing matmul_swiglu --list
expect "--timings-only --timing NAME that no timing has: fails" 1 "no timing's name contains \"nomatch\"" \
    "$G" --timings-only --timing nomatch
expect "--timings-only with a row SUBSTRING: refused" 2 "takes no row SUBSTRING" "$G" --timings-only dflash_attention
expect "an unknown option: refused" 2 "unknown option --bogus" "$G" --bogus
expect "a SUBSTRING no row has: fails" 1 "no row matches" "$G" --list no-such-row-anywhere
expect "--help names --timings-only" 0 "--timings-only" "$G" --help
expect "--row-timeout 0: refused" 2 "--row-timeout wants seconds" "$G" --row-timeout 0 gemv_forward
expect "--row-timeout with no number: refused" 2 "--row-timeout wants seconds" "$G" --row-timeout 2s gemv_forward
# the watchdog, without a GPU: the fault hook hangs the child at the first row (before it needs a device); the parent
# must kill it after --row-timeout, fail that row alone and go on with the next in a fresh process (which, here, has
# no device: it stops there). The outer timeout only guards against a parent that never kills.
first="gemv_forward bf16 m=1 n=1 k=8"
expect "a row that hangs: killed after --row-timeout, that row failed" 1 \
    "^FAIL $first.*hung: no end after 2 s, killed" env DFLASH_KC_FAULT_HANG="$first" timeout 60 "$G" --row-timeout 2 "$first"
out=$(DFLASH_KC_FAULT_HANG="$first" timeout 60 "$G" --row-timeout 2 "gemv_forward bf16 m=1 " "gemv_forward bf16 m=2 " 2>&1)
if grep -q "^fault hook DFLASH_KC_FAULT_HANG=$first: the row" <<<"$out" && grep -q "^FAIL $first.*hung" <<<"$out" &&
    grep -q "died before its first row\|^ok gemv_forward bf16 m=2 " <<<"$out"; then
    ok "after a hung row the next one runs in a fresh process (the hooked child's lines kept)"
else fail "after a hung row" "$(tail -n 4 <<<"$out" | tr '\n' '|')"; fi
exit $FAILED
