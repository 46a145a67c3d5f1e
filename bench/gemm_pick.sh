# TIMEOUT=50
# The GEMM pick rule on the H200 (issue 23): the matmul rows and the matmul_survey timing (every cuBLASLt heuristic
# candidate timed at the target's, the drafter's and the cross-entropy's shapes, with the heuristic's first, the
# fastest, the rule's pick and the no-split-K most-waves candidate), then bench_drafter and bench_target (12 of its
# 36 layers: the same GEMM shapes) with the default rule and with DFLASH_GEMM_PICK=first.
#   bash bench/gemm_pick.sh        (from the root, after make cuda)
t0=$(date +%s)
s() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
s survey
timeout 22 stdbuf -oL build/gpu/test_kernel_cases_gpu --timing matmul_survey matmul 2>&1 | grep --line-buffered -v "^ok "
s drafter default
timeout 5 build/bench/bench_drafter --iters 3 2>&1 | grep -E "forward_backward|time split"
s drafter first
DFLASH_GEMM_PICK=first timeout 5 build/bench/bench_drafter --iters 3 2>&1 | grep -E "forward_backward|time split"
s target default
timeout 7 build/bench/bench_target --iters 3 --layers 12 2>&1 | grep -E "step \(|time split|rates"
s target first
DFLASH_GEMM_PICK=first timeout 7 build/bench/bench_target --iters 3 --layers 12 2>&1 | grep -E "step \(|time split|rates"
s done
