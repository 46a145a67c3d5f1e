#!/usr/bin/env bash
# TIMEOUT=330
# GPU system test (GPU machine): the evaluation worker on a job.backend = cuda job (dflash-eval-cuda decodes on
# GPU 0 beside dflash-target-cuda and dflash-drafter-cuda). Checks: the job with eval on trains bitwise as the job
# with it off; eval.jsonl has every eval.every-th step and the last once (tau and speedup printed); the worker's tau on a
# checkpoint equals `dflash-cuda eval --backend cuda` on it (the same loop); SIGKILLed mid-decode (fault hook
# DFLASH_FAULT_EVAL_HOLD), it is restarted and the step is evaluated once while training runs on; prints the GPU
# memory each process holds while all run.
# Usage: BUILD=build tests/gpu/gpu_eval_worker.sh   (needs $BUILD/bin/* including the -cuda workers)
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
. tests/gpu/lib.bash
STEPS=${STEPS:-400} EVERY=${EVERY:-100} HOLD=${HOLD:-200}
gpu_fixture && "$BIN/dflash-demo" make-data -q --target "$T/target" -o "$T/held.jsonl" --samples 8 --answer-len 32 \
    --seed 9 >/dev/null 2>>"$T/fixture.log" || { fail gpu_eval_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
EVAL_INI=(eval.prompts="$T/held.jsonl" eval.every="$EVERY" eval.limit=8 eval.max_new_tokens=32)
gpu_train_config off train.checkpoint_every="$EVERY"
gpu_train_config on train.checkpoint_every="$EVERY" "${EVAL_INI[@]}"
gpu_train_config kill train.checkpoint_every="$EVERY" "${EVAL_INI[@]}"
t0=$SECONDS
run_job off || { fail gpu_eval_off_run "$(tail -5 "$T/off.out")"; exit 1; }
t1=$SECONDS
run_job on || { fail gpu_eval_on_run "$(tail -5 "$T/on.out"; tail -5 "$T/on/logs/eval-0.log")"; exit 1; }
echo "note: $STEPS steps: $((t1 - t0)) s with eval off, $((SECONDS - t1)) s with it on"
same_training() {
    local a
    for a in ledger.jsonl ckpt/step-$(printf %08d $EVERY)/optimizer.safetensors ckpt/step-$(printf %08d $STEPS)/optimizer.safetensors; do
        cmp -s "$T/off/$a" "$T/$1/$a" || { echo "$a differs"; return 1; }
    done
    echo "ledger and weights identical"
}
if out=$(same_training on); then ok "gpu_eval_on_equals_off_bitwise ($out)"; else fail gpu_eval_on_equals_off_bitwise "$out"; fi
check_eval() {
    python3 - "$T/$1/eval.jsonl" "$STEPS" "$EVERY" <<'EOP'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
want = list(range(int(sys.argv[3]), int(sys.argv[2]) + 1, int(sys.argv[3])))
steps = [l["step"] for l in lines]
print("steps %s, tau %s, speedup %s" % (steps, " ".join("%.3f" % l["tau"] for l in lines), " ".join("%.2f" % l["speedup"] for l in lines)))
sys.exit(0 if steps == want and all(l["prompts"] == 8 for l in lines) else 1)
EOP
}
if out=$(check_eval on); then ok "gpu_eval_jsonl ($out)"; else fail gpu_eval_jsonl "$out"; fi
last=$T/on/ckpt/step-$(printf %08d $STEPS)
"$BIN/dflash-cuda" eval --backend "$BACKEND" --target "$T/target" --drafter "$last" --prompts "$T/held.jsonl" \
    --limit 8 --max-new-tokens 32 --json >"$T/cmd.json" 2>"$T/cmd.err" || fail gpu_eval_cmd "$(tail -3 "$T/cmd.err")"
if out=$(python3 - "$T/on/eval.jsonl" "$T/cmd.json" <<'EOP'
import json, sys
w = [json.loads(l) for l in open(sys.argv[1])][-1]
c = json.load(open(sys.argv[2]))
print("worker tau %.6f %s, dflash eval tau %.6f %s" % (w["tau"], w["histogram"], c["tau"], c["histogram"]))
sys.exit(0 if w["tau"] == c["tau"] and w["histogram"] == c["histogram"] else 1)
EOP
); then ok "gpu_eval_worker_equals_dflash_eval ($out)"; else fail gpu_eval_worker_equals_dflash_eval "$out"; fi

# SIGKILL mid-decode: the evaluation of step $HOLD holds after its first prompt; training goes on to the end
echo $HOLD >"$T/hold"
DFLASH_FAULT_EVAL_HOLD="$T/hold" "$BIN/dflash" run -c "$T/kill.ini" >"$T/kill.out" 2>&1 &
sup=$!
deadline=$((SECONDS + 200))
held_pid() { [ -f "$T/hold.step" ] && awk -v h=$HOLD '$1 == h { print $2 }' "$T/hold.step"; }
until [ -n "$(held_pid)" ] || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
pid=$(held_pid)
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>&1 | sed 's/^/note: gpu memory: /'
wait_step kill $STEPS
if [ -n "$pid" ] && [ "$(ledger_lines kill)" -eq $STEPS ]; then
    ok "gpu_training_never_waits_for_eval (all $STEPS steps while the evaluation of step $HOLD holds)"
else fail gpu_training_never_waits_for_eval "held pid '$pid', $(ledger_lines kill) steps"; fi
[ -n "$pid" ] && kill -9 "$pid"
until { p=$(held_pid); [ -n "$p" ] && [ "$p" != "$pid" ]; } || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
rm -f "$T/hold"
wait $sup
rc=$?
if [ $rc -eq 0 ] && out=$(check_eval kill) && out2=$(same_training kill); then
    ok "gpu_eval_killed_mid_decode_evaluates_once ($out; $out2)"
else fail gpu_eval_killed_mid_decode_evaluates_once "exit $rc: $out $out2 $(tail -3 "$T/kill.out")"; fi
[ $FAILED -eq 0 ] || { echo "--- eval-0.log"; tail -20 "$T/on/logs/eval-0.log" "$T/kill/logs/eval-0.log" 2>/dev/null; }
exit $FAILED
