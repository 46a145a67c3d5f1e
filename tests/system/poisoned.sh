#!/usr/bin/env bash
# Poisoned weights (issue 19, items 3 and 6): one NaN in a target q_proj (tests/system/poison.py writes the copy) makes
# dflash generate and dflash eval fail naming the weight and its layer, and a job give up (exit 1) with the tapped
# layer and the weight named (the target worker exits JOB_EXIT_FATAL: no restart cures it); a drafter.init with a NaN
# makes every step's loss non-finite, and train.max_skipped_in_a_row such steps end the job with the reason, at a
# checkpoint. The ids a target may not produce: generate's default (the drafter's mask token) is the one eval's greedy
# choice skips, so eval --walk takes generate's output as it is; eval's progress ends with the final count.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
make_fixture || { fail poisoned_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
V=256
Q=model.layers.1.self_attn.q_proj.weight
python3 tests/system/poison.py "$T/target" "$T/bad" $Q 37 || { fail poisoned_copy; exit 1; }

# ---- generate and eval on the poisoned target: exit 1, the weight and its layer named, nothing written ----
"$BIN/dflash" generate --target "$T/bad" --prompts "$T/data.jsonl" -o "$T/bad.jsonl" --max-new-tokens 8 -q \
    >/dev/null 2>"$T/gen.err"
rc=$?
[ $rc -eq 1 ] && grep -q "logits at answer position 0 are not finite" "$T/gen.err" &&
    grep -q "weight $Q (layer 1) holds nan at \[1, 5\]" "$T/gen.err" && [ ! -s "$T/bad.jsonl" ] \
    && ok generate_poisoned_target_fails_naming_the_weight || fail generate_poisoned_target_fails_naming_the_weight "exit $rc: $(cat "$T/gen.err")"

# ---- a job on the poisoned target gives up: the tapped layer and the weight named, exit 1, not 8 restarts ----
write_config tgt 20
sed -i "s|^model = $T/target\$|model = $T/bad|" "$T/tgt.ini"
run_job tgt
rc=$?
[ $rc -eq 1 ] && grep -q "gave up on the job: target-[01] exited with status 76, a failure no restart cures" "$T/tgt.out" &&
    grep -q "hidden state tapped after layer 1 (tap 1 of 2) is not finite" "$T/tgt.out" && grep -q "weight $Q (layer 1)" "$T/tgt.out" &&
    ! grep -q "restarting target" "$T/tgt.out" \
    && ok job_poisoned_target_gives_up_naming_layer_and_weight || fail job_poisoned_target_gives_up_naming_layer_and_weight "exit $rc: $(grep -E 'ERROR|restarting' "$T/tgt.out" | head -5)"

# ---- a short job on the good target: a drafter checkpoint ----
write_config ok 2
run_job ok || { fail poisoned_drafter_fixture "$(tail -3 "$T/ok.out")"; exit 1; }
CK=$T/ok/ckpt/latest

# ---- eval on the poisoned target: exit 1 naming the weight (before any tau is printed) ----
"$BIN/dflash" eval --target "$T/bad" --drafter "$CK" --prompts "$T/data.jsonl" --limit 2 --max-new-tokens 8 \
    >"$T/eval_bad.out" 2>"$T/eval_bad.err"
rc=$?
[ $rc -eq 1 ] && grep -q "not finite: weight $Q (layer 1)" "$T/eval_bad.err" && ! grep -q tau "$T/eval_bad.out" \
    && ok eval_poisoned_target_fails_naming_the_weight || fail eval_poisoned_target_fails_naming_the_weight "exit $rc: $(cat "$T/eval_bad.err")"

# ---- a poisoned drafter.init: every step skipped; train.max_skipped_in_a_row = 3 ends the job with the reason ----
python3 tests/system/poison.py "$CK" "$T/dbad" layers.0.self_attn.q_proj.weight 3 || { fail poisoned_drafter_copy; exit 1; }
write_config skip 40
sed -i "s|^\[drafter\]\$|[drafter]\ninit = $T/dbad|; s|^\[train\]\$|[train]\nmax_skipped_in_a_row = 3|" "$T/skip.ini"
run_job skip
rc=$?
lines=$(wc -l <"$T/skip/ledger.jsonl" 2>/dev/null || echo 0)
[ $rc -eq 1 ] && grep -q "gave up on the job: dflashd exited with status 76" "$T/skip.out" &&
    grep -q "train.max_skipped_in_a_row = 3: steps 0 to 2 were all not applied (the last: loss not finite)" "$T/skip.out" &&
    [ "$lines" -eq 3 ] && [ -d "$T/skip/ckpt/step-00000003" ] && grep -q "ckpt/latest -> step-00000003" "$T/skip.out" \
    && ok job_max_skipped_in_a_row_ends_the_job_with_the_reason || fail job_max_skipped_in_a_row_ends_the_job_with_the_reason "exit $rc, $lines ledger lines: $(grep ERROR "$T/skip.out" | head -3)"
# the setting is in the config table (help, bounds)
"$BIN/dflash" run --help-config 2>&1 | grep -q "train.max_skipped_in_a_row" && ok max_skipped_in_a_row_in_config_help \
    || fail max_skipped_in_a_row_in_config_help

# ---- one rule for the reserved id: generate's default output walks in eval as it is ----
"$BIN/dflash" generate --target "$T/target" --prompts "$T/data.jsonl" -o "$T/gen.jsonl" --max-new-tokens 120 -q \
    >/dev/null 2>&1
"$BIN/dflash" generate --target "$T/target" --prompts "$T/data.jsonl" -o "$T/none.jsonl" --max-new-tokens 120 \
    --suppress none -q >/dev/null 2>&1
d=$(python3 - "$T/gen.jsonl" "$T/none.jsonl" $((V - 1)) <<'EOP'
import json, sys
g = [json.loads(l) for l in open(sys.argv[1])]
n = [json.loads(l) for l in open(sys.argv[2])]
r = int(sys.argv[3])
if len(g) != 48: print("%d lines" % len(g))
elif any(r in l["input_ids"] for l in g): print("a default answer holds the reserved id %d" % r)
elif not any(r in l["input_ids"] for l in n): print("--suppress none never produced %d: the test shows nothing" % r)
EOP
)
"$BIN/dflash" eval --target "$T/target" --drafter "$CK" --prompts "$T/gen.jsonl" --walk --max-new-tokens 120 \
    >"$T/walk.out" 2>"$T/walk.err"
rc=$?
[ -z "$d" ] && [ $rc -eq 0 ] && grep -q 'tau (acceptance length)' "$T/walk.out" && ok eval_walks_generate_default_output \
    || fail eval_walks_generate_default_output "exit $rc: $d $(tail -2 "$T/walk.err")"
# eval's progress (the table's; --json's when one was shown) ends with the final count
[ "$(tail -1 "$T/walk.err")" = "dflash eval: 48/48 prompts" ] && ok eval_progress_shows_final_count \
    || fail eval_progress_shows_final_count "$(tail -2 "$T/walk.err")"
exit $FAILED
