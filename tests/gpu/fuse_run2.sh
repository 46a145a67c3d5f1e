# TIMEOUT=45
# issue 23, run 2 (build f2c2c06: qk_norm_rope with persistent, prefetching blocks): kernel variants (scratch
# builds), qk_norm_rope's case rows, bench_target, then the whole-forward tests as far as the time goes.
export DFLASH_GOLDENS=tests/goldens
echo "build f2c2c06"
for v in after B C D; do timeout 8 build/bench/scratch_other_$v $v; done
echo "(after: f2c2c06; B: rms 2 warps/blk, swiglu 1 vec/thr, qk 4 tok/blk not persistent; C: rms 1 warp/blk, swiglu 4, qk persistent 1 tok; D: rms 8 warps/blk, qk persistent 4 tok 1 blk/SM)"
o=$(timeout 12 build/gpu/test_kernel_cases_gpu --timing dense_layer_other "qk_norm_rope bf16" qk_norm_rope_partial 2>&1)
echo "kernel cases: $(grep -c '^ok' <<<"$o") ok, $(grep -c '^FAIL' <<<"$o") FAIL"; grep -E '^FAIL|^timing|^skip|test_kernel_cases_gpu' <<<"$o"
timeout 20 build/bench/bench_target
for f in qwen3 gpt_oss qwen3_moe; do
  o=$(timeout 12 build/gpu/test_target_gpu $f 2>&1); rc=$?
  echo "test_target_gpu $f: $(grep -c '^ok' <<<"$o") ok, $(grep -c '^FAIL' <<<"$o") FAIL, exit $rc"; grep -E '^FAIL' <<<"$o" | head -20
done
o=$(timeout 12 build/gpu/test_decode_gpu 2>&1); rc=$?
echo "test_decode_gpu: $(grep -c '^ok' <<<"$o") ok, $(grep -c '^FAIL' <<<"$o") FAIL, exit $rc"; grep -E '^FAIL' <<<"$o" | head -20
