# TIMEOUT=50
# issue 23: cuBLASLt candidate survey (matmul rows + the survey timing), then the benches with the default pick
# (no split-K, most waves) and with DFLASH_GEMM_PICK=first (the target at 12 of its 36 layers: same GEMM shapes)
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
