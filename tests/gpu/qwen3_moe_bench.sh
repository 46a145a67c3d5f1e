# TIMEOUT=150
# Issue 21's measured parts for qwen3_moe and the drafter's sliding windows on one H200, from the worktree root with
# the build at build/, in two device commands of <= 150 s each (or both in one):
#   bash tests/gpu/qwen3_moe_bench.sh bench     (~80 s)   then   bash tests/gpu/qwen3_moe_bench.sh e2e   (~140 s)
#   bash tests/gpu/qwen3_moe_bench.sh all       (both, ~220 s)
# bench:
#   1. bench_target --family qwen3_moe: the Qwen3-30B-A3B shape (bench/qwen3_30b_a3b.h, all 48 layers), random bf16,
#      on the benchmark batch (16 sequences, 19218 tokens);
#   2. its anchor, after it (each process holds its own 61 GB of weights, never both at once): transformers'
#      Qwen3MoeForCausalLM of the same shape on the same batch (bench/torch_moe_anchor.py --layers 48), the same
#      process then timing its first E2E_LAYERS layers on one SEQ-token sample (--then): the e2e's forward anchor,
#      kept in ANCHOR_LOG (default ./qwen3_moe_anchor.log) for the e2e part;
#   3. with what is left of 145 s: the e2e's drafter anchor (torch_drafter_anchor.py at the drafter a job derives from
#      this target, on SEQ tokens: TORCH=, else ./torch_drafter_anchor.py or ../shared/bench/), added to ANCHOR_LOG.
# e2e:
#   1. the drafter anchor as in bench 3, when ANCHOR_LOG has no figure of it;
#   2. the fixture (bench/e2e_fixture.py --family qwen3_moe, E2E_LAYERS = 8 of the 48 layers by default: an 11 GB
#      checkpoint to write and load within the command, the full depth's 61 GB would not fit it) and, beside it (no
#      timed work runs meanwhile), tests/gpu/zlab_swa_gpu.sh: a sliding-window drafter trained by dflash decoded by
#      z-lab's model.py (ZLAB=, default ./zlab-dflash/dflash/model.py) with dflash eval's tau;
#   3. FAMILY=qwen3_moe bench/e2e_gpu.sh on that fixture, the anchors' lines taken from ANCHOR_LOG (a forward figure
#      missing there is timed by it), until 145 s.
# The GPU machine keeps no file between two commands: for a separate e2e command, put the bench part's anchor lines
# (its output's "torch qwen3_moe ..." and "torch drafter ..." / "drafter: ..." lines) in ./qwen3_moe_anchor.log first.
# Each step runs under its own timeout; a failing step does not stop the next. Everything goes to stdout.
cd "$(dirname "$0")/../.." || exit 1
exec 2>&1
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 BUILD=${BUILD:-build} DFLASH_GOLDENS=${DFLASH_GOLDENS:-tests/goldens}
PART=${1:-all} E2E_LAYERS=${E2E_LAYERS:-8} SEQ=${SEQ:-2936} ANCHOR_LOG=${ANCHOR_LOG:-$PWD/qwen3_moe_anchor.log}
t0=$SECONDS
say() { echo "=== qwen3_moe_bench $PART [$((SECONDS - t0)) s] $*"; }
say "$(timeout 20 nvidia-smi -L 2>/dev/null | head -1)"
rc=0

drafter_anchor() { # LIMIT: the drafter anchor at the derived drafter's shape, added to ANCHOR_LOG
    local left=$1 da= f
    for f in "${TORCH:-}" torch_drafter_anchor.py ../shared/bench/torch_drafter_anchor.py; do
        [ -n "$f" ] && [ -f "$f" ] && { da=$f; break; }
    done
    if [ -z "$da" ] || [ "$left" -lt 20 ]; then
        say "drafter anchor: not run (${da:-no torch_drafter_anchor.py}, $left s left)"; return
    fi
    say "drafter anchor: $da at the Qwen3-30B-A3B-derived drafter, --seq $SEQ --iters 3 (limit $left s)"
    timeout -k 3 "$left" python3 bench/torch_drafter_anchor_shape.py "$da" --family qwen3_moe -- --seq "$SEQ" \
        --iters 3 2>&1 | grep -v "^\s*$" | tee -a "$ANCHOR_LOG" | tail -4
}

if [ "$PART" = bench ] || [ "$PART" = all ]; then
    say "bench_target --family qwen3_moe --iters 3 (48 layers; limit 40 s)"
    timeout -k 5 40 "$BUILD/bench/bench_target" --family qwen3_moe --iters 3 || rc=1

    say "torch_moe_anchor.py --layers 48 --iters 2 --warmup 1 --then $E2E_LAYERS:$SEQ (limit 75 s)"
    timeout -k 5 75 python3 bench/torch_moe_anchor.py --layers 48 --iters 2 --warmup 1 --then "$E2E_LAYERS:$SEQ" \
        2>&1 | grep -v "^\s*$" | tee "$ANCHOR_LOG" | tail -20
    grep -q "forward:" "$ANCHOR_LOG" || rc=1
    drafter_anchor $((145 - (SECONDS - t0)))
fi

if [ "$PART" = e2e ] || [ "$PART" = all ]; then
    t1=$SECONDS
    touch "$ANCHOR_LOG"
    grep -q "^torch drafter step:" "$ANCHOR_LOG" || drafter_anchor 60
    W=$(mktemp -d /tmp/qwen3_moe_e2e-XXXXXX)
    zpid=
    if [ -f "${ZLAB:-zlab-dflash/dflash/model.py}" ]; then
        say "zlab_swa_gpu.sh in the background, beside the fixture (limit 45 s)"
        timeout -k 5 45 bash tests/gpu/zlab_swa_gpu.sh >"$W.zlab.log" 2>&1 &
        zpid=$!
    fi
    say "fixture: bench/e2e_fixture.py --family qwen3_moe --layers $E2E_LAYERS --samples 110 (limit 50 s)"
    timeout -k 5 50 python3 bench/e2e_fixture.py "$W" --family qwen3_moe --layers "$E2E_LAYERS" --samples 110 || rc=1
    if [ -n "$zpid" ]; then
        wait $zpid; r=$?
        cat "$W.zlab.log"
        say "zlab_swa_gpu.sh: exit $r"
        [ $r -ne 0 ] && [ $r -ne 77 ] && rc=1
    else say "zlab_swa_gpu.sh: no z-lab model.py (ZLAB=): not run"; rc=1; fi
    limit=$((145 - (SECONDS - t1)))
    say "FAMILY=qwen3_moe LAYERS=$E2E_LAYERS STEPS=60 WORK=$W bench/e2e_gpu.sh (LIMIT $limit s; anchors from $ANCHOR_LOG)"
    FAMILY=qwen3_moe LAYERS=$E2E_LAYERS STEPS=60 SEQ=$SEQ LIMIT=$limit ANCHOR_LOG=$ANCHOR_LOG WORK=$W FIXTURE_S=0 \
        RUN_S=55 timeout -k 5 $((limit + 5)) bash bench/e2e_gpu.sh || rc=1
    rm -rf "$W" "$W.zlab.log"
fi
say "done, exit $rc"
exit $rc
