#!/usr/bin/env bash
# The evaluation worker (issue 22, item 1): dflash-eval decodes held-out prompts with the drafter of every
# eval.every-th checkpoint and of the last step, as `dflash eval` does (the same loop: its tau and histogram equal
# dflash eval's on the same checkpoint), into eval.jsonl, metrics.jsonl and dflashctl status. Training with it on is
# bitwise the one with it off. SIGKILLed mid-decode (fault hook DFLASH_FAULT_EVAL_HOLD: the evaluation of a given
# step waits after its first prompt, so the kill races nothing), it is restarted and the step is evaluated once;
# meanwhile training runs to its end (no step waits for it), and the job ends once the last step is evaluated.
# A bad prompts file is refused at start, naming the file and line.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
CTL="$BIN/dflashctl"
STEPS=30
make_fixture || { fail eval_worker_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
"$BIN/dflash-demo" make-data -q --target "$T/target" -o "$T/held.jsonl" --samples 6 --answer-len 16 --seed 9 \
    >/dev/null 2>>"$T/fixture.log" || { fail eval_worker_held_out "$(tail -3 "$T/fixture.log")"; exit 1; }
EVAL_INI="[eval]
prompts = $T/held.jsonl
every = 10
limit = 6
max_new_tokens = 16"
write_config off $STEPS
write_config on $STEPS "$EVAL_INI"
write_config kill $STEPS "$EVAL_INI
[control]
metrics_listen = 127.0.0.1:$((20000 + $$ % 20000))
[metrics]
tensorboard = true"

# 1. on and off: the same training, bitwise; eval.jsonl has steps 10, 20, 30 once each
run_job off || { fail eval_worker_off_run "$(tail -3 "$T/off.out")"; exit 1; }
run_job on || { fail eval_worker_on_run "$(tail -3 "$T/on.out")"; exit 1; }
same_training() { # name: its ledger and final weights equal the off run's
    local a
    for a in ledger.jsonl ckpt/step-00000010/optimizer.safetensors ckpt/step-00000030/optimizer.safetensors \
             ckpt/step-00000030/model.safetensors; do
        cmp -s "$T/off/$a" "$T/$1/$a" || { echo "$a differs"; return 1; }
    done
    echo "ledger and weights at steps 10 and 30 identical"
}
if out=$(same_training on); then ok "eval_on_equals_off_bitwise ($out)"; else fail eval_on_equals_off_bitwise "$out"; fi
check_eval_ledger() { # name
    python3 - "$T/$1/eval.jsonl" <<'EOP'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
errs = []
if [l["step"] for l in lines] != [10, 20, 30]: errs.append("steps %s, want [10, 20, 30] once each" % [l["step"] for l in lines])
for l in lines:
    miss = [k for k in ("step", "tau", "histogram", "per_slot", "prompts", "seconds", "speedup") if k not in l]
    if miss: errs.append("step %s lacks %s" % (l.get("step"), miss))
    elif l["prompts"] != 6 or len(l["histogram"]) != 4 or len(l["per_slot"]) != 3 or not 1 <= l["tau"] <= 4:
        errs.append("step %d: prompts %s, histogram %s, per_slot %s, tau %s" % (l["step"], l["prompts"], l["histogram"], l["per_slot"], l["tau"]))
print("; ".join(errs) if errs else "steps 10, 20, 30 once each; tau %s" % ", ".join("%.3f" % l["tau"] for l in lines))
sys.exit(1 if errs else 0)
EOP
}
if out=$(check_eval_ledger on); then ok "eval_jsonl_steps ($out)"; else fail eval_jsonl_steps "$out"; fi
if grep -q "^dflash: acceptance length by decoding 6 held-out prompts (.*eval.jsonl): [0-9.]* (step 10), [0-9.]* (step 20), [0-9.]* (step 30)$" "$T/on.out"; then
    ok "eval_in_summary"
else fail eval_in_summary "$(grep "^dflash:" "$T/on.out")"; fi
# the job waits for the last evaluation and for the worker's own exit (0), then ends
if grep -q "eval-0 (pid [0-9]*) \(finished\|exited with status 0\)" "$T/on.out" && ! grep -q "eval-0 .*killed" "$T/on.out"; then
    ok "eval_worker_ends_by_itself"
else fail eval_worker_ends_by_itself "$(grep "eval-0" "$T/on.out" | tail -2)"; fi

# 2. the same loop as dflash eval: tau and histogram of step 30's checkpoint equal dflash eval's on it
"$BIN/dflash" eval --target "$T/target" --drafter "$T/on/ckpt/step-00000030" --prompts "$T/held.jsonl" --limit 6 \
    --max-new-tokens 16 --json >"$T/cmd.json" 2>"$T/cmd.err" || fail eval_worker_cmd "$(cat "$T/cmd.err")"
if out=$(python3 - "$T/on/eval.jsonl" "$T/cmd.json" <<'EOP'
import json, sys
w = [json.loads(l) for l in open(sys.argv[1]) if json.loads(l)["step"] == 30][0]
c = json.load(open(sys.argv[2]))
same = w["tau"] == c["tau"] and w["histogram"] == c["histogram"] and w["per_slot"] == c["slot_acceptance"]
print("tau %.6f, histogram %s%s" % (w["tau"], w["histogram"], "" if same else "; dflash eval: tau %.6f, histogram %s" % (c["tau"], c["histogram"])))
sys.exit(0 if same else 1)
EOP
); then ok "eval_worker_equals_dflash_eval ($out)"; else fail eval_worker_equals_dflash_eval "$out"; fi
if out=$(python3 - "$T/on/metrics.jsonl" <<'EOP'
import json, sys
ev = [l for l in map(json.loads, open(sys.argv[1])) if "decoded_tau" in l]
print([l["step"] for l in ev]); sys.exit(0 if [l["step"] for l in ev] == [10, 20, 30] else 1)
EOP
); then ok "eval_in_metrics_jsonl (steps $out)"; else fail eval_in_metrics_jsonl "$out"; fi
if grep -q "drafter-0: .*  |  τ [0-9.]* at step 30 (decoded, 6 prompts)" "$T/on.out" &&
    [ "$(grep -c "INFO  eval-0: τ [0-9.]* at step [123]0 (decoded, 6 prompts), speedup" "$T/on.out")" = 3 ]; then
    ok "eval_in_progress_line ($(grep -o "|  τ .*" "$T/on.out" | tail -1); one console line per evaluation)"
else fail eval_in_progress_line "$(grep "status" "$T/on.out" | tail -2)"; fi

# 3. SIGKILL mid-decode: step 20's evaluation holds after its first prompt; training runs to its end meanwhile
echo 20 >"$T/hold"
DFLASH_FAULT_EVAL_HOLD="$T/hold" "$BIN/dflash" run -c "$T/kill.ini" >"$T/kill.out" 2>&1 &
sup=$!
deadline=$((SECONDS + 600)) # a safety net, not a timing assertion
held_pid() { [ -f "$T/hold.step" ] && awk '$1 == 20 { print $2 }' "$T/hold.step"; }
until [ -n "$(held_pid)" ] || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
pid=$(held_pid)
until [ "$(wc -l <"$T/kill/ledger.jsonl" 2>/dev/null)" -ge $STEPS ] || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
if [ -n "$pid" ] && [ "$(wc -l <"$T/kill/ledger.jsonl")" -eq $STEPS ] && kill -0 "$pid" 2>/dev/null; then
    ok "training_never_waits_for_eval (all $STEPS steps committed while the evaluation of step 20 holds)"
else fail training_never_waits_for_eval "held pid '${pid}', $(wc -l <"$T/kill/ledger.jsonl" 2>/dev/null) steps"; fi
"$CTL" -c "$T/kill.ini" status >"$T/status.txt" 2>&1
"$CTL" -c "$T/kill.ini" status --json >"$T/status.json" 2>&1
if grep -q "^τ [0-9.]* at step 10 (decoded, 6 prompts)" "$T/status.txt" && grep -q "^eval-0 *eval " "$T/status.txt" &&
    python3 -c 'import json, sys; e = json.load(open(sys.argv[1]))["eval"]; sys.exit(0 if e["step"] == 10 and e["prompts"] == 6 else 1)' "$T/status.json"; then
    ok "ctl_status_shows_decoded_tau ($(grep "^τ" "$T/status.txt"))"
else fail ctl_status_shows_decoded_tau "$(head -4 "$T/status.txt")"; fi
# a restart asked by the operator while it decodes: the new instance evaluates step 20 again (and holds again)
"$CTL" -c "$T/kill.ini" restart eval-0 >"$T/restart.out" 2>&1
rc=$?
until { p=$(held_pid); [ -n "$p" ] && [ "$p" != "$pid" ]; } || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
p=$(held_pid)
if [ $rc -eq 0 ] && [ -n "$p" ] && [ "$p" != "$pid" ]; then ok "ctl_restart_eval_worker (pid $pid -> $p: $(head -1 "$T/restart.out"))"
else fail ctl_restart_eval_worker "exit $rc: $(cat "$T/restart.out")"; fi
pid=$p
if command -v curl >/dev/null && curl -sf "http://127.0.0.1:$((20000 + $$ % 20000))/metrics" >"$T/metrics.txt" &&
    grep -q "^dflash_decoded_acceptance_length [0-9.]*$" "$T/metrics.txt" && grep -q "^dflash_eval_step 10$" "$T/metrics.txt" &&
    grep -q '^dflash_worker_state{role="eval",worker="eval-0",state="running"} 1$' "$T/metrics.txt" &&
    { ! command -v promtool >/dev/null || promtool check metrics <"$T/metrics.txt" >"$T/promtool.out" 2>&1; }; then
    ok "eval_in_prometheus_metrics ($(grep "^dflash_decoded_acceptance_length" "$T/metrics.txt"))"
else fail eval_in_prometheus_metrics "$(grep "eval\|decoded" "$T/metrics.txt" | head -5) $(cat "$T/promtool.out" 2>/dev/null)"; fi
[ -n "$pid" ] && kill -9 "$pid"
# the restarted instance holds at step 20 again (the file is still there): its line was never written; let it go
until { p=$(held_pid); [ -n "$p" ] && [ "$p" != "$pid" ]; } || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
rm -f "$T/hold"
wait $sup
rc=$?
if [ $rc -eq 0 ] && out=$(check_eval_ledger kill); then ok "eval_killed_mid_decode_evaluates_once (exit 0; $out)"
else fail eval_killed_mid_decode_evaluates_once "exit $rc: $out $(tail -3 "$T/kill.out")"; fi
if grep -q "restarting eval-0 (pid $pid killed by signal 9)" "$T/kill.out" && out=$(same_training kill); then
    ok "training_unaffected_by_eval_kill ($out)"
else fail training_unaffected_by_eval_kill "$(grep "eval-0" "$T/kill.out" | head -3) $out"; fi
ev=("$T"/kill/tensorboard/events.out.tfevents.*)
if "${BUILD:-build}/tests/system/tfevents_dump" "${ev[0]}" >"$T/events.jsonl" 2>"$T/dump.err" && python3 - "$T/events.jsonl" <<'EOP'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
steps = [e["step"] for e in ev if "decoded_tau" in e.get("values", {})]
sys.exit(0 if steps == [10, 20, 30] else 1)
EOP
then ok "eval_in_tensorboard (decoded_tau at steps 10, 20, 30)"
else fail eval_in_tensorboard "$(grep decoded "$T/events.jsonl" | head -3) $(cat "$T/dump.err")"; fi
if cmp -s <(python3 -c 'import json,sys; [print(json.loads(l)["tau"]) for l in open(sys.argv[1])]' "$T/on/eval.jsonl") \
          <(python3 -c 'import json,sys; [print(json.loads(l)["tau"]) for l in open(sys.argv[1])]' "$T/kill/eval.jsonl"); then
    ok "eval_after_kill_same_tau"
else fail eval_after_kill_same_tau "$(cat "$T/on/eval.jsonl" "$T/kill/eval.jsonl" | cut -c1-80)"; fi

# 4. a resumed job goes on after the last evaluated step: 20 steps, then --resume to 30 adds step 30 only
write_config res 20 "$EVAL_INI"
run_job res && run_job res --resume --set train.steps=30
rc=$?
if [ $rc -eq 0 ] && out=$(check_eval_ledger res); then ok "eval_resume_goes_on ($out)"
else fail eval_resume_goes_on "exit $rc: $out $(tail -3 "$T/res.out")"; fi

# 5. a checkpoint that cannot be read is skipped, and the job still ends: step 20's is truncated while its evaluation
# holds, the worker killed; its successor cannot load it, says so and goes on with step 30
write_config skip $STEPS "$EVAL_INI"
echo 20 >"$T/hold"
rm -f "$T/hold.step"
DFLASH_FAULT_EVAL_HOLD="$T/hold" "$BIN/dflash" run -c "$T/skip.ini" >"$T/skip.out" 2>&1 &
sup=$!
deadline=$((SECONDS + 300))
until [ -n "$(held_pid)" ] || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
pid=$(held_pid)
: >"$T/skip/ckpt/step-00000020/model.safetensors"
[ -n "$pid" ] && kill -9 "$pid"
wait $sup
rc=$?
steps=$(python3 -c 'import json, sys; print([json.loads(l)["step"] for l in open(sys.argv[1])])' "$T/skip/eval.jsonl" 2>&1)
if [ $rc -eq 0 ] && [ "$steps" = "[10, 30]" ] && grep -q "evaluation of step 20 failed (skipped" "$T/skip/logs/eval-0.log"; then
    ok "eval_unreadable_checkpoint_skipped (eval.jsonl steps $steps; $(grep -o "evaluation of step 20 failed.*" "$T/skip/logs/eval-0.log" | cut -c1-150))"
else fail eval_unreadable_checkpoint_skipped "exit $rc, steps $steps: $(tail -3 "$T/skip.out")"; fi
rm -f "$T/hold"

# 6. checkpoints that retention removed before they were read are gone past: step 10's evaluation holds while training
# ends keeping only the last checkpoint (train.keep_checkpoints = 1); the worker killed, its successor finds steps
# 10 and 20 gone, says so and evaluates step 30
write_config prune $STEPS "$EVAL_INI"
sed -i 's/^checkpoint_every = 10$/checkpoint_every = 10\nkeep_checkpoints = 1/' "$T/prune.ini"
echo 10 >"$T/hold"
rm -f "$T/hold.step"
held_pid() { [ -f "$T/hold.step" ] && awk -v h="$(cat "$T/hold")" '$1 == h { print $2 }' "$T/hold.step"; }
DFLASH_FAULT_EVAL_HOLD="$T/hold" "$BIN/dflash" run -c "$T/prune.ini" >"$T/prune.out" 2>&1 &
sup=$!
deadline=$((SECONDS + 300))
until [ -n "$(held_pid)" ] || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
pid=$(held_pid)
until [ "$(readlink "$T/prune/ckpt/latest")" = step-00000030 ] && [ ! -e "$T/prune/ckpt/step-00000020" ] ||
      [ $SECONDS -ge $deadline ]; do sleep 0.2; done
[ -n "$pid" ] && kill -9 "$pid"
wait $sup
rc=$?
steps=$(python3 -c 'import json, sys; print([json.loads(l)["step"] for l in open(sys.argv[1])])' "$T/prune/eval.jsonl" 2>&1)
if [ $rc -eq 0 ] && [ "$steps" = "[30]" ] && [ "$(grep -c "no checkpoint of step [12]0 to evaluate" "$T/prune/logs/eval-0.log")" = 2 ]; then
    ok "eval_pruned_checkpoints_gone_past (eval.jsonl steps $steps)"
else fail eval_pruned_checkpoints_gone_past "exit $rc, steps $steps: $(grep "no checkpoint" "$T/prune/logs/eval-0.log"; tail -3 "$T/prune.out")"; fi
rm -f "$T/hold"

# 7. a bad prompts file is refused at start, naming the file and line
printf '{"input_ids": [1, 2, 3]}\n{"input_ids": [1, 2,\n' >"$T/bad.jsonl"
write_config bad 10 "[eval]
prompts = $T/bad.jsonl"
run_job bad
rc=$?
if [ $rc -ne 0 ] && grep -q "bad.jsonl:2: invalid JSON" "$T/bad.out" && [ ! -e "$T/bad/ledger.jsonl" -o ! -s "$T/bad/ledger.jsonl" ]; then
    ok "eval_bad_prompts_refused ($(grep -o "eval.prompts: .*bad.jsonl:2[^(]*" "$T/bad.out" | head -1))"
else fail eval_bad_prompts_refused "exit $rc: $(tail -3 "$T/bad.out")"; fi
write_config every 10 "[eval]
prompts = $T/held.jsonl
every = 15"
run_job every
rc=$?
if [ $rc -ne 0 ] && grep -q "eval.every = 15 is not a multiple of train.checkpoint_every = 10" "$T/every.out"; then
    ok "eval_every_not_a_checkpoint_refused"
else fail eval_every_not_a_checkpoint_refused "exit $rc: $(tail -3 "$T/every.out")"; fi
exit $FAILED
