#!/usr/bin/env bash
# NaN guard: a batch whose loss is NaN (fault injection: DFLASH_FAULT_NAN_BATCH) makes its step skipped, not
# applied: the ledger line says why, dflashctl status counts it, the weights stay finite and the run goes on with
# every batch still committed exactly once.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
STEPS=300 # long enough (a few seconds) for the status poll below to catch a step past the bad one
BAD=21   # batch 21 = step 10, rank 1
make_fixture || { fail nan_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
write_config nan $STEPS
DFLASH_FAULT_NAN_BATCH=$BAD "$BIN/dflash" run -c "$T/nan.ini" >"$T/nan.out" 2>&1 &
sup=$!
status=""
deadline=$((SECONDS + 120))
while [ $SECONDS -lt $deadline ] && kill -0 $sup 2>/dev/null; do
    s=$("$BIN/dflashctl" -c "$T/nan.ini" --wait 5 status --json 2>/dev/null) || { sleep 0.1; continue; }
    step=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("step", 0))' "$s" 2>/dev/null || echo 0)
    if [ "${step:-0}" -gt 12 ]; then status=$s; break; fi
    sleep 0.1
done
if [ -n "$status" ] && python3 -c 'import json,sys; sys.exit(0 if int(json.loads(sys.argv[1]).get("skipped_steps", 0)) == 1 else 1)' "$status"
then ok nan_status_counts_skipped
else fail nan_status_counts_skipped "status: ${status:-none}"; fi
wait $sup
rc=$?
[ $rc -eq 0 ] && ok nan_run_finishes || fail nan_run_finishes "exit $rc: $(tail -3 "$T/nan.out")"
if msg=$(check_ledger nan $STEPS 2); then ok "nan_ledger_exactly_once ($msg)"; else fail nan_ledger_exactly_once "$msg"; fi
python3 - "$T/nan/ledger.jsonl" $BAD <<'EOP' && ok nan_step_skipped_with_reason || fail nan_step_skipped_with_reason "see $T/nan/ledger.jsonl"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
bad = int(sys.argv[2])
skipped = [l for l in lines if "skipped" in l]
assert len(skipped) == 1, skipped
assert bad in skipped[0]["batches"] and skipped[0]["skipped"] == "loss not finite", skipped[0]
EOP
python3 - "$(final_weights nan)" <<'EOP' && ok nan_weights_finite || fail nan_weights_finite "non-finite master weights"
import json, math, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
a, b = hdr["master"]["data_offsets"]
vals = struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])
sys.exit(0 if all(math.isfinite(v) for v in vals) else 1)
EOP
grep -q "not applied: loss not finite" "$T/nan/logs/drafter-0.log" && ok nan_logged || fail nan_logged "drafter-0 did not log the skip"
exit $FAILED
