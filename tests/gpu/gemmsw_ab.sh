# TIMEOUT=150
# issue 23, the gate|up GEMM with SwiGLU in its epilogue (engineer gemmsw; kernels/matmul_swiglu.cu, opt-in
# DFLASH_GATEUP_FUSED=1): the matmul_swiglu rows of the kernel case table (against the CPU reference and against
# cuBLASLt gu + swiglu, twice bitwise; its cooperative and ping-pong schedules) with the timing row at Qwen3-8B's
# shape (both schedules against cuBLASLt gate|up + swiglu, TFLOP/s of each); then bench_target without the switch and
# with it under each schedule (DFLASH_MATMUL_SWIGLU=pingpong), and test_target_gpu qwen3 with it.
set -u
export DFLASH_GOLDENS=${DFLASH_GOLDENS:-tests/goldens}
nvidia-smi -L
echo "== test_kernel_cases_gpu matmul_swiglu rows + timing matmul_swiglu"
o=$(timeout 55 build/gpu/test_kernel_cases_gpu --timing matmul_swiglu matmul_swiglu 2>&1); rc=$?
echo "kernel cases: $(grep -c '^ok' <<<"$o") ok, $(grep -c '^FAIL' <<<"$o") FAIL, exit $rc"
grep -E '^FAIL|^timing|^skip|^ok .*(bitwise|share|against)|test_kernel_cases_gpu' <<<"$o" | cut -c1-300
# the target's MLP: today's path, the fused kernel's cooperative schedule, its ping-pong one
for v in "0 cooperative" "1 cooperative" "1 pingpong"; do
  set -- $v
  echo "== bench_target --iters 5, DFLASH_GATEUP_FUSED=$1 DFLASH_MATMUL_SWIGLU=$2$([ $1 = 0 ] && echo ' (cuBLASLt gate|up + swiglu)')"
  s=$SECONDS; o=$(env DFLASH_GATEUP_FUSED=$1 DFLASH_MATMUL_SWIGLU=$2 timeout 20 build/bench/bench_target --iters 5 2>&1); rc=$?
  grep -E "tok/s|time split|rates|ideal|FAIL|rror" <<<"$o" | cut -c1-300; echo "[exit $rc after $((SECONDS - s)) s]"
done
echo "== test_target_gpu qwen3 DFLASH_GATEUP_FUSED=1"
o=$(env DFLASH_GATEUP_FUSED=1 timeout 30 build/gpu/test_target_gpu qwen3 2>&1); rc=$?
echo "test_target_gpu qwen3 (fused): $(grep -c '^ok' <<<"$o") ok, $(grep -c '^FAIL' <<<"$o") FAIL, exit $rc"
grep -E '^FAIL' <<<"$o" | head -20 | cut -c1-300
exit 0
