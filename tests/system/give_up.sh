#!/usr/bin/env bash
# When `dflash run` gives up on a job that was running (issue 14, item 5): a shard truncated under a running job
# makes the prefetcher fail every start; the run ends with status 1 and the reason, after the committed state is
# checkpointed (no checkpoint is due before the end: checkpoint_every = 0), so that `--resume` with the shard
# restored finishes the job with every step in the ledger once. Nothing races the job (issue 19, item 14): the
# prefetcher's fault hook DFLASH_FAULT_HOLD_BATCH=40 produces no batch from 40 on, so the job stops at step 20 for
# sure (step k trains batches 2k, 2k+1); once the ledger holds those 20 steps the shard is cut and the prefetcher
# killed, and every start after that finds the cut shard.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
STEPS=60
HOLD=40
make_fixture || { fail give_up_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
mkdir -p "$T/data-live"
cp "$T/data"/*.shard "$T/data-live/"
write_config live $STEPS
sed -i -e "s|^path = .*|path = $T/data-live|" -e 's/^checkpoint_every = .*/checkpoint_every = 0/' "$T/live.ini"

DFLASH_FAULT_HOLD_BATCH=$HOLD "$BIN/dflash" run -c "$T/live.ini" >"$T/live.out" 2>&1 &
sup=$!
# a deadline only so that a broken build fails instead of blocking: the job cannot pass step HOLD/2
deadline=$((SECONDS + 300))
until [ "$(ledger_lines live)" -ge $((HOLD / 2)) ] || [ $SECONDS -ge $deadline ] || ! kill -0 $sup 2>/dev/null; do sleep 0.1; done
f=$(ls "$T/data-live"/*.shard | head -1)
size=$(stat -c %s "$f")
truncate -s $((size / 2)) "$f"
pid=$(awk '$1 == "prefetch" { print $2 }' "$T/live/supervisor.state")
[ -n "$pid" ] && kill -9 "$pid"
deadline=$((SECONDS + 300))
while kill -0 $sup 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
kill -TERM $sup 2>/dev/null
wait $sup
rc=$?
latest=$(readlink "$T/live/ckpt/latest")
committed=$(wc -l <"$T/live/ledger.jsonl")
if [ $rc -eq 1 ] && grep -q "ERROR.*gave up on the job: prefetch failed 8 times in a row.*$f" "$T/live.out"; then
    ok "give_up_exits_1_with_the_reason ($(grep -o "gave up on the job: prefetch failed 8 times in a row before becoming ready ([^)]*)" "$T/live.out"))"
else
    fail give_up_exits_1_with_the_reason "exit $rc: $(tail -3 "$T/live.out")"
fi
if [ "$latest" = "$(printf 'step-%08d' $((HOLD / 2)))" ] && [ "$committed" -eq $((HOLD / 2)) ] &&
    grep -q "the last checkpoint is .*$latest: fix the cause, then \`dflash run --resume\` continues from it" "$T/live.out"; then
    ok "give_up_checkpoints_the_committed_state ($latest, $committed steps in the ledger)"
else
    fail give_up_checkpoints_the_committed_state "latest '$latest', ledger $committed steps: $(tail -2 "$T/live.out")"
fi
cp "$T/data"/*.shard "$T/data-live/"
if run_job live --resume && grep -q "resuming from" "$T/live/logs/dflashd.log"; then ok give_up_resume_finishes
else fail give_up_resume_finishes "$(tail -3 "$T/live.out")"; fi
if msg=$(check_ledger live $STEPS 2); then ok "give_up_ledger_exactly_once ($msg)"; else fail give_up_ledger_exactly_once "$msg"; fi
exit $FAILED
