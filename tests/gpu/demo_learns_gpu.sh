#!/usr/bin/env bash
# GPU system test (GPU machine): the demo's learnable target (dflash-demo make-target --kind repeat, the shape of
# `make run`'s, bf16) on the GPU. Its greedy continuation by dflash-cuda generate --backend cuda is the token 8
# positions back (the rule survives bf16); a backend = cuda job with the demo's drafter settings trains on its
# self-distilled data, and held-out tau by decoding on the GPU (dflash-cuda eval --backend cuda) rises from the
# untrained drafter's (~1) to >= 2.5; dflash plot draws the run.
# Usage: BUILD=build tests/gpu/demo_learns_gpu.sh   (needs $BUILD/bin/* including the -cuda builds)
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
. tests/gpu/lib.bash
STEPS=${STEPS:-150}

"$BIN/dflash-demo" make-target "$T/target" --kind repeat --seed 7 --dtype bf16 >/dev/null 2>"$T/fixture.log" &&
prepared_data "$T/target" "$T/data" --samples 256 --seed 7 &&
"$BIN/dflash-demo" make-data -q --target "$T/target" -o "$T/held.jsonl" --samples 32 --seed 8 \
    >/dev/null 2>>"$T/fixture.log" ||
    { fail demo_gpu_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }

# the target's greedy continuation on the GPU: every generated token is the token 8 back
"$BIN/dflash-cuda" generate --backend "$BACKEND" --target "$T/target" --prompts "$T/held.jsonl" -o "$T/gen.jsonl" \
    --max-new-tokens 48 >/dev/null 2>"$T/gen.err" || { fail demo_gpu_generate "$(tail -3 "$T/gen.err")"; }
out=$(python3 - "$T/gen.jsonl" <<'EOP'
import json, sys
n = bad = 0
for line in open(sys.argv[1]):
    r = json.loads(line)
    ids, mask = r["input_ids"], r["loss_mask"]
    for t in range(len(ids)):
        if mask[t]: n += 1; bad += ids[t] != ids[t - 8]
print("%d of %d generated tokens are not the token 8 back" % (bad, n))
sys.exit(1 if bad or not n else 0)
EOP
) && ok "demo_gpu_greedy_repeats ($out)" || fail demo_gpu_greedy_repeats "$out"

# deploy/demo.ini's job on one device
demo_config job "$STEPS" "${ONE_DEVICE[@]}" train.checkpoint_every=50
run_job job || { fail demo_gpu_job "$(tail -5 "$T/job.out")"; exit 1; }
ok demo_gpu_job
tau() {
    "$BIN/dflash-cuda" eval --backend "$BACKEND" --target "$T/target" --drafter "$T/job/ckpt/latest" \
        --prompts "$T/held.jsonl" --limit 32 --max-new-tokens 48 --json "$@" 2>>"$T/eval.err" |
        python3 -c 'import json, sys; r = json.load(sys.stdin); print("%.4f %.2f" % (r["tau"], r["speedup"]))'
}
u=$(tau --untrained) && t=$(tau) || { fail demo_gpu_eval "$(tail -3 "$T/eval.err")"; exit 1; }
echo "# GPU, held-out tau (speedup): untrained $u -> trained $t after $STEPS steps; $(grep -i simulated "$T/job.out" | head -1)"
if python3 -c "import sys; u, t = float('${u% *}'), float('${t% *}'); sys.exit(0 if u < 1.3 and t >= 2.5 else 1)"; then
    ok demo_gpu_held_out_tau_rises
else fail demo_gpu_held_out_tau_rises "untrained $u, trained $t"; fi
"$BIN/dflash" plot "$T/job" -o "$T/plot.svg" >/dev/null 2>"$T/plot.err" && ok demo_gpu_plot ||
    fail demo_gpu_plot "$(cat "$T/plot.err")"
exit $FAILED
