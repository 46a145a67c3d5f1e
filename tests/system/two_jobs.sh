#!/usr/bin/env bash
# Two jobs with the same job.name in different run_dirs run side by side under `dflash run`: their shared-memory
# segments differ by the run_dir's hash, and both finish with exact ledgers. While both run (held by a pause), a
# second `dflash run` and a second dflashd on its run_dir are refused with a message naming the live pid and the
# run_dir, and job a still finishes; a `dflash run` on a run_dir whose dflashd runs on its own is refused too, and
# that dflashd stops cleanly on SIGTERM (exit 0, segments kept for a restart to reattach).
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
CTL="$BIN/dflashctl"
STEPS=150
make_fixture || { fail two_jobs_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
for j in a b c; do
    write_config $j $STEPS
    sed -i "s/^name = .*/name = t$$-same/" "$T/$j.ini"
done
segments() { ls /dev/shm 2>/dev/null | grep -c "^dflash-t$$-same-[0-9a-f]\{8\}-$1\$"; }
# wait_for SECONDS CONDITION: poll until CONDITION holds; 1 if the deadline passes first
wait_for() {
    local end=$((SECONDS + $1))
    until eval "$2"; do [ $SECONDS -ge $end ] && return 1; sleep 0.1; done
}
keeper_pid() { awk '$1 == "dflashd" { print $2 }' "$T/$1/supervisor.state" 2>/dev/null; }

"$BIN/dflash" run -c "$T/a.ini" >"$T/a.out" 2>&1 &
supa=$!
"$BIN/dflash" run -c "$T/b.ini" >"$T/b.out" 2>&1 &
supb=$!
# both train side by side; then they hold (pause) so that they are live for everything below
if wait_for 60 '[ "$(ledger_lines a)" -ge 3 ] && [ "$(ledger_lines b)" -ge 3 ]' &&
   "$CTL" -c "$T/a.ini" --wait 60 pause >"$T/pause.out" 2>&1 && "$CTL" -c "$T/b.ini" --wait 60 pause >>"$T/pause.out" 2>&1; then
    ok "two_jobs_both_train (steps $(ledger_lines a) and $(ledger_lines b) when paused)"
else
    fail two_jobs_both_train "ledgers $(ledger_lines a) / $(ledger_lines b): $(tail -3 "$T/a.out"; tail -3 "$T/b.out"; cat "$T/pause.out")"
fi
[ "$(segments state)" = 2 ] && [ "$(segments tokens)" = 2 ] && [ "$(segments pool-1)" = 2 ] &&
    ok "two_jobs_segments_per_run_dir (/dev/shm/dflash-t$$-same-<hash>-*: 2 of each)" ||
    fail two_jobs_segments_per_run_dir "$(ls /dev/shm | grep "dflash-t$$-")"

# a second `dflash run` on a's run_dir: refused before it starts anything, naming the live pid and the run_dir
run_a=$(realpath "$T/a")
keeper=$(keeper_pid a)
"$BIN/dflash" run -c "$T/a.ini" >"$T/second-run.out" 2>&1
rc=$?
if [ $rc = 1 ] && grep -qF "job.run_dir $run_a is in use by dflash run pid $supa" "$T/second-run.out" &&
   [ "$(keeper_pid a)" = "$keeper" ] && kill -0 "$keeper" 2>/dev/null; then
    ok "two_jobs_second_dflash_run_refused ($(head -1 "$T/second-run.out"))"
else
    fail two_jobs_second_dflash_run_refused "exit $rc: $(cat "$T/second-run.out")"
fi
# a second dflashd on a's run_dir: refused the same way, the live one untouched
"$BIN/dflashd" -c "$T/a.ini" >"$T/second-dflashd.out" 2>&1
rc=$?
if [ $rc = 1 ] && grep -qF "job.run_dir $run_a is in use by dflashd pid $keeper" "$T/second-dflashd.out" &&
   kill -0 "$keeper" 2>/dev/null && [ "$(segments state)" = 2 ]; then
    ok "two_jobs_second_dflashd_refused ($(grep -o 'job.run_dir.*' "$T/second-dflashd.out" | head -1))"
else
    fail two_jobs_second_dflashd_refused "exit $rc: $(cat "$T/second-dflashd.out")"
fi
for j in a b; do "$CTL" -c "$T/$j.ini" --wait 60 resume >/dev/null 2>&1 || fail two_jobs_resume "dflashctl resume of $j failed"; done

# both finish, each with every batch exactly once, and leave no segment behind
for j in a b; do
    sup=supa; [ $j = b ] && sup=supb
    late=
    wait_for 240 "! kill -0 \$$sup 2>/dev/null" || { kill -TERM ${!sup} 2>/dev/null; late=" (still running after 240 s)"; }
    wait ${!sup}
    rc=$?
    if [ $rc = 0 ] && msg=$(check_ledger $j $STEPS 2); then ok "two_jobs_${j}_finishes ($msg)"
    else fail two_jobs_${j}_finishes "exit $rc$late: ${msg:-} $(grep -e restarting -e ERROR -e WARN "$T/$j.out" | tail -5; tail -3 "$T/$j.out"; tail -5 "$T/$j/logs/dflashd.log")"; fi
done
[ "$(segments state)" = 0 ] && ok two_jobs_segments_removed || fail two_jobs_segments_removed "$(ls /dev/shm | grep "dflash-t$$-")"

# a dflashd on its own (as under systemd) for run_dir c: `dflash run` there is refused, naming it
"$BIN/dflashd" -c "$T/c.ini" >"$T/c-dflashd.log" 2>&1 &
keeper=$!
wait_for 30 '[ "$(segments state)" = 1 ] && grep -q "created state" "$T/c-dflashd.log"'
"$BIN/dflash" run -c "$T/c.ini" >"$T/c-run.out" 2>&1
rc=$?
if [ $rc = 1 ] && grep -qF "job.run_dir $(realpath "$T/c") is in use by dflashd pid $keeper" "$T/c-run.out" &&
   kill -0 $keeper 2>/dev/null && [ ! -e "$T/c/supervisor.state" ]; then
    ok "two_jobs_dflash_run_refused_beside_dflashd"
else
    fail two_jobs_dflash_run_refused_beside_dflashd "exit $rc: $(cat "$T/c-run.out")"
fi
# SIGTERM: dflashd stops through its clean path, exit 0, and keeps the segments for a restart to reattach
kill -TERM $keeper
wait $keeper
rc=$?
if [ $rc = 0 ] && grep -q "stopping on SIGTERM" "$T/c-dflashd.log" && [ "$(segments state)" = 1 ]; then
    ok "two_jobs_dflashd_sigterm_exit_0 ($(grep -o 'stopping on SIGTERM.*' "$T/c-dflashd.log"))"
else
    fail two_jobs_dflashd_sigterm_exit_0 "exit $rc, $(segments state) state segment(s): $(tail -3 "$T/c-dflashd.log")"
fi
exit $FAILED
