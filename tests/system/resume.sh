#!/usr/bin/env bash
# Resume: stop a run part-way (SIGTERM to `dflash run`), resume it with --resume, and compare with an
# uninterrupted run: the same ledger (every batch once) and bitwise the same final drafter state.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
STEPS=80
make_fixture || { fail resume_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
write_config clean $STEPS
run_job clean || { fail resume_clean_run "$(tail -5 "$T/clean.out")"; exit 1; }

write_config part $STEPS
"$BIN/dflash" run -c "$T/part.ini" >"$T/part.out" 2>&1 &
sup=$!
deadline=$((SECONDS + 120))
until [ -f "$T/part/ckpt/step-00000020/trainer_state.json" ] || [ $SECONDS -ge $deadline ]; do sleep 0.05; done
kill -TERM $sup
wait $sup
stopped_at=$(wc -l <"$T/part/ledger.jsonl")
if [ "$stopped_at" -lt $STEPS ]; then ok "resume_stopped_part_way (step $stopped_at of $STEPS)"
else fail resume_stopped_part_way "the run finished before it was stopped"; fi
if run_job part --resume; then ok resume_run_completes; else fail resume_run_completes "$(tail -5 "$T/part.out")"; fi
grep -q "resuming from" "$T/part/logs/dflashd.log" && ok resume_started_from_checkpoint ||
    fail resume_started_from_checkpoint "dflashd did not say it resumed"
if msg=$(check_ledger part $STEPS 2); then ok "resume_ledger_exactly_once ($msg)"; else fail resume_ledger_exactly_once "$msg"; fi
if cmp -s "$(final_weights clean)" "$(final_weights part)"; then ok resume_weights_bitwise_identical
else fail resume_weights_bitwise_identical "resumed run differs from the uninterrupted one"; fi
exit $FAILED
