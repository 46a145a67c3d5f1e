#!/usr/bin/env bash
# Chaos: during a training run, SIGKILL randomly chosen processes of every role (dflashd included) at random
# moments. The run must complete, the ledger must show every batch committed exactly once, and the final drafter
# state must be bitwise identical to a run of the same job without kills. The chaos run also has an evaluation
# worker (eval-0, among the victims; the clean run has none): each evaluated step is in eval.jsonl once.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
STEPS=${CHAOS_STEPS:-600}
KILLS=${CHAOS_KILLS:-24}
make_fixture || { fail chaos_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }

write_config clean "$STEPS"
if run_job clean; then ok chaos_clean_run; else fail chaos_clean_run "$(tail -5 "$T/clean.out")"; exit 1; fi

"$BIN/dflash-demo" make-data -q --target "$T/target" -o "$T/held.jsonl" --samples 4 --answer-len 16 --seed 9 \
    >/dev/null 2>>"$T/fixture.log" || { fail chaos_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
write_config chaos "$STEPS" "[eval]
prompts = $T/held.jsonl
every = 50
max_new_tokens = 16"
"$BIN/dflash" run -c "$T/chaos.ini" >"$T/chaos.out" 2>&1 &
sup=$!
declare -A killed=()
n=0
RANDOM=4242
deadline=$((SECONDS + 300))
while kill -0 $sup 2>/dev/null && [ $n -lt $KILLS ] && [ $SECONDS -lt $deadline ]; do
    sleep "0.$((RANDOM % 3))$((RANDOM % 10 + 1))"
    state="$T/chaos/supervisor.state"
    [ -f "$state" ] || continue
    # every role gets its turn first, then random choices
    roles=(dflashd prefetch target-0 target-1 drafter-0 drafter-1 eval-0)
    if [ $n -lt ${#roles[@]} ]; then victim=${roles[$n]}; else victim=${roles[$((RANDOM % ${#roles[@]}))]}; fi
    pid=$(awk -v v="$victim" '$1 == v && $2 > 0 {print $2}' "$state")
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || continue
    kill -9 "$pid" 2>/dev/null || continue
    n=$((n + 1))
    killed[$victim]=$(( ${killed[$victim]:-0} + 1 ))
done
wait $sup
rc=$?
summary=""
for r in "${!killed[@]}"; do summary+="$r=${killed[$r]} "; done
echo "chaos: $n processes killed ($summary)"
if [ $rc -eq 0 ]; then ok chaos_run_completes; else fail chaos_run_completes "dflash run exited $rc: $(tail -5 "$T/chaos.out")"; fi
if [ $n -ge 20 ] && [ ${#killed[@]} -eq 7 ]; then ok chaos_kills_every_role_20_times
else fail chaos_kills_every_role_20_times "only $n kills ($summary): the run finished too soon"; fi
if msg=$(check_ledger chaos "$STEPS" 2); then ok "chaos_ledger_exactly_once ($msg)"; else fail chaos_ledger_exactly_once "$msg"; fi
if cmp -s "$(final_weights clean)" "$(final_weights chaos)" &&
   cmp -s "$T/clean/ckpt/latest/model.safetensors" "$T/chaos/ckpt/latest/model.safetensors"; then
    ok chaos_weights_bitwise_identical
else
    fail chaos_weights_bitwise_identical "final state differs from the run without kills"
fi
if out=$(python3 - "$T/chaos/eval.jsonl" "$STEPS" <<'EOP'
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1])]
want = list(range(50, int(sys.argv[2]) + 1, 50))
print("%d steps evaluated" % len(steps) if steps == want else "steps %s, want %s" % (steps, want))
sys.exit(0 if steps == want else 1)
EOP
); then ok "chaos_eval_each_step_once ($out)"; else fail chaos_eval_each_step_once "$out"; fi
exit $FAILED
