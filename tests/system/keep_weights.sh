#!/usr/bin/env bash
# How dflashd keeps a cuda target's device weights (issue 20 item 5; the GPU side is tests/gpu/gpu_keep_weights.sh):
# a real dflashd of a job.backend = cuda job and tests/system/keeper_probe speaking keeper_proto as target-0 (a
# memfd stands in for the VMM allocation: dflashd touches no GPU). Nothing is passed before a deposit; the deposit is
# passed back to the next registration; one naming no GPU or coming from an earlier instance is refused; a later
# deposit replaces the earlier one, and dflashd's log says so.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
PROBE=${BUILD:-build}/tests/system/keeper_probe
make_fixture || { fail keep_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
write_config k 10
sed -i -e 's/^seed = 77$/seed = 77\nbackend = cuda/' -e 's/^targets = 2$/targets = 1/' -e 's/^drafters = 2$/drafters = 1/' "$T/k.ini"
mkdir -p "$T/k"
"$BIN/dflashd" -c "$T/k.ini" >"$T/dflashd.log" 2>&1 &
keeper=$!
timeout 60 "$PROBE" -c "$T/k.ini" 2>"$T/probe.err"
rc=$?
[ $rc -eq 0 ] || fail keep_probe "exit $rc: $(tail -3 "$T/probe.err"; tail -3 "$T/dflashd.log")"
if [ "$(grep -c 'target-0 deposited its device weights: 4096 bytes' "$T/dflashd.log")" -eq 2 ] &&
   grep -q 'deposited its device weights: 4096 bytes (replacing the earlier deposit)' "$T/dflashd.log"; then
    ok keep_dflashd_logs_the_replacement
else fail keep_dflashd_logs_the_replacement "$(grep -i weights "$T/dflashd.log")"; fi
kill $keeper 2>/dev/null
wait $keeper
exit $FAILED
