# TIMEOUT=300
# The MoE block on the device (issue 20 item 3) in one device request, from the worktree root with the build at
# build/:   bash tests/gpu/moe_gpu.sh [quick]
# quick (~30 s): its kernels against their CPU references (the hybrid and MoE rows of test_kernel_cases_gpu), one Qwen3.5-35B-A3B MoE layer
# kernel by kernel (bench_moe) and the whole Qwen3.5-35B-A3B-shaped target (bench_target --family qwen3_5_moe).
# Without quick (~200 s) also transformers + flash-linear-attention on the same batch (needs .fla.tar.xz at the root:
# ../shared/tools/fla-carry.sh GIT_DIR .fla.tar.xz) and the hybrid target forward on the goldens (test_target_gpu).
export PYTHONUNBUFFERED=1 DFLASH_GOLDENS=${DFLASH_GOLDENS:-tests/goldens}
nvidia-smi -L
t0=$SECONDS rc=0
echo "=== test_kernel_cases_gpu (hybrid, MoE)"; timeout 90 build/gpu/test_kernel_cases_gpu causal_conv gated_delta_prep \
    gated_rmsnorm sigmoid_gate qk_norm_rope_partial moe_ || rc=1; echo "($((SECONDS - t0)) s)"
echo "=== bench_moe"; timeout 60 build/bench/bench_moe || rc=1; echo "($((SECONDS - t0)) s)"
echo "=== bench_target --family qwen3_5_moe --iters 5"
timeout 100 build/bench/bench_target --family qwen3_5_moe --iters 5 || rc=1; echo "($((SECONDS - t0)) s)"
[ "${1:-}" = quick ] && exit $rc
if [ -f .fla.tar.xz ]; then mkdir -p /tmp/fla && tar -xJf .fla.tar.xz -C /tmp/fla && export PYTHONPATH=/tmp/fla; fi
echo "=== torch_hybrid_anchor.py --family qwen3_5_moe --path fla --iters 2 (PYTHONPATH=${PYTHONPATH:-})"
timeout 140 python3 bench/torch_hybrid_anchor.py --family qwen3_5_moe --path fla --iters 2 2>&1 | grep -v "^\s*$" | tail -25
echo "($((SECONDS - t0)) s)"
echo "=== test_target_gpu hybrid"; timeout 200 build/gpu/test_target_gpu hybrid || rc=1
echo "($((SECONDS - t0)) s)"
exit $rc
