#!/usr/bin/env bash
# GPU training with a hybrid target (GPU machine): dflash run with job.backend = cuda on the qwen35-tiny golden's
# Qwen3.5 target (Gated DeltaNet + gated attention) and on the MoE one, dflash-target-cuda and dflash-drafter-cuda on
# one GPU: the run finishes, every step commits once, the loss falls, and the checkpoint's drafter follows the
# target (hidden 64, vocabulary 512, taps inside its 6 layers). The data come from a Qwen3 demo target of the same
# vocabulary, as in tests/system/hybrid.sh (its CPU twin). Also the qwen35-tiny target rewritten as a
# vision-language checkpoint (every model.* tensor under model.language_model., lm_head top level): the CUDA drafter
# finds its frozen tables there and trains to the same bits as on the plain checkpoint. Then `dflash-cuda eval
# --backend cuda` of each trained drafter on its target (decoding with the hybrid GPU cache: conv histories and
# delta-rule states, a crop after every verified block): every prompt decoded to 20 tokens, the speculative output
# the GPU's own target-only greedy output for at least 3 of 6 prompts (a block step and a one-token step round
# differently, and the goldens' greedy text is very sensitive to rounding: bf16 weights alone flip 8-28% of its
# tokens on the CPU, generate_gpu.sh; test_decode_gpu checks the crop bit for bit), tau within 15% of `dflash eval`
# on the CPU.
# Usage: BUILD=build DFLASH_GOLDENS=tests/goldens tests/gpu/gpu_hybrid_train.sh   (needs the -cuda workers)
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
. tests/gpu/lib.bash
GOLDENS=${DFLASH_GOLDENS:-tests/goldens}
STEPS=${STEPS:-200}

"$BIN/dflash-demo" make-target "$T/datagen" --seed 11 --hidden 32 --layers 2 --heads 4 --kv-heads 2 --head-dim 8 \
    --intermediate 64 --vocab 512 >/dev/null 2>"$T/fixture.log" &&
prepared_data "$T/datagen" "$T/data" ||
    { fail gpu_hybrid_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }

# vl_checkpoint SRC DST: SRC's safetensors with model.* renamed model.language_model.* (the header only)
vl_checkpoint() {
    mkdir -p "$2" && cp "$1/config.json" "$2/" && python3 - "$1/model.safetensors" "$2/model.safetensors" <<'EOP'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h = {("model.language_model." + k[6:] if k.startswith("model.") else k): v for k, v in h.items()}
hb = json.dumps(h).encode()
hb += b" " * (-len(hb) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
EOP
}

# eval_gpu NAME: dflash-cuda eval --backend cuda of NAME's drafter on $T/target against dflash eval on the CPU
eval_gpu() {
    local n=$1
    "$BIN/dflash-demo" make-data -q --target "$T/target" -o "$T/$n.greedy.jsonl" --samples 6 --answer-len 20 --seed 9 \
        >/dev/null 2>"$T/$n.eval.err" || { tail -3 "$T/$n.eval.err"; return 1; }
    local a=(--target "$T/target" --drafter "$T/$n/ckpt/latest" --prompts "$T/$n.greedy.jsonl" --limit 6
             --max-new-tokens 20 --json)
    "$BIN/dflash-cuda" eval "${a[@]}" --backend cuda >"$T/$n.gpu.json" 2>>"$T/$n.eval.err" ||
        { echo "dflash-cuda eval: $(tail -3 "$T/$n.eval.err")"; return 1; }
    "$BIN/dflash" eval "${a[@]}" >"$T/$n.cpu.json" 2>>"$T/$n.eval.err" ||
        { echo "dflash eval: $(tail -3 "$T/$n.eval.err")"; return 1; }
    python3 - "$T/$n.gpu.json" "$T/$n.cpu.json" <<'EOP'
import json, sys
g, c = (json.load(open(p)) for p in sys.argv[1:3])
errs = []
if g["mode"] != "decode" or g["prompts"] != 6: errs.append("mode %s, %d prompts" % (g["mode"], g["prompts"]))
for p in g["per_prompt"]:
    if p["new_tokens"] != 20 or sum(p["accepted"]) + 1 != 20 or not all(1 <= a <= g["block_size"] for a in p["accepted"]):
        errs.append("line %d: %d tokens, blocks %s" % (p["line"], p["new_tokens"], p["accepted"])); break
if g["outputs_differ"] > 3: errs.append("%d of 6 prompts' speculative output differs from greedy" % g["outputs_differ"])
if abs(g["tau"] - c["tau"]) > 0.15 * c["tau"]: errs.append("tau %.4f on the GPU, %.4f on the CPU" % (g["tau"], c["tau"]))
kept = sum(1 < a < g["block_size"] for p in g["per_prompt"] for a in p["accepted"])
print("; ".join(errs) if errs else "tau %.4f (cpu %.4f), %d of 6 outputs differ from greedy, %d blocks kept part of "
      "their draft" % (g["tau"], c["tau"], g["outputs_differ"], kept))
sys.exit(1 if errs else 0)
EOP
}

for c in qwen35-tiny qwen35moe-tiny qwen35-vl; do
    rm -rf "$T/target"
    if [ $c = qwen35-vl ]; then vl_checkpoint "$GOLDENS/qwen35-tiny/target" "$T/target"
    else cp -r "$GOLDENS/$c/target" "$T/target" && chmod -R u+w "$T/target"; fi ||
        { fail "gpu_hybrid_${c}_fixture" "no target at $GOLDENS/$c/target"; continue; }
    gpu_config "$c" train.checkpoint_every=100
    train_checks "gpu_hybrid_$c" "$c" || continue
    if [ $c = qwen35-vl ]; then
        cmp -s "$(final_weights qwen35-tiny)" "$(final_weights $c)" &&
            ok "gpu_hybrid_vision_language_prefix_trains_the_same_bits (model.language_model.* checkpoint)" ||
            fail gpu_hybrid_vision_language_prefix_trains_the_same_bits "the drafter trained on the model.language_model. checkpoint differs from the one on the plain checkpoint"
    elif [ "$BACKEND" = cuda ]; then
        if msg=$(eval_gpu "$c"); then ok "gpu_hybrid_${c}_eval_cuda ($msg)"; else fail "gpu_hybrid_${c}_eval_cuda" "$msg"; fi
    fi
done
exit $FAILED
