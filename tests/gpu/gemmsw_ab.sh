# TIMEOUT=150
# issue 23, the gate|up GEMM with SwiGLU in its epilogue (engineer gemmsw; kernels/matmul_swiglu.cu, opt-in
# DFLASH_GATEUP_FUSED=1; schedules cooperative (default), pingpong, cluster: DFLASH_MATMUL_SWIGLU). In order of risk:
#   1. the matmul_swiglu rows of the cooperative and ping-pong schedules (kernel=1, 2: against the CPU reference,
#      against cuBLASLt gu + swiglu, ping-pong's bits against cooperative's, each row twice bitwise);
#   2. the timing row at Qwen3-8B's shape (T=19218 H=4096 I=12288): cuBLASLt gate|up, swiglu, the two, and each
#      schedule (the cluster one last), TFLOP/s of each, then the bits at that shape;
#   3. the cluster schedule's rows (kernel=3: clusters of 2 CTAs, TMA multicast);
#   4. bench_target without the switch and with it under the schedule the timing found fastest;
#   5. test_target_gpu qwen3 with the switch on, that schedule.
set -u
export DFLASH_GOLDENS=${DFLASH_GOLDENS:-tests/goldens}
nvidia-smi -L
out=
rows() { # LIMIT LABEL ARGS...: test_kernel_cases_gpu ARGS, its counts and the lines that matter
    local lim=$1 label=$2 s=$SECONDS rc
    shift 2
    out=$(timeout "$lim" build/gpu/test_kernel_cases_gpu "$@" 2>&1); rc=$?
    echo "$label: $(grep -c '^ok' <<<"$out") ok, $(grep -c '^FAIL' <<<"$out") FAIL, exit $rc, $((SECONDS - s)) s"
    grep -E '^FAIL|^timing|^skip|^ok .*(bitwise|share|against)|test_kernel_cases_gpu' <<<"$out" | cut -c1-260
    if [ $rc = 124 ]; then echo "(timed out; its last lines:)"; tail -n 3 <<<"$out" | cut -c1-260; fi
}
echo "== 1. rows kernel=1 (cooperative), kernel=2 (pingpong)"
rows 35 "rows cooperative + pingpong" "kernel=1" "kernel=2"
failed=$(grep -E '^FAIL' <<<"$out" | grep -oE 'cooperative|pingpong|kernel=[0-9]' | sed 's/kernel=1/cooperative/; s/kernel=2/pingpong/' |
         sort -u | tr '\n' ' ')
echo "== 2. timing matmul_swiglu (with the one-row cooperative row)"
rows 25 "timing row" --timing matmul_swiglu "T=1 I=64 H=64 ldx=64 ldact=64 kernel=1"
timing=$out
echo "== 3. rows kernel=3 (cluster)"
rows 20 "rows cluster" "kernel=3"
grep -qE '^FAIL' <<<"$out" || ! grep -q '^test_kernel_cases_gpu' <<<"$out" && failed="$failed cluster"
# the fastest schedule at the 8B shape among those whose rows passed
best=$(grep '^timing matmul_swiglu: ' <<<"$timing" | sed -E 's/^timing matmul_swiglu: matmul_swiglu_forward_cuda ([a-z]+) ([0-9.]+) ms.*/\2 \1/' |
       grep -vwE "$(echo ${failed:-none} | tr ' ' '|')" | sort -n | head -n 1 | cut -d' ' -f2)
best=${best:-cooperative}
echo "schedules whose rows failed: ${failed:-none}; the fastest of the others at the 8B shape: $best"
bench() { # GATEUP_FUSED SCHEDULE
    echo "== bench_target --iters 5, DFLASH_GATEUP_FUSED=$1 DFLASH_MATMUL_SWIGLU=$2"
    local s=$SECONDS o rc
    o=$(env DFLASH_GATEUP_FUSED=$1 DFLASH_MATMUL_SWIGLU=$2 timeout 20 build/bench/bench_target --iters 5 2>&1); rc=$?
    grep -E "tok/s|time split|rates|ideal|FAIL|rror" <<<"$o" | cut -c1-300
    echo "[exit $rc after $((SECONDS - s)) s]"
}
echo "== 4. the target step"
bench 0 none
bench 1 "$best"
echo "== 5. test_target_gpu qwen3 DFLASH_GATEUP_FUSED=1 DFLASH_MATMUL_SWIGLU=$best"
s=$SECONDS
o=$(env DFLASH_GATEUP_FUSED=1 DFLASH_MATMUL_SWIGLU=$best timeout 25 build/gpu/test_target_gpu qwen3 2>&1); rc=$?
echo "test_target_gpu qwen3 (fused, $best): $(grep -c '^ok' <<<"$o") ok, $(grep -c '^FAIL' <<<"$o") FAIL, exit $rc, $((SECONDS - s)) s"
grep -E '^FAIL' <<<"$o" | head -20 | cut -c1-300
exit 0
