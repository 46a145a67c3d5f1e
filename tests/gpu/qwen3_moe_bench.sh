# TIMEOUT=400
# Issue 21's measured parts for qwen3_moe and the drafter's sliding windows, in one device command (one H200, from the
# worktree root with the build at build/; ~380 s):   bash tests/gpu/qwen3_moe_bench.sh
# 1. tests/gpu/zlab_swa_gpu.sh: a sliding-window drafter trained by dflash decoded by z-lab's model.py (ZLAB=, default
#    ./zlab-dflash/dflash/model.py) with dflash eval's tau;
# 2. bench_target --family qwen3_moe: the Qwen3-30B-A3B shape (bench/qwen3_30b_a3b.h, all 48 layers), random bf16, on
#    the benchmark batch (16 sequences, 19218 tokens);
# 3. its anchor, after it (each process holds its own 61 GB of weights, never both at once): transformers'
#    Qwen3MoeForCausalLM of the same shape on the same batch (bench/torch_moe_anchor.py --layers 48), the same process
#    then timing its first E2E_LAYERS layers on one SEQ-token sample (--then), the forward anchor of step 4;
# 4. FAMILY=qwen3_moe bench/e2e_gpu.sh with LAYERS=E2E_LAYERS (default 16 of the 48: a 21 GB checkpoint to write and
#    load; the full depth's 61 GB would not fit the command's time), the drafter anchor (torch_drafter_anchor.py,
#    TORCH= or ./torch_drafter_anchor.py or ../shared/bench/) and the run, until what is left of the 390 s.
# Each step runs under its own timeout; a failing step does not stop the next. Everything goes to stdout.
cd "$(dirname "$0")/../.." || exit 1
exec 2>&1
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 BUILD=${BUILD:-build} DFLASH_GOLDENS=${DFLASH_GOLDENS:-tests/goldens}
E2E_LAYERS=${E2E_LAYERS:-16} SEQ=${SEQ:-2936} BUDGET=${BUDGET:-390}
t0=$SECONDS
say() { echo "=== qwen3_moe_bench [$((SECONDS - t0)) s] $*"; }
say "$(timeout 20 nvidia-smi -L 2>/dev/null | head -1); budget $BUDGET s"
rc=0

say "zlab_swa_gpu.sh (limit 100 s)"
timeout -k 5 100 bash tests/gpu/zlab_swa_gpu.sh
r=$?; [ $r -ne 0 ] && [ $r -ne 77 ] && rc=1
say "zlab_swa_gpu.sh: exit $r"

say "bench_target --family qwen3_moe --iters 5 (48 layers; limit 90 s)"
timeout -k 5 90 "$BUILD/bench/bench_target" --family qwen3_moe --iters 5 || rc=1

alog=$(mktemp /tmp/qwen3_moe_anchor-XXXXXX.log)
say "torch_moe_anchor.py --layers 48 --iters 2 --then $E2E_LAYERS:$SEQ (limit 130 s)"
timeout -k 5 130 python3 bench/torch_moe_anchor.py --layers 48 --iters 2 --then "$E2E_LAYERS:$SEQ" 2>&1 |
    grep -v "^\s*$" | tee "$alog" | tail -20
grep -q "forward:" "$alog" || rc=1

left=$((BUDGET - (SECONDS - t0) - 10))
[ $left -gt 230 ] && left=230
if [ $left -lt 60 ]; then say "e2e: skipped, $left s left"; rc=1
else
    say "FAMILY=qwen3_moe LAYERS=$E2E_LAYERS STEPS=100 bench/e2e_gpu.sh (LIMIT $left s)"
    FAMILY=qwen3_moe LAYERS=$E2E_LAYERS STEPS=100 SEQ=$SEQ LIMIT=$left ANCHOR_LOG=$alog \
        timeout -k 5 $((left + 10)) bash bench/e2e_gpu.sh || rc=1
fi
rm -f "$alog"
say "done, exit $rc"
exit $rc
