# TIMEOUT=300
# The MoE block on the device (issue 20 item 3), one device request: its kernels against their CPU references, the
# hybrid target forward on the goldens (qwen35moe-tiny) and random MoE shapes, then the Qwen3.5-35B-A3B-shaped
# benchmark: bench_target --family qwen3_5_moe and transformers + flash-linear-attention on the same batch.
# Needs .fla.tar.xz at the root (../shared/tools/fla-carry.sh GIT_DIR .fla.tar.xz).
# run from the worktree root (the queue copies the script there)
export PYTHONUNBUFFERED=1 DFLASH_GOLDENS=tests/goldens
nvidia-smi -L; nvidia-smi --query-gpu=memory.used,memory.total --format=csv
t0=$SECONDS
echo "=== test_hybrid_kernels_gpu"; timeout 90 build/gpu/test_hybrid_kernels_gpu; echo "exit $? ($((SECONDS - t0)) s)"
echo "=== bench_moe"; timeout 60 build/bench/bench_moe; echo "exit $? ($((SECONDS - t0)) s)"
echo "=== bench_target --family qwen3_5_moe --iters 5"
timeout 100 build/bench/bench_target --family qwen3_5_moe --iters 5; echo "exit $? ($((SECONDS - t0)) s)"
if [ -f .fla.tar.xz ]; then mkdir -p /tmp/fla && tar -xJf .fla.tar.xz -C /tmp/fla && export PYTHONPATH=/tmp/fla; fi
echo "=== torch_hybrid_anchor.py --family qwen3_5_moe --path fla --iters 2 (PYTHONPATH=$PYTHONPATH)"
timeout 140 python3 bench/torch_hybrid_anchor.py --family qwen3_5_moe --path fla --iters 2 2>&1 | grep -v "^\s*$" | tail -25
echo "exit ${PIPESTATUS[0]} ($((SECONDS - t0)) s)"
echo "=== test_target_gpu hybrid"; timeout $((290 - (SECONDS - t0))) build/gpu/test_target_gpu hybrid
echo "exit $? ($((SECONDS - t0)) s)"
