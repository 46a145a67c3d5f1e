# TIMEOUT=150
# issue 23, the gate|up GEMM with SwiGLU in its epilogue (engineer gemmsw; kernels/matmul_swiglu.cu, opt-in
# DFLASH_GATEUP_FUSED=1; schedules by DFLASH_MATMUL_SWIGLU: cooperative (default), pingpong, cluster, the
# cooperative, cluster and ping-pong ones storing act through shared memory and TMA, cooperative_tmastore,
# cluster_tmastore, pingpong_tmastore, and pingpong_wide, ping-pong on 64 x 128 act tiles).
# In order of risk (time limits in brackets, 145 s in all):
#   1. [25 s] the matmul_swiglu rows of cooperative and cooperative_tmastore (kernel=1, 4: against the CPU reference,
#      against cuBLASLt gu + swiglu, the TMA-store bits against the cooperative ones, each row twice bitwise);
#   2. [25 s] the timing row at Qwen3-8B's shape (T=19218 H=4096 I=12288): cuBLASLt gate|up, swiglu, the two, and each
#      schedule (the cluster ones last), TFLOP/s of each, then the bits at that shape;
#   3. [22 s] the rows of pingpong, pingpong_tmastore, pingpong_wide (kernel=2, 6, 7: the turns' named barriers);
#   4. [18 s] the rows of cluster, cluster_tmastore (kernel=3, 5: clusters of 2 CTAs, TMA multicast);
#   5. [15 s each] bench_target without the switch and with it under the fastest schedule whose rows all passed;
#   6. [25 s] test_target_gpu qwen3 with the switch on, that schedule.
set -u
export DFLASH_GOLDENS=${DFLASH_GOLDENS:-tests/goldens}
nvidia-smi -L
# kernel=N of a row is matmul_swiglu.h's MATMUL_SWIGLU_* value N; these are matmul_swiglu_kernel_name's names
names=(auto cooperative pingpong cluster cooperative_tmastore cluster_tmastore pingpong_tmastore pingpong_wide)
out= passed=" " failed=" "
rows() { # LIMIT LABEL ARGS...: test_kernel_cases_gpu ARGS, its counts and the lines that matter
    local lim=$1 label=$2 s=$SECONDS rc
    shift 2
    out=$(timeout "$lim" build/gpu/test_kernel_cases_gpu "$@" 2>&1); rc=$?
    echo "$label: $(grep -c '^ok' <<<"$out") ok, $(grep -c '^FAIL' <<<"$out") FAIL, exit $rc, $((SECONDS - s)) s"
    grep -E '^FAIL|^timing|^skip|^ok .*(bitwise|share|against)|test_kernel_cases_gpu' <<<"$out" | cut -c1-260
    if [ $rc = 124 ]; then echo "(timed out; its last lines:)"; tail -n 3 <<<"$out" | cut -c1-260; fi
}
judge() { # N...: schedule N passed when each of its rows ended "twice bitwise-identical" and none of its lines failed
    local k n want got bad
    for k in "$@"; do
        n=${names[$k]}
        want=$(build/gpu/test_kernel_cases_gpu --list "kernel=$k" | grep -c "kernel=$k:")
        got=$(grep -cE "^ok .*kernel=$k: twice bitwise-identical" <<<"$out")
        bad=$(grep -E '^FAIL' <<<"$out" | grep -cE "kernel=$k([^0-9]|$)|matmul_swiglu_forward_cuda $n ")
        if [ "$want" -gt 0 ] && [ "$got" = "$want" ] && [ "$bad" = 0 ]; then passed="$passed$n "; else failed="$failed$n "; fi
        echo "$n: $got of $want rows twice bitwise, $bad FAIL lines"
    done
}
echo "== 1. rows kernel=1 (cooperative), kernel=4 (cooperative_tmastore)"
rows 25 "rows cooperative + cooperative_tmastore" "kernel=1" "kernel=4"
judge 1 4
echo "== 2. timing matmul_swiglu (with the one-row cooperative row)"
rows 25 "timing row" --timing matmul_swiglu "T=1 I=64 H=64 ldx=64 ldact=64 kernel=1"
timing=$out
echo "== 3. rows kernel=2 (pingpong), kernel=6 (pingpong_tmastore), kernel=7 (pingpong_wide)"
rows 22 "rows pingpong + pingpong_tmastore + pingpong_wide" "kernel=2" "kernel=6" "kernel=7"
judge 2 6 7
echo "== 4. rows kernel=3 (cluster), kernel=5 (cluster_tmastore)"
rows 18 "rows cluster + cluster_tmastore" "kernel=3" "kernel=5"
judge 3 5
# the fastest schedule at the 8B shape among those whose rows passed and whose bits at that shape are cooperative's
best=$(grep '^timing matmul_swiglu: ' <<<"$timing" |
       sed -E 's/^timing matmul_swiglu: matmul_swiglu_forward_cuda ([a-z_]+) ([0-9.]+) ms.*/\2 \1/' |
       while read -r ms n; do
           [[ "$passed" == *" $n "* ]] && ! grep -qE "^FAIL matmul_swiglu_forward_cuda $n " <<<"$timing" && echo "$ms $n"
       done | sort -n | head -n 1 | cut -d' ' -f2)
best=${best:-cooperative}
echo "schedules whose rows passed:${passed}failed:${failed}the fastest that passed at the 8B shape: $best"
bench() { # GATEUP_FUSED SCHEDULE
    echo "== bench_target --iters 5, DFLASH_GATEUP_FUSED=$1 DFLASH_MATMUL_SWIGLU=$2"
    local s=$SECONDS o rc
    o=$(env DFLASH_GATEUP_FUSED=$1 DFLASH_MATMUL_SWIGLU=$2 timeout 15 build/bench/bench_target --iters 5 2>&1); rc=$?
    grep -E "tok/s|time split|rates|ideal|FAIL|rror" <<<"$o" | cut -c1-300
    echo "[exit $rc after $((SECONDS - s)) s]"
}
echo "== 5. the target step"
bench 0 cooperative
bench 1 "$best"
echo "== 6. test_target_gpu qwen3 DFLASH_GATEUP_FUSED=1 DFLASH_MATMUL_SWIGLU=$best"
s=$SECONDS
o=$(env DFLASH_GATEUP_FUSED=1 DFLASH_MATMUL_SWIGLU=$best timeout 25 build/gpu/test_target_gpu qwen3 2>&1); rc=$?
echo "test_target_gpu qwen3 (fused, $best): $(grep -c '^ok' <<<"$o") ok, $(grep -c '^FAIL' <<<"$o") FAIL, exit $rc, $((SECONDS - s)) s"
grep -E '^FAIL' <<<"$o" | head -20 | cut -c1-300
exit 0
