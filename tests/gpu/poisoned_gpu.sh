#!/usr/bin/env bash
# Poisoned weights on the GPU (GPU machine; tests/system/poisoned.sh is the CPU side): a bf16 target with one NaN in a
# q_proj (tests/system/poison.py) makes `dflash-cuda generate --backend cuda` fail naming the weight and its layer (the
# device-side flag on the logits), and a job.backend = cuda job give up, naming the tapped layer and the weight (the
# flag on the taps dflash-target-cuda writes into its slot), without a restart; the clean target's job runs.
# Usage: BUILD=build tests/gpu/poisoned_gpu.sh
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
"$BIN/dflash-demo" make-target "$T/target" --seed 11 --hidden 64 --layers 4 --heads 4 --kv-heads 2 --head-dim 16 \
    --intermediate 128 --vocab 256 --dtype bf16 >/dev/null 2>"$T/fixture.log" &&
"$BIN/dflash-demo" make-data -q --target "$T/target" -o "$T/data.jsonl" --samples 32 --answer-len 24 --seed 5 \
    >/dev/null 2>>"$T/fixture.log" &&
"$BIN/dflash-prepare" -o "$T/data" "$T/data.jsonl" >/dev/null 2>>"$T/fixture.log" ||
    { fail poisoned_gpu_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
Q=model.layers.1.self_attn.q_proj.weight
python3 tests/system/poison.py "$T/target" "$T/bad" $Q 37 || { fail poisoned_gpu_copy; exit 1; }
"$BIN/dflash-cuda" generate --backend cuda --target "$T/bad" --prompts "$T/data.jsonl" -o "$T/bad.jsonl" \
    --max-new-tokens 8 -q >/dev/null 2>"$T/gen.err"
rc=$?
[ $rc -eq 1 ] && grep -q "logits are not finite" "$T/gen.err" && grep -q "weight $Q (layer 1) holds nan" "$T/gen.err" &&
    [ ! -s "$T/bad.jsonl" ] && ok generate_cuda_poisoned_target_fails_naming_the_weight \
    || fail generate_cuda_poisoned_target_fails_naming_the_weight "exit $rc: $(cat "$T/gen.err")"
for m in target bad; do
    write_config $m 6 "[job]
backend = cuda"
    sed -i "s|^model = $T/target\$|model = $T/$m|; s|^targets = 2\$|targets = 1|; s|^drafters = 2\$|drafters = 1|" "$T/$m.ini"
done
run_job target && ok job_cuda_clean_target_runs || fail job_cuda_clean_target_runs "$(grep ERROR "$T/target.out" | head -3)"
run_job bad
rc=$?
[ $rc -eq 1 ] && grep -q "gave up on the job: target-0 exited with status 76" "$T/bad.out" &&
    grep -q "hidden state tapped after layer 1 (tap 1 of 2) is not finite" "$T/bad.out" && grep -q "weight $Q (layer 1)" "$T/bad.out" &&
    ! grep -q "restarting target" "$T/bad.out" \
    && ok job_cuda_poisoned_target_gives_up_naming_layer_and_weight \
    || fail job_cuda_poisoned_target_gives_up_naming_layer_and_weight "exit $rc: $(grep -E 'ERROR|restarting' "$T/bad.out" | head -5)"
exit $FAILED
