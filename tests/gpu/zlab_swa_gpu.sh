#!/usr/bin/env bash
# GPU system test (GPU machine; issue 21): a drafter with a sliding-window layer trained by dflash loads in z-lab's
# current model.py and decodes there -- the DFlash authors' own loop, dflash_generate -- with the tau that dflash eval
# reports. The drafter: swa_eval_gpu.sh's (2 layers, full_attention + sliding_attention with window 3 < block 4,
# trained by a short CPU `dflash run` on tests/system/lib.bash's tiny Qwen3 target), exported as every checkpoint is.
# Decoded three ways on 16 prompts x 32 new tokens: `dflash eval` on the CPU (fp32), and tests/gpu/zlab_decode.py
# (z-lab's DFlashDraftModel.from_pretrained on the checkpoint folder, transformers' Qwen3ForCausalLM on the target,
# fp32 on the GPU) with the drafter's attention honouring the window as model.py asks it to (flash-attention's window
# as transformers' flash_attention_2 applies it, run through eager attention: flash_attn is fp16/bf16 only and may be
# absent), and as model.py decodes without flash_attn (eager/sdpa: the window it passes is ignored).
# Checks: the checkpoint loads with no missing or unexpected tensor; the window reaches the attention (calls with
# windows None and 3); tau (dflash's accounting of the last block, z-lab's own figure printed beside it) within 0.05
# of dflash eval's, and the blocks equal prompt by prompt for at least 14 of 16; without the window z-lab's loop
# decodes other blocks (so the fixture does exercise the window). With flash_attn importable, flash_attention_2 in
# bf16 is also run and its tau printed (not checked: bf16).
# Needs z-lab's dflash/model.py (github.com/z-lab/dflash; run with 44947fb): ZLAB=path/to/dflash/model.py, else
# ./zlab-dflash/dflash/model.py; without it the test says so and exits 77 (skipped).
# Usage: BUILD=build [ZLAB=...] tests/gpu/zlab_swa_gpu.sh   (needs $BUILD/bin/dflash, dflash-demo, dflash-prepare)
cd "$(dirname "$0")/../.." || exit 1
ZLAB=${ZLAB:-zlab-dflash/dflash/model.py}
if [ ! -f "$ZLAB" ]; then
    echo "skipped zlab_swa_gpu: no z-lab model.py at $ZLAB (fetch github.com/z-lab/dflash; ZLAB=.../dflash/model.py)"
    exit 77
fi
. tests/system/lib.bash
# demo_learns.sh's fixture: the repeat target (greedy = the token 4 back) with lib.bash's tiny shape, training and
# held-out data; a drafter [full_attention, sliding_attention] with window 3 < block 4 learns it (held-out tau ~3.4
# after 600 CPU steps; ~3.6 with the same weights and no window)
make_fixture --kind repeat --period 4 &&
"$BIN/dflash-demo" make-data -q --target "$T/target" -o "$T/held.jsonl" --samples 16 --answer-len 24 --seed 9 \
    >/dev/null 2>>"$T/fixture.log" ||
    { fail zlab_swa_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
write_config job 600
sed -i 's/^layers = 1/layers = 2\nlayer_types = full_attention, sliding_attention\nsliding_window = 3/;
        s/^checkpoint_every = .*/checkpoint_every = 0/; s/^lr = .*/lr = 1e-2/; s/^max_anchors = .*/max_anchors = 32/' \
    "$T/job.ini"
run_job job || { fail zlab_swa_job "$(tail -3 "$T/job.out")"; exit 1; }
CK=$T/job/ckpt/latest
N=16 NEW=32
"$BIN/dflash" eval --target "$T/target" --drafter "$CK" --prompts "$T/held.jsonl" --limit $N --max-new-tokens $NEW \
    --json >"$T/dflash.json" 2>"$T/dflash.err" || { fail zlab_swa_dflash_eval "$(tail -3 "$T/dflash.err")"; exit 1; }
timeout 150 python3 tests/gpu/zlab_decode.py --model-py "$ZLAB" --target "$T/target" --drafter "$CK" \
    --prompts "$T/held.jsonl" --limit $N --max-new-tokens $NEW --attn window,eager,flash_attention_2 \
    --out "$T/zlab" >"$T/zlab.out" 2>"$T/zlab.err"
rc=$?
cat "$T/zlab.out"
for attn in window eager; do
    if [ -f "$T/zlab.$attn.json" ] && ! grep -q '"error"' "$T/zlab.$attn.json"; then ok "zlab_swa_decodes_$attn"
    else fail "zlab_swa_decodes_$attn" "exit $rc: $(grep -v '^\s*$' "$T/zlab.err" | tail -4)"; fi
done
python3 - "$T" "$N" <<'EOP'
import json, sys
T, N = sys.argv[1], int(sys.argv[2])
def load(n):
    try: r = json.load(open("%s/%s.json" % (T, n)))
    except Exception as e: return None
    return None if "error" in r else r
d, w, e, f = load("dflash"), load("zlab.window"), load("zlab.eager"), load("zlab.flash_attention_2")
if not d or not w:
    print("FAIL zlab_swa_json: no result from %s" % ("dflash eval" if not d else "z-lab's loop with the window")); sys.exit()
print("zlab: transformers %s, torch %s, %s on %s, drafter attention %s (%s)%s" % (w["transformers"], w["torch"],
      w["dtype"], w["device"], w["attn_implementation"], w["set_by"],
      "; imports put back into modeling_qwen3: %s" % w["shimmed_imports"] if w["shimmed_imports"] else ""))
print("zlab: layer_types %s, sliding_window %s, per-layer windows %s, mask token %s" % (w["layer_types"],
      w["sliding_window"], w["layer_windows"], w["mask_token_id"]))
ok = w["window_calls"] > 0 and "3" in w["windows_seen"] and "None" in w["windows_seen"]
print("%s zlab_swa_window_reaches_attention (%d calls, windows %s)" % ("ok" if ok else "FAIL", w["window_calls"],
      w["windows_seen"]))
dp = {p["line"]: p["accepted"] for p in d["per_prompt"]}
same = sum(1 for p in w["per_prompt"] if dp.get(p["line"]) == p["accepted"])
print("%s zlab_swa_tau_matches_dflash_eval: z-lab's loop %.4f (its own figure, whole last blocks: %.4f), dflash eval "
      "%.4f, |diff| %.4f (<= 0.05)" % ("ok" if abs(w["tau"] - d["tau"]) <= 0.05 else "FAIL", w["tau"], w["tau_zlab"],
      d["tau"], abs(w["tau"] - d["tau"])))
print("%s zlab_swa_blocks_match: %d of %d prompts decode the same blocks (>= %d)" % ("ok" if same >= N - 2 else "FAIL",
      same, len(w["per_prompt"]), N - 2))
for p in w["per_prompt"]:
    if dp.get(p["line"]) != p["accepted"]:
        print("  line %d: z-lab %s, dflash %s" % (p["line"], p["accepted"], dp.get(p["line"])))
if e:
    diff = sum(1 for a, b in zip(w["per_prompt"], e["per_prompt"]) if a["accepted"] != b["accepted"])
    print("%s zlab_swa_window_matters: without the window (what model.py does without flash_attn) tau %.4f, blocks "
          "differ on %d of %d prompts" % ("ok" if diff else "FAIL", e["tau"], diff, len(e["per_prompt"])))
else:
    print("FAIL zlab_swa_window_matters: no result from z-lab's loop on eager attention")
if f and "skipped" in f: print("zlab flash_attention_2: %s" % f["skipped"])
elif f: print("zlab flash_attention_2 (bf16, not checked): tau %.4f (whole last blocks %.4f)" % (f["tau"], f["tau_zlab"]))
else: print("zlab flash_attention_2: no result (not checked)")
EOP
exit $FAILED
