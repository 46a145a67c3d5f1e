#!/usr/bin/env bash
# GPU system test (GPU machine): a drafter with a sliding-window layer (window 3 < block 4, trained by a short CPU
# `dflash run` as tests/system/swa.sh) decoded by `dflash-cuda eval --backend cuda` (drafter_cuda's inference forward,
# dflash_attention_forward_cuda with the window) against `dflash eval` on the CPU: every prompt decoded to 24 tokens
# with blocks that commit them all, at most 3 of 8 outputs off the GPU's own greedy (bf16 near-ties), tau within 15%
# of the CPU's, and the window changes the GPU's blocks as it does the CPU's (same weights, window dropped).
# Usage: BUILD=build tests/gpu/swa_eval_gpu.sh   (needs $BUILD/bin/dflash, dflash-cuda, dflash-demo, dflash-prepare)
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
make_fixture || { fail swa_eval_gpu_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
write_config job 300
sed -i 's/^layers = 1/layers = 2\nlayer_types = full_attention, sliding_attention\nsliding_window = 3/;
        s/^checkpoint_every = .*/checkpoint_every = 0/; s/^lr = .*/lr = 1e-2/' "$T/job.ini"
run_job job || { fail swa_eval_gpu_job "$(tail -3 "$T/job.out")"; exit 1; }
CK=$T/job/ckpt/latest
mkdir -p "$T/nowin" && cp "$CK/model.safetensors" "$T/nowin/" &&
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["use_sliding_window"]=False; json.dump(c, open(sys.argv[2],"w"))' \
    "$CK/config.json" "$T/nowin/config.json"
ARGS=(--target "$T/target" --prompts "$T/data.jsonl" --limit 8 --max-new-tokens 24 --json)
"$BIN/dflash" eval "${ARGS[@]}" --drafter "$CK" >"$T/cpu.json" 2>"$T/cpu.err" || fail swa_eval_gpu_cpu "$(cat "$T/cpu.err")"
for w in win nowin; do
    d=$CK; [ $w = nowin ] && d=$T/nowin
    "$BIN/dflash-cuda" eval "${ARGS[@]}" --drafter "$d" --backend cuda >"$T/gpu.$w.json" 2>"$T/gpu.$w.err"
    rc=$?
    [ $rc -eq 0 ] && ok "swa_eval_gpu_runs_$w" || fail "swa_eval_gpu_runs_$w" "exit $rc: $(tail -3 "$T/gpu.$w.err")"
done
python3 - "$T" <<'EOP'
import json, sys
T = sys.argv[1]
try: c, g, n = (json.load(open("%s/%s.json" % (T, x))) for x in ("cpu", "gpu.win", "gpu.nowin"))
except Exception as e: print("FAIL swa_eval_gpu_json: %s" % e); sys.exit()
errs = []
for p in g["per_prompt"]:
    if p["new_tokens"] != 24 or sum(p["accepted"]) + 1 != 24: errs.append("line %d: blocks %s" % (p["line"], p["accepted"])); break
if g["outputs_differ"] > 3: errs.append("%d of 8 outputs differ from the GPU's greedy" % g["outputs_differ"])
print(("FAIL swa_eval_gpu_blocks: " + "; ".join(errs)) if errs else
      "ok swa_eval_gpu_blocks (tau %.4f on the GPU, %.4f on the CPU; %d of 8 outputs differ from greedy)"
      % (g["tau"], c["tau"], g["outputs_differ"]))
print("%s swa_eval_gpu_tau_near_cpu: %.4f vs %.4f (within 15%%)" % ("ok" if abs(g["tau"] - c["tau"]) <= 0.15 * c["tau"] else "FAIL", g["tau"], c["tau"]))
same = [p["accepted"] for p in g["per_prompt"]] == [p["accepted"] for p in n["per_prompt"]]
print("%s swa_eval_gpu_window_applied: tau %.4f with the window, %.4f without (blocks %s)"
      % ("FAIL" if same else "ok", g["tau"], n["tau"], "identical" if same else "differ"))
EOP
exit $FAILED
