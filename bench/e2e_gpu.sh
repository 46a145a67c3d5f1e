#!/usr/bin/env bash
# The end to end on one H200 and its anchors in one GPU command (issue 20 item 6: FAMILY=qwen3_5, the default; issue
# 21: FAMILY=qwen3_moe and FAMILY=gpt_oss):
#   BUILD=build [FAMILY=qwen3_5|qwen3_moe|gpt_oss] bench/e2e_gpu.sh   [LAYERS=N] [STEPS=50] [LIMIT=230] [SEQ=2936]
#       [TORCH=<torch_drafter_anchor.py>] [ANCHOR_LOG=FILE]
# 1. the anchors, on the shapes of the run below (one sequence of SEQ=2936 tokens, the mean of e2e_fixture.py's
#    2800-3072): the target forward of transformers' own model and the PyTorch drafter step
#    (torch_drafter_anchor.py through bench/torch_drafter_anchor_shape.py --family FAMILY at the drafter a job
#    derives from the target: 5 layers, the target's hidden size, heads and MLP width, its vocabulary, 5 taps,
#    --seq SEQ; for qwen3_5 heads 32/8 x 128 -- the same parameters and FLOPs -- if flex_attention fails at head_dim
#    256). The forward, per family:
#      qwen3_5   bench/torch_hybrid_anchor.py --path fla (Qwen3.5-9B shape, flash-linear-attention from .fla.tar.xz
#                made by ../shared/tools/fla-carry.sh; the torch fallback path when fla does not import), LAYERS 32
#      qwen3_moe bench/torch_moe_anchor.py --layers LAYERS --lengths SEQ (Qwen3-30B-A3B shape, transformers' default
#                MoE path), LAYERS 16 by default: a cut of the 48 layers (the 48-layer checkpoint is 61 GB to write
#                and read back, past this command's time; the forward anchor's figure is per layer comparable)
#      gpt_oss   bench/torch_gptoss_anchor.py --layers LAYERS --lengths SEQ (gpt-oss-20b shape, transformers' eager
#                attention and default experts path, bf16 experts as transformers runs a dequantised checkpoint),
#                LAYERS 8 by default: a cut of the 24 layers (the 24-layer bf16 checkpoint is 42 GB; 8 layers are
#                15 GB, written in ~30-40 s and loaded as fast, so that fixture + load fit ~60 s of the command);
#                MXFP4=1: the fixture's experts as MXFP4 blocks + scales, as the published checkpoints ship them
#                (e2e_fixture.py --mxfp4: 13 GB at the full 24 layers, dequantised by dflash at load)
#    ANCHOR_LOG=FILE: a log that already holds an anchor's lines at this shape (the qwen3_moe forward at LAYERS layers
#    on SEQ tokens, as torch_moe_anchor.py --then LAYERS:SEQ prints it; the gpt_oss forward, as torch_gptoss_anchor.py
#    --layers LAYERS --lengths SEQ prints it; the drafter step at the derived drafter's
#    shape with --seq SEQ): that anchor is not run again (tests/gpu/qwen3_moe_bench.sh times them in its first device
#    command and runs the fixture and the run in a second one). FIXTURE_S, RUN_S (default 50, 60): the seconds kept
#    for the fixture and the run when the anchors' limits are set. WORK=DIR: a folder already holding the fixture
#    (target/config.json and data.jsonl, as e2e_fixture.py writes them): used as it is, not deleted;
# 2. bench/e2e_fixture.py --family FAMILY: the target (LAYERS layers), random bf16, and STEPS+50 samples;
# 3. FAMILY=FAMILY bench/e2e.sh on it: dflashd + prefetch + dflash-target-cuda + dflash-drafter-cuda on the GPU, one
#    sample a step; its steady samples/s (the run is cut at what is left of LIMIT: the steady figure is then read off
#    the steps committed by then); the run's drafter checkpoint is compared with the shape the anchor ran at;
# 4. one summary line: dflash samples/s, the anchors' s/sample (forward + drafter step) and their sum, the ratio.
# The anchors go first: each has its own limit, and the run, cut short, still gives a figure. Every step runs under
# `timeout` with its limit cut to what is left of LIMIT (default 230 s), so the whole script ends within ~240 s even
# when a step hangs; everything goes to stdout. The drafter anchor is looked for in $TORCH, ../shared/bench/ and the
# repository root.
# qwen3_5 on one H200 (2026-12-04, the merged tree): fla forward 27,456 tok/s on 2936 tokens (0.107 s a sample); no
# dflash figure yet (dflash could not load there, fixed since). Expected (not measured): anchors ~40-60 s each
# (model build, fla's Triton autotuning, torch.compile of flex_attention), fixture ~35 s (18 GB written), run ~70 s.
cd "$(dirname "$0")/.." || exit 1
exec 2>&1
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
FAMILY=${FAMILY:-qwen3_5}
case $FAMILY in # family: its benchmark shape, default depth
    qwen3_5) SHAPE=Qwen3.5-9B FULL=32 ;;
    qwen3_moe) SHAPE=Qwen3-30B-A3B FULL=48 ;;
    gpt_oss) SHAPE=gpt-oss-20b FULL=24 ;;
    *) echo "e2e_gpu: FAMILY=$FAMILY: expected qwen3_5, qwen3_moe or gpt_oss" >&2; exit 2 ;;
esac
DEF_LAYERS=$FULL; [ "$FAMILY" = qwen3_moe ] && DEF_LAYERS=16; [ "$FAMILY" = gpt_oss ] && DEF_LAYERS=8
BUILD=${BUILD:-build} LAYERS=${LAYERS:-$DEF_LAYERS} STEPS=${STEPS:-50} LIMIT=${LIMIT:-230} SEQ=${SEQ:-2936}
FIXTURE_S=${FIXTURE_S:-50} RUN_S=${RUN_S:-60}   # what the fixture and the run are expected to take: kept for them
START=$SECONDS
say() { echo "=== e2e_gpu $FAMILY [$((SECONDS - START)) s] $*"; }
# limit CAP RESERVE: seconds for the next step, at most CAP, leaving RESERVE for the steps after it; 0 (the step is
# skipped) when fewer than 15 are left
limit() {
    local l=$((LIMIT - (SECONDS - START) - $2))
    [ "$l" -gt "$1" ] && l=$1
    [ "$l" -lt 15 ] && l=0
    echo "$l"
}
skipped() { say "$1: skipped, $((LIMIT - (SECONDS - START))) s left of the $LIMIT s limit"; }
say "LAYERS=$LAYERS ($([ "$LAYERS" = $FULL ] && echo "the $SHAPE shape's full depth" || echo "a cut of the $SHAPE shape's $FULL layers")), STEPS=$STEPS, SEQ=$SEQ, limit $LIMIT s; $(timeout 20 nvidia-smi -L 2>/dev/null | head -1)"

if [ "$FAMILY" = qwen3_5 ]; then
    if [ -f .fla.tar.xz ]; then mkdir -p /tmp/fla && timeout 60 tar -xJf .fla.tar.xz -C /tmp/fla && export PYTHONPATH=/tmp/fla; fi
    say "flash-linear-attention: $(timeout 60 python3 -c 'import fla; print(fla.__version__, fla.__file__)' 2>&1 | tail -1)"
fi

if [ -n "${WORK:-}" ] && [ -f "$WORK/target/config.json" ] && [ -f "$WORK/data.jsonl" ]; then
    W=$WORK own=0   # the caller's fixture: used as it is and left in place
    say "fixture: the target and data already in $W are used as they are"
else
    W=$(mktemp -d /tmp/dflash-e2eh-XXXXXX) own=1
fi
OUT=${OUT:-$W.out}
cleanup() { # the run's processes (their command lines name $W/) and the fixture (GBs) when it is ours
    local pids
    pids=$(pgrep -f "$W/" 2>/dev/null) && kill -9 $pids 2>/dev/null
    [ $own = 1 ] && rm -rf "$W"
}
trap 'cleanup; rm -rf "$W".*.log "$W".drafter.json "$W".out' EXIT
alog=$W.anchors.log
: >"$alog"

# 1. the anchors
t=$(limit 70 $((FIXTURE_S + RUN_S + 20)))
fwd_path=fla
if [ "$FAMILY" = qwen3_moe ]; then
    fwd_path=moe
    if [ -n "${ANCHOR_LOG:-}" ] && grep -q "^torch qwen3_moe \[$LAYERS layers, 1 x $SEQ padded" "$ANCHOR_LOG"; then
        say "torch qwen3_moe anchor: taken from $ANCHOR_LOG"
        grep "^torch qwen3_moe \[$LAYERS layers, 1 x $SEQ padded" "$ANCHOR_LOG" | tee -a "$alog"
    elif [ "$t" -eq 0 ]; then skipped "torch qwen3_moe anchor"
    else
        say "torch qwen3_moe anchor: bench/torch_moe_anchor.py --layers $LAYERS --lengths $SEQ --iters 3 (limit $t s)"
        timeout -k 5 "$t" python3 bench/torch_moe_anchor.py --layers "$LAYERS" --lengths "$SEQ" --iters 3 2>&1 |
            tee -a "$alog"
    fi
elif [ "$FAMILY" = gpt_oss ]; then
    fwd_path=gptoss
    ftag="torch gpt_oss \[$LAYERS layers, 1 x $SEQ padded, $SEQ tokens\] forward alone:"
    if [ -n "${ANCHOR_LOG:-}" ] && grep -q "^$ftag" "$ANCHOR_LOG"; then
        say "torch gpt_oss anchor: taken from $ANCHOR_LOG"
        grep "^$ftag" "$ANCHOR_LOG" | tee -a "$alog"
    elif [ "$t" -eq 0 ]; then skipped "torch gpt_oss anchor"
    else
        say "torch gpt_oss anchor: bench/torch_gptoss_anchor.py --layers $LAYERS --lengths $SEQ --iters 3 (limit $t s)"
        timeout -k 5 "$t" python3 bench/torch_gptoss_anchor.py --layers "$LAYERS" --lengths "$SEQ" --iters 3 2>&1 |
            tee -a "$alog"
    fi
elif [ "$t" -eq 0 ]; then skipped "torch hybrid anchor"
else
    say "torch hybrid anchor: bench/torch_hybrid_anchor.py --path fla --iters 3 --layers $LAYERS --lengths $SEQ (limit $t s)"
    timeout -k 5 "$t" python3 bench/torch_hybrid_anchor.py --path fla --iters 3 --layers "$LAYERS" --lengths "$SEQ" \
        2>&1 | tee -a "$alog"
    if ! grep -q "^torch hybrid \[fla\] forward:" "$alog"; then
        fwd_path=torch
        t=$(limit 50 $((FIXTURE_S + RUN_S + 20)))
        if [ "$t" -eq 0 ]; then skipped "torch hybrid anchor, torch path"
        else
            say "torch hybrid anchor: no fla forward figure; the torch fallback path instead (limit $t s)"
            timeout -k 5 "$t" python3 bench/torch_hybrid_anchor.py --path torch --iters 3 --layers "$LAYERS" \
                --lengths "$SEQ" 2>&1 | tee -a "$alog"
        fi
    fi
fi
drafter_anchor=
for f in "${TORCH:-}" ../shared/bench/torch_drafter_anchor.py torch_drafter_anchor.py; do
    [ -n "$f" ] && [ -f "$f" ] && { drafter_anchor=$f; break; }
done
heads=
dtag="torch drafter anchor at the shape of the drafter derived from the $SHAPE-shaped target"
if [ -n "${ANCHOR_LOG:-}" ] && grep -q "^$dtag: .* --seq $SEQ " "$ANCHOR_LOG" && grep -q "^torch drafter step:" "$ANCHOR_LOG"; then
    say "torch drafter anchor: taken from $ANCHOR_LOG"
    grep "^$dtag\|^torch drafter step:\|^drafter:" "$ANCHOR_LOG" | tee -a "$alog"
elif [ -z "$drafter_anchor" ]; then
    say "torch drafter anchor: not found (TORCH=, ../shared/bench/, ./torch_drafter_anchor.py): not timed"
else
    t=$(limit 90 $((FIXTURE_S + RUN_S)))   # torch.compile of flex_attention takes most of it
    if [ "$t" -eq 0 ]; then skipped "torch drafter anchor"
    else
        say "torch drafter anchor: $drafter_anchor at the derived drafter's shape, --seq $SEQ --iters 3 (limit $t s)"
        timeout -k 5 "$t" python3 bench/torch_drafter_anchor_shape.py "$drafter_anchor" --family "$FAMILY" -- \
            --seq "$SEQ" --iters 3 2>&1 | tee -a "$alog"
    fi
    if [ "$FAMILY" = qwen3_5 ] && ! grep -q "^torch drafter step:" "$alog"; then
        t=$(limit 50 $((FIXTURE_S + RUN_S)))
        if [ "$t" -eq 0 ]; then skipped "torch drafter anchor, heads 32/8 x 128"
        else
            heads=32,8,128
            say "torch drafter anchor: no figure at head_dim 256; heads 32/8 x 128 (same parameters and FLOPs) (limit $t s)"
            timeout -k 5 "$t" python3 bench/torch_drafter_anchor_shape.py "$drafter_anchor" --family "$FAMILY" --heads $heads -- \
                --seq "$SEQ" --iters 3 2>&1 | tee -a "$alog"
        fi
    fi
fi

# 2. the fixture, 3. the run
elog=$W.e2e.log
: >"$elog"
t=$(limit 75 "$RUN_S")
if [ $own = 0 ]; then rc=0
elif [ "$t" -eq 0 ]; then skipped fixture; rc=1
else
    q=$([ "$FAMILY" = gpt_oss ] && [ "${MXFP4:-0}" = 1 ] && echo --mxfp4)
    say "fixture: bench/e2e_fixture.py --family $FAMILY --layers $LAYERS --samples $((STEPS + 50)) $q (limit $t s)"
    timeout -k 5 "$t" python3 bench/e2e_fixture.py "$W" --family "$FAMILY" --layers "$LAYERS" --samples $((STEPS + 50)) $q
    rc=$?
    [ $rc -ne 0 ] && say "fixture: exit $rc$([ $rc -eq 124 ] && echo " (timed out after $t s)")"
fi
if [ $rc -eq 0 ]; then
    t=$(limit 120 $((own ? 15 : 6)))   # what the end needs: the summary, and deleting a fixture of ours
    if [ "$t" -eq 0 ]; then skipped e2e
    else
        say "e2e: FAMILY=$FAMILY LAYERS=$LAYERS STEPS=$STEPS bench/e2e.sh (its run cut at $t s)"
        WORK=$W OUT=$OUT BUILD=$BUILD FAMILY=$FAMILY LAYERS=$LAYERS STEPS=$STEPS RUN_TIMEOUT=$t \
            timeout -k 5 $((t + 20)) bash bench/e2e.sh 2>&1 | tee "$elog"
        say "e2e: exit ${PIPESTATUS[0]}"
        # the run's drafter against the shape the drafter anchor ran at
        if [ -f "$W/run/ckpt/latest/config.json" ] && [ -n "$drafter_anchor" ]; then
            cp "$W/run/ckpt/latest/config.json" "$W.drafter.json"
            a=$(python3 bench/torch_drafter_anchor_shape.py "$drafter_anchor" --family "$FAMILY" ${heads:+--heads $heads} --dry-run | sed 's/.*: H,/H,/')
            r=$(python3 bench/torch_drafter_anchor_shape.py "$drafter_anchor" --config "$W.drafter.json" --dry-run | sed 's/.*: H,/H,/')
            if [ "$a" = "$r" ]; then say "drafter shape: the run's checkpoint and the anchor agree: $r"
            else say "drafter shape: the run's checkpoint: $r; the anchor ran at: $a"; fi
        fi
    fi
fi
cleanup

# 4. the summary
python3 - "$elog" "$alog" "$fwd_path" "$LAYERS" "$STEPS" "$SEQ" "$heads" "$FAMILY" "$SHAPE" <<'EOP'
import re, sys
e2e, anc = open(sys.argv[1]).read(), open(sys.argv[2]).read()
path, layers, steps, seq, heads, family, shape = sys.argv[3:10]
m = re.search(r"^e2e steady \(steps (\d+)-(\d+), [\d.]+ s\): ([\d.]+) samples/s, (\d+) tokens/s", e2e, re.M)
sps, span = (float(m.group(3)), "steps %s-%s, %.0f tokens a sample" % (m.group(1), m.group(2),
             float(m.group(4)) / float(m.group(3)))) if m else (None, "")
fwd_re = {"qwen3_moe": r"^torch qwen3_moe \[%s layers, 1 x %s padded, \d+ tokens\] forward: \d+ tok/s \(([\d.]+) ms"
          % (layers, seq), "gpt_oss": r"^torch gpt_oss \[%s layers, 1 x %s padded, \d+ tokens\] forward alone: \d+ "
          r"tok/s \(([\d.]+) ms" % (layers, seq)}.get(family, r"^torch hybrid \[%s\] forward: \d+ tok/s \((\d+) ms"
                                                         % re.escape(path))
m = re.search(fwd_re, anc, re.M)
fwd = float(m.group(1)) / 1000 if m else None
m = re.search(r"^torch drafter step: (\d+) ms", anc, re.M)
dra = float(m.group(1)) / 1000 if m else None
out = ["e2e %s summary (%s shape, %s layers, %s steps, anchors at %s tokens%s):" %
       (family, shape, layers, steps, seq, ", drafter anchor heads " + heads if heads else "")]
out.append("dflash %.2f samples/s (%.0f ms a sample; %s)" % (sps, 1000 / sps, span) if sps else "dflash: no steady figure")
out.append("| anchors: %s forward %s s/sample + PyTorch drafter step %s s/sample" %
           ("transformers" if family in ("qwen3_moe", "gpt_oss") else path, "%.3f" % fwd if fwd else "n/a",
            "%.3f" % dra if dra else "n/a"))
if fwd and dra:
    out.append("= %.3f s/sample (%.2f samples/s)" % (fwd + dra, 1 / (fwd + dra)))
out.append("| ratio %.2fx" % (sps * (fwd + dra)) if sps and fwd and dra else "| ratio n/a")
print(" ".join(out))
sys.exit(0 if sps else 1)   # no dflash figure: the command failed
EOP
src=$?
say "done"
exit $src
