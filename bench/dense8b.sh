#!/usr/bin/env bash
# Issue 23's benchmark command, the Qwen3-8B shape, every figure with its PyTorch anchor in the same GPU command:
#   BUILD=build [ANCHORS=../shared/bench] bench/dense8b.sh
# bench_target, then torch_target_anchor.py --iters 5; bench_drafter, then torch_drafter_anchor.py --iters 5;
# bench_decode at batch 1 and 64; bench_attention; bench/e2e.sh with LAYERS=36 once with two samples a batch
# (SEQS=2 STEPS=75) and once with one (SEQS=1 STEPS=150) on the same fixture (WORK, /tmp/e2e-work by default).
# Each step has a time limit and prints "=== [T s] ..." before and "=== exit RC" after. About 4 minutes on an H200.
# Needs the GPU build (make -j2 all) and, on the device, torch + transformers for the anchors (a missing anchor file
# is reported and skipped, so the dflash figures still come).
case "${1:-}" in -h | --help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build} ANCHORS=${ANCHORS:-../shared/bench}
for b in bench_target bench_drafter bench_decode bench_attention; do
    [ -x "$BUILD/bench/$b" ] || { echo "dense8b.sh: $BUILD/bench/$b is missing: build with make -j2 all first" >&2; exit 2; }
done
t0=$SECONDS
step() { # LIMIT COMMAND...
    local to=$1
    shift
    echo "=== [$((SECONDS - t0)) s] $to s: $*"
    timeout "$to" "$@"
    echo "=== exit $?"
}
anchor() { # FILE
    if [ -f "$ANCHORS/$1" ]; then step 70 python3 "$ANCHORS/$1" --iters 5
    else echo "=== no anchor $ANCHORS/$1 (ANCHORS=<folder of torch_*_anchor.py>): its ratio is not measured"; fi
}
step 30 "$BUILD/bench/bench_target"
anchor torch_target_anchor.py
step 30 "$BUILD/bench/bench_drafter"
anchor torch_drafter_anchor.py
step 25 "$BUILD/bench/bench_decode" --batch 1 --batch 64 --new 48 --no-linear
step 10 "$BUILD/bench/bench_attention"
export LAYERS=36 BUILD WORK=${WORK:-/tmp/e2e-work}
rm -rf "$WORK"
for run in 2:75 1:150; do # SEQS:STEPS
    seqs=${run%%:*} steps=${run#*:}
    echo "=== [$((SECONDS - t0)) s] e2e SEQS=$seqs STEPS=$steps"
    SEQS=$seqs STEPS=$steps OUT=${OUT:-/tmp/dflash-e2e-out} timeout 110 bash bench/e2e.sh 2>&1 |
        grep -vE " INFO | DEBUG " | tail -8
done
echo "=== done at $((SECONDS - t0)) s"
