# TIMEOUT=80
# issue 23, run 1: the dense layer's memory-bound kernels before (HEAD~ kernels) / after, their case rows, the
# whole-forward tests of the families that run them, bench_target's time split.
export DFLASH_GOLDENS=tests/goldens
t() { local s=$SECONDS; "$@"; echo "[exit $? after $((SECONDS - s)) s: $*]"; }
echo "build be4d9dd (kernels), scratch_other_before = a920a53 kernels"; nvidia-smi -L
t timeout 10 build/bench/scratch_other_before before
t timeout 10 build/bench/scratch_other_after after
for v in B C; do t timeout 10 build/bench/scratch_other_$v $v; done  # B: rms 2 warps/blk, swiglu 1 vec/thr, qk 1 tok/blk; C: rms 1 warp/blk, swiglu 4, qk 2 tok uncapped regs
o=$(timeout 30 build/gpu/test_kernel_cases_gpu --timing dense_layer_other rmsnorm_forward swiglu_forward "qk_norm_rope bf16" qk_norm_rope_partial 2>&1)
echo "kernel cases: $(grep -c '^ok' <<<"$o") ok, $(grep -c '^FAIL' <<<"$o") FAIL"; grep -E '^FAIL|^timing|^skip|test_kernel_cases_gpu' <<<"$o"
t timeout 25 build/bench/bench_target
for f in qwen3 qwen3_moe gpt_oss; do
  o=$(timeout 30 build/gpu/test_target_gpu $f 2>&1); rc=$?
  echo "test_target_gpu $f: $(grep -c '^ok' <<<"$o") ok, $(grep -c '^FAIL' <<<"$o") FAIL, exit $rc"; grep -E '^FAIL' <<<"$o" | head -20
done
o=$(timeout 20 build/gpu/test_decode_gpu 2>&1); rc=$?
echo "test_decode_gpu: $(grep -c '^ok' <<<"$o") ok, $(grep -c '^FAIL' <<<"$o") FAIL, exit $rc"; grep -E '^FAIL' <<<"$o" | head -20
