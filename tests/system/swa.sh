#!/usr/bin/env bash
# Drafter sliding-window layers end to end on the CPU (issue 21 item 3): a job whose drafter has a sliding layer of a
# window shorter than the block (drafter.layer_types, drafter.sliding_window) trains, its checkpoint's config.json
# carries layer_types, use_sliding_window, sliding_window and is_causal false (what z-lab's model.py reads), `dflash
# eval` reads that drafter back and decodes exactly the target's greedy tokens with it (decode and walk agree block by
# block), and the window changes what the drafter proposes (the same weights with the window dropped give other
# blocks). Refused at start, naming the setting: layer_types not one per layer, an unknown layer type, sliding layers
# without a window. eval refuses a drafter whose config would make z-lab's sliding layers causal.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
make_fixture || { fail swa_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }

i=0
for bad in "drafter.layer_types=sliding:drafter.layer_types has 1 entries, drafter.layers = 2: one per layer" \
           "drafter.layer_types=full,local:drafter.layer_types: entry 2 is \"local\"" \
           "drafter.sliding_window=0:names 1 sliding_attention layer and drafter.sliding_window = 0"; do
    set_arg=${bad%%:*} want=${bad#*:} i=$((i + 1))
    write_config bad 5
    sed -i 's/^layers = 1/layers = 2\nlayer_types = full, sliding\nsliding_window = 3/' "$T/bad.ini"
    "$BIN/dflash" run -c "$T/bad.ini" --set "$set_arg" >"$T/bad.out" 2>&1
    rc=$?
    [ $rc -eq 1 ] && grep -qF -- "$want" "$T/bad.out" && [ ! -e "$T/bad/ledger.jsonl" ] && ok "swa_refused_$i ${set_arg%%=*}" ||
        fail "swa_refused_$i ${set_arg%%=*}" "exit $rc: $(tail -2 "$T/bad.out")"
done

write_config job 120
sed -i 's/^layers = 1/layers = 2\nlayer_types = full_attention, sliding_attention\nsliding_window = 3/;
        s/^checkpoint_every = .*/checkpoint_every = 0/; s/^lr = .*/lr = 1e-2/' "$T/job.ini"
run_job job || { fail swa_job "$(tail -3 "$T/job.out")"; exit 1; }
CK=$T/job/ckpt/latest
python3 - "$CK/config.json" <<'EOF' && ok swa_config_exported || fail swa_config_exported "$(cat "$CK/config.json")"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["layer_types"] == ["full_attention", "sliding_attention"], c["layer_types"]
assert c["use_sliding_window"] is True and c["sliding_window"] == 3 and c["is_causal"] is False, c
EOF

ARGS=(--target "$T/target" --prompts "$T/data.jsonl" --limit 8 --max-new-tokens 24 --json)
"$BIN/dflash" eval "${ARGS[@]}" --drafter "$CK" >"$T/decode.json" 2>"$T/decode.err" &&
"$BIN/dflash" eval "${ARGS[@]}" --drafter "$CK" --walk >"$T/walk.json" 2>"$T/walk.err" ||
    { fail swa_eval_runs "$(cat "$T/decode.err" "$T/walk.err")"; exit 1; }
# the same weights with the window dropped (transformers' reading of use_sliding_window false: a full layer)
mkdir -p "$T/nowin" && cp "$CK/model.safetensors" "$T/nowin/" &&
python3 - "$CK/config.json" "$T/nowin/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1])); c["use_sliding_window"] = False
json.dump(c, open(sys.argv[2], "w"), indent=2)
EOF
"$BIN/dflash" eval "${ARGS[@]}" --drafter "$T/nowin" --walk >"$T/nowin.json" 2>"$T/nowin.err" ||
    fail swa_eval_nowin_runs "$(cat "$T/nowin.err")"
python3 - "$T/decode.json" "$T/walk.json" "$T/nowin.json" <<'EOF'
import json, sys
d, w, n = (json.load(open(p)) for p in sys.argv[1:4])
errs = []
if d["outputs_differ"] != 0: errs.append("%d prompts' speculative output differs from greedy" % d["outputs_differ"])
if [p["accepted"] for p in d["per_prompt"]] != [p["accepted"] for p in w["per_prompt"]]: errs.append("decode and walk differ")
print(("FAIL swa_eval_decodes: " + "; ".join(errs)) if errs else
      "ok swa_eval_decodes (tau %.4f; decode = greedy, = walk)" % d["tau"])
same = [p["accepted"] for p in w["per_prompt"]] == [p["accepted"] for p in n["per_prompt"]]
print("%s swa_window_applied_at_inference: tau %.4f with the window, %.4f without (blocks %s)"
      % ("FAIL" if same else "ok", w["tau"], n["tau"], "identical" if same else "differ"))
EOF

# z-lab's model.py makes sliding layers causal unless is_causal is false: such a drafter is refused, naming it
mkdir -p "$T/causal" && cp "$CK/model.safetensors" "$T/causal/" &&
python3 - "$CK/config.json" "$T/causal/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1])); del c["is_causal"]
json.dump(c, open(sys.argv[2], "w"), indent=2)
EOF
"$BIN/dflash" eval "${ARGS[@]}" --drafter "$T/causal" >/dev/null 2>"$T/causal.err"
rc=$?
[ $rc -eq 1 ] && grep -q "causal/config.json: field is_causal: absent with sliding_attention layers" "$T/causal.err" &&
    ok swa_eval_refuses_causal || fail swa_eval_refuses_causal "exit $rc: $(cat "$T/causal.err")"

# A resume keeps the drafter's windows: the same parameters with another window are another model (identity.json).
"$BIN/dflash" run -c "$T/job.ini" --resume --set train.steps=130 --set drafter.sliding_window=2 >"$T/rewin.out" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -qF "mismatch of the drafter shape" "$T/rewin.out" &&
   grep -qF "attention layer_types full_attention, sliding_attention, sliding_window 3" "$T/rewin.out" &&
   grep -qF "sliding_window 2 (resume with" "$T/rewin.out"; then
    ok swa_resume_with_another_window_refused
else
    fail swa_resume_with_another_window_refused "exit $rc: $(tail -2 "$T/rewin.out")"
fi
exit $FAILED
