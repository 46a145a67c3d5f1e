#!/usr/bin/env bash
# What an operator reads (issue 14, item 10): dflashctl --help gives every description whole; a setting refused
# because of a --set names the --set, not the INI file; bounds read as plain numbers; dflash-prepare says when
# samples are longer than the job's data.max_batch_tokens (summary and warning) and the prefetcher logs it; --inspect
# says "rejected", not "valid", on stdout for a shard it rejects; `dflashctl config` prints whole numbers plainly; an
# empty control frame is called that; the progress line's ETA is within 80 columns and reads like "7h21m".
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
CTL="$BIN/dflashctl"
PREP="$BIN/dflash-prepare"
make_fixture || { fail operator_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }

# dflashctl --help: the descriptions that run over one line are printed whole
help=$("$CTL" --help)
if echo "$help" | grep -q "^ *returns when the new instance is ready and healthy$" &&
    echo "$help" | grep -q "^ *--json: one JSON object; --watch: refresh every second$" &&
    echo "$help" | grep -q "^ *ready and healthy before the next; training continues throughout$" &&
    [ "$(echo "$help" | awk '{ if (length($0) > 120) n++ } END { print n + 0 }')" = 0 ]; then
    ok operator_ctl_help_whole
else
    fail operator_ctl_help_whole "$(echo "$help" | grep -A1 "^  restart ")"
fi

# settings wrong together because of a --set: the message names the --set; bounds are plain numbers
write_config opset 10
out=$("$BIN/dflash" run -c "$T/opset.ini" --set workers.heartbeat_timeout_sec=0.5 2>&1); rc=$?
if [ $rc -ne 0 ] && echo "$out" | grep -q "^dflash run: --set workers.heartbeat_timeout_sec=0.5: workers.heartbeat_timeout_sec = 0.5 is below" &&
    ! echo "$out" | grep -q "opset.ini"; then
    ok operator_set_error_names_the_set
else
    fail operator_set_error_names_the_set "exit $rc: $out"
fi
out=$("$BIN/dflash" run -c "$T/opset.ini" --set train.steps=0 2>&1)
hc=$("$BIN/dflash" run --help-config 2>&1)
if echo "$out" | grep -q "value 0 out of range \[1, 1073741824\]" && ! echo "$hc" | grep -q "e+0"; then
    ok operator_bounds_plain_numbers
else
    fail operator_bounds_plain_numbers "$out; $(echo "$hc" | grep "e+0" | head -2)"
fi

# samples longer than the job's batch budget: dflash-prepare -c says so in its summary and on stderr
write_config short 4
sed -i 's/^max_batch_tokens = .*/max_batch_tokens = 24/' "$T/short.ini"
"$PREP" -c "$T/short.ini" -o "$T/data-short" "$T/data.jsonl" >"$T/prep.out" 2>"$T/prep.err"; rc=$?
if [ $rc -eq 0 ] && grep -q "^longest sample [0-9]* tokens; [0-9]* samples longer than data.max_batch_tokens = 24 ($T/short.ini): training sees only the first 24 tokens of each" "$T/prep.out" &&
    grep -q "warning: [0-9]* samples longer than data.max_batch_tokens = 24" "$T/prep.err"; then
    ok "operator_prepare_says_samples_are_cut ($(grep "^longest" "$T/prep.out" | cut -c1-80)...)"
else
    fail operator_prepare_says_samples_are_cut "exit $rc: $(cat "$T/prep.out" "$T/prep.err")"
fi
"$PREP" -o "$T/data-plain" "$T/data.jsonl" >"$T/prep2.out" 2>&1
grep -q "^longest sample [0-9]* tokens (a job trains at most data.max_batch_tokens of a sample" "$T/prep2.out" &&
    ok operator_prepare_names_the_longest_sample || fail operator_prepare_names_the_longest_sample "$(cat "$T/prep2.out")"

# --inspect of a shard it rejects: "rejected" on stdout, never "valid"
"$PREP" --inspect --vocab 5 "$T/data" >"$T/insp.out" 2>"$T/insp.err"; rc=$?
if [ $rc -eq 1 ] && grep -q "rejected: token id [0-9]* >= --vocab 5" "$T/insp.out" && ! grep -q "valid" "$T/insp.out" &&
    grep -q "error: .*id [0-9]* >= vocab 5" "$T/insp.err"; then
    ok operator_inspect_rejected_is_not_valid
else
    fail operator_inspect_rejected_is_not_valid "exit $rc: $(cat "$T/insp.out" "$T/insp.err")"
fi

# a running job: the prefetcher's warning, `dflashctl config`, an empty frame, the progress line
write_config live 1000000
sed -i -e 's/^max_batch_tokens = .*/max_batch_tokens = 24/' -e '/^watchdog_sec = /d' "$T/live.ini"
"$BIN/dflash" run -c "$T/live.ini" >"$T/live.out" 2>&1 &
sup=$!
ctl() { "$CTL" -c "$T/live.ini" --wait 60 "$@"; }
deadline=$((SECONDS + 60))
until ctl status 2>/dev/null | grep -q "^step [1-9]" || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
if grep -q "WARN  [0-9]* of 48 samples are longer than data.max_batch_tokens = 24 (the longest: [0-9]* tokens): training sees only their first 24 tokens" "$T/live/logs/prefetch.log"; then
    ok operator_prefetch_logs_cut_samples
else
    fail operator_prefetch_logs_cut_samples "$(head -5 "$T/live/logs/prefetch.log")"
fi
cfg=$(ctl config 2>&1)
if echo "$cfg" | grep -q "^watchdog_sec = 10$" && ! echo "$cfg" | grep -q "e+0"; then ok operator_config_plain_numbers
else fail operator_config_plain_numbers "$(echo "$cfg" | grep -E "watchdog|e\+0")"; fi
out=$("$BIN/../tests/system/ctl_probe" "ipc://$T/live/ctl" empty 2>&1)
if echo "$out" | grep -q "empty frame" && ! echo "$out" | grep -q "protocol version 0"; then ok operator_empty_frame_named
else fail operator_empty_frame_named "$out"; fi
deadline=$((SECONDS + 20)) # not a terminal: the progress line comes every 5 s
# (the first line after a start says "ETA -": no rate is measured before two steps)
until grep -q "status drafter-0: step.*ETA [0-9]" "$T/live.out" || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
line=$(grep -o "drafter-0: step.*ETA [0-9].*" "$T/live.out" | tail -1)
eta=$(echo "$line" | grep -o "ETA [0-9hdm:]*")
if [ -n "$eta" ] && echo "$line" | cut -c1-79 | grep -q "ETA [0-9hdm:]*  " && echo "$eta" | grep -Eq "^ETA ([0-9]+:[0-5][0-9]|[0-9]+h[0-5][0-9]m|[0-9]+d[0-2][0-9]h)$"; then
    ok "operator_progress_eta_within_80_columns ($(echo "$line" | cut -c1-60)...)"
else
    fail operator_progress_eta_within_80_columns "'$line'"
fi
ctl drain >/dev/null 2>&1
wait $sup
exit $FAILED
