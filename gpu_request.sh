# TIMEOUT=400
# restart (issue 20 item 5): kept target weights. Tests first, then the 8B restart-gap benchmark (keep on and off).
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
nvidia-smi -L
t0=$SECONDS
echo "=== gpu_pipeline"; BUILD=build timeout 120 bash tests/gpu/gpu_pipeline.sh 2>&1 | tail -12; echo "($((SECONDS - t0)) s)"
echo "=== gpu_keep_weights"; BUILD=build STEPS=3000 timeout 200 bash tests/gpu/gpu_keep_weights.sh 2>&1 | tail -40; echo "($((SECONDS - t0)) s)"
echo "=== test_target_gpu qwen3"; timeout 90 build/gpu/test_target_gpu qwen3 2>&1 | tail -6; echo "($((SECONDS - t0)) s)"
echo "=== bench/restart_gap.sh"; BUILD=build STEPS=150 timeout $((390 - (SECONDS - t0))) bash bench/restart_gap.sh 2>&1 | tail -60
echo "(total $((SECONDS - t0)) s)"
