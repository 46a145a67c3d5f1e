#!/usr/bin/env bash
# The worker counts have one limit each (JOB_MAX_TARGETS, JOB_MAX_DRAFTERS), checked when the job starts, and every
# count up to it runs (issue 19, item 12): a CPU job with 16 targets and 2 drafters finishes (a drafter's
# registration carries 16 pool fds and its training state: 17 fds, one more than one keeper reply could carry
# before, so drafter-1 never registered and the job hung); 65 targets are refused at start, naming the setting and
# the limit. The run has a deadline only so that a hang fails instead of blocking the suite.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
make_fixture || { fail limits_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
write_config many 6
sed -i -e 's/^targets = .*/targets = 16/' -e 's/^pool_slots = .*/pool_slots = 1/' "$T/many.ini"

timeout 300 "$BIN/dflash" run -c "$T/many.ini" >"$T/many.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && msg=$(check_ledger many 6 2); then ok "sixteen_targets_two_drafters_finish ($msg)"
else fail sixteen_targets_two_drafters_finish "exit $rc: $(grep -h "lost\|refused" "$T/many/logs/"*.log | sort | uniq -c | head -3) $(tail -2 "$T/many.out")"; fi
if ! grep -q "reply.*lost" "$T/many/logs/dflashd.log"; then ok every_registration_reply_delivered
else fail every_registration_reply_delivered "$(grep -m1 "lost" "$T/many/logs/dflashd.log")"; fi

write_config over 6
"$BIN/dflash" run -c "$T/over.ini" --set workers.targets=65 >"$T/over.out" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "workers.targets.*65.*64" "$T/over.out" && [ ! -e "$T/over/ledger.jsonl" ]; then
    ok "sixty_five_targets_refused_at_start ($(grep -o "workers.targets.*" "$T/over.out" | head -1))"
else
    fail sixty_five_targets_refused_at_start "exit $rc: $(tail -2 "$T/over.out")"
fi
exit $FAILED
