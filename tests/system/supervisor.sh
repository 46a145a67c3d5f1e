#!/usr/bin/env bash
# `dflash run` end to end with fake workers (tests/system/fake_worker.c linked as dflashd, dflash-prefetch,
# dflash-target, dflash-drafter): every child starts; a SIGKILLed target restarts alone; a SIGKILLed dflashd gets its
# stored memfd back intact; a dflashd that exits 0 on SIGTERM without finishing the job is started again (and gets
# its memfd back); a worker that stops pinging the watchdog is killed and restarted; `finish` makes dflashd say
# X_DFLASH_FINISHED=1 and exit 0, and `dflash run` exit 0 with no child left; SIGTERM to `dflash run` stops everything (exit 143); a dflashd
# that never gets ready fails the run; a missing config, a missing binary, a busy run_dir and usage errors fail. Run from the repo root; expects ${BUILD:-build}/bin/dflash and
# ${BUILD:-build}/tests/system/fake_worker. Waits are polls with a deadline, never fixed sleeps.
set -u
BUILD=${BUILD:-build}
DFLASH=$BUILD/bin/dflash
FAKE=$BUILD/tests/system/fake_worker
fails=0
ok() { echo "ok $1"; }
fail() { echo "FAIL $1${2:+: $2}"; fails=$((fails + 1)); }
check() { # name, condition (evaluated), detail on failure
    if eval "$2"; then ok "$1"; else fail "$1" "${3:-}"; fi
}
# wait_for SECONDS CONDITION: poll every 50 ms until CONDITION holds; 1 if the deadline passes first.
wait_for() {
    local end=$((SECONDS + $1))
    while ! eval "$2"; do
        [ "$SECONDS" -ge "$end" ] && return 1
        sleep 0.05
    done
    return 0
}

for f in "$DFLASH" "$FAKE"; do
    if [ ! -x "$f" ]; then
        fail supervisor_binaries "$f not found (build it first)"
        exit 1
    fi
done
ulimit -c 0
tmp=$(mktemp -d /tmp/dflash-sup-XXXXXX)
sup_pid=
cleanup() {
    [ -n "$sup_pid" ] && kill -9 "$sup_pid" 2>/dev/null
    for r in "$tmp"/run*; do
        [ -f "$r/supervisor.state" ] || continue
        while read -r _ p _; do [ "$p" -gt 0 ] 2>/dev/null && kill -9 "$p" 2>/dev/null; done <"$r/supervisor.state"
    done
    rm -rf "$tmp"
}
trap cleanup EXIT

bin=$tmp/bin
mkdir -p "$bin"
fake_abs=$(cd "$(dirname "$FAKE")" && pwd)/$(basename "$FAKE")
dflash_abs=$(cd "$(dirname "$DFLASH")" && pwd)/$(basename "$DFLASH")
for b in dflashd dflash-prefetch dflash-target dflash-drafter; do ln -s "$fake_abs" "$bin/$b"; done

run=$tmp/run
cat >"$tmp/job.ini" <<EOF
[job]
name = sup-test-$$
run_dir = $run
EOF
ALL="dflashd prefetch target-0 target-1 drafter-0 drafter-1"
state() { cat "$run/supervisor.state" 2>/dev/null; }
pid_of() { state | awk -v n="$1" '$1 == n { print $2 }'; }
field_of() { state | awk -v n="$1" -v f="$2" '$1 == n { print $f }'; }
all_ready() {
    local n
    for n in $ALL; do [ "$(field_of "$n" 4)" = ready ] || return 1; done
}

# ---- usage errors ----
"$DFLASH" run -c "$tmp/job.ini" --bogus >"$tmp/out" 2>&1
rc=$?
check supervisor_unknown_option_exit_2 '[ "$rc" -eq 2 ] && grep -q -- "--bogus" "$tmp/out"' "exit $rc: $(cat "$tmp/out")"
"$DFLASH" run >"$tmp/out" 2>&1
rc=$?
check supervisor_missing_c_exit_2 '[ "$rc" -eq 2 ]' "exit $rc: $(cat "$tmp/out")"
"$DFLASH" frobnicate >"$tmp/out" 2>&1
rc=$?
check supervisor_unknown_command_exit_2 '[ "$rc" -eq 2 ]' "exit $rc: $(cat "$tmp/out")"
"$DFLASH" run --help >"$tmp/out" 2>&1
rc=$?
check supervisor_help '[ "$rc" -eq 0 ] && grep -q "usage: dflash run -c FILE" "$tmp/out"' "exit $rc: $(cat "$tmp/out")"
"$DFLASH" run -c "$tmp/missing.ini" --bin-dir "$bin" >"$tmp/out" 2>&1
rc=$?
check supervisor_missing_config '[ "$rc" -ne 0 ] && [ "$rc" -ne 2 ] && grep -q "$tmp/missing.ini" "$tmp/out"' \
    "exit $rc: $(cat "$tmp/out")"
"$DFLASH" run -c "$tmp/job.ini" --bin-dir "$tmp/nowhere" >"$tmp/out" 2>&1
rc=$?
check supervisor_missing_binary '[ "$rc" -eq 1 ] && grep -q "$tmp/nowhere/dflashd" "$tmp/out"' \
    "exit $rc: $(cat "$tmp/out")"

# ---- a full run ----
(cd "$tmp" && exec "$dflash_abs" run -c job.ini --set workers.watchdog_sec=1 --bin-dir "$bin") \
    >"$tmp/sup.out" 2>"$tmp/sup.err" &
sup_pid=$!
started_all() {
    local n
    for n in $ALL; do grep -q "^$n start " "$run/events" 2>/dev/null || return 1; done
}
wait_for 15 'started_all && all_ready'
check supervisor_starts_all 'started_all && all_ready' "state: $(state) | $(tail -5 "$tmp/sup.err")"
check supervisor_dflashd_first '[ "$(head -1 "$run/events" | cut -d" " -f1)" = dflashd ]' "$(cat "$run/events")"
check supervisor_logs_per_child '[ -f "$run/logs/dflashd.log" ] && [ -f "$run/logs/drafter-1.log" ]' \
    "$(ls "$run/logs")"

"$DFLASH" run -c "$tmp/job.ini" --bin-dir "$bin" >"$tmp/out" 2>&1
rc=$?
check supervisor_run_dir_locked '[ "$rc" -eq 1 ] && grep -q "is in use by dflash run pid $sup_pid" "$tmp/out"' \
    "exit $rc: $(cat "$tmp/out")"

# SIGKILL target-1: it alone restarts.
declare -A before
for n in $ALL; do before[$n]=$(pid_of "$n"); done
kill -9 "${before[target-1]}"
wait_for 10 '[ "$(pid_of target-1)" != "${before[target-1]}" ] && [ "$(field_of target-1 4)" = ready ]'
check supervisor_restarts_killed_target \
    '[ "$(pid_of target-1)" != "${before[target-1]}" ] && [ "$(field_of target-1 4)" = ready ] && [ "$(field_of target-1 3)" -eq 1 ]' \
    "state: $(state)"
others_kept=1
for n in dflashd prefetch target-0 drafter-0 drafter-1; do
    [ "$(pid_of "$n")" = "${before[$n]}" ] || others_kept=0
done
check supervisor_others_untouched '[ "$others_kept" -eq 1 ]' "before: ${before[*]} | state: $(state)"
check supervisor_logs_restart \
    'grep -q "restarting target-1 (pid ${before[target-1]} killed by signal 9) in 100 ms" "$tmp/sup.err"' \
    "$(grep restarting "$tmp/sup.err")"

# SIGKILL dflashd (twice): it restarts and gets its stored memfd back with the pattern intact, each time.
for round in 1 2; do
    old=$(pid_of dflashd)
    kill -9 "$old"
    wait_for 10 '[ "$(pid_of dflashd)" != "$old" ] && [ "$(field_of dflashd 4)" = ready ] &&
        [ "$(grep -c "dflashd got pool0 back" "$run/fdstore" 2>/dev/null)" = "$round" ]'
done
check supervisor_dflashd_restarts '[ "$(field_of dflashd 3)" -eq 2 ] && [ "$(field_of dflashd 4)" = ready ]' \
    "state: $(state)"
check supervisor_fdstore_survives_restart '[ "$(grep -c "dflashd got pool0 back" "$run/fdstore" 2>/dev/null)" = 2 ]' \
    "fdstore: $(cat "$run/fdstore" 2>&1) | errors: $(cat "$run/errors" 2>&1)"
check supervisor_workers_survive_dflashd_restart '[ "$(pid_of drafter-0)" = "${before[drafter-0]}" ]' "state: $(state)"

# drafter-1 stops pinging the watchdog: SIGABRT, restart.
wd_old=$(pid_of drafter-1)
touch "$run/nowatchdog-drafter-1"
wait_for 10 '[ "$(pid_of drafter-1)" != "$wd_old" ] && [ "$(field_of drafter-1 4)" = ready ]'
check supervisor_watchdog_restarts \
    '[ "$(pid_of drafter-1)" != "$wd_old" ] && grep -q "drafter-1 stops pinging $wd_old" "$run/events" &&
     grep -q "watchdog: drafter-1 (pid $wd_old) sent no WATCHDOG=1" "$tmp/sup.err" &&
     grep -q "restarting drafter-1 (pid $wd_old killed by signal 6)" "$tmp/sup.err"' \
    "state: $(state) | $(grep drafter-1 "$tmp/sup.err" | tail -5)"
check supervisor_pingers_not_killed '[ "$(pid_of drafter-0)" = "${before[drafter-0]}" ] &&
    [ "$(pid_of prefetch)" = "${before[prefetch]}" ]' "state: $(state)"
wait_for 10 'grep -q "status drafter-0: drafter-0 step" "$tmp/sup.err"'
check supervisor_progress_line 'grep -q "status drafter-0: drafter-0 step" "$tmp/sup.err"' \
    "$(tail -5 "$tmp/sup.err")"

# SIGTERM to dflashd alone (what systemctl stop sends): it exits 0 without finishing the job; dflash run starts it
# again, it gets its memfd back, the workers keep running.
old=$(pid_of dflashd)
kill -TERM "$old"
wait_for 10 '[ "$(pid_of dflashd)" != "$old" ] && [ "$(field_of dflashd 4)" = ready ] &&
    [ "$(grep -c "dflashd got pool0 back" "$run/fdstore" 2>/dev/null)" = 3 ]'
check supervisor_dflashd_stopped_restarts \
    '[ "$(pid_of dflashd)" != "$old" ] && [ "$(field_of dflashd 4)" = ready ] && kill -0 "$sup_pid" &&
     [ "$(grep -c "dflashd got pool0 back" "$run/fdstore" 2>/dev/null)" = 3 ] &&
     grep -q "restarting dflashd (pid $old stopped without finishing the job)" "$tmp/sup.err" &&
     [ "$(pid_of drafter-0)" = "${before[drafter-0]}" ]' \
    "state: $(state) | $(grep dflashd "$tmp/sup.err" | tail -3)"

# finish: dflashd exits 0, the supervisor stops the rest and exits 0.
last_pids=$(state | awk '{ print $2 }')
touch "$run/finish"
wait_for 15 '! kill -0 "$sup_pid" 2>/dev/null'
wait "$sup_pid"
rc=$?
sup_pid=
check supervisor_finish_exit_0 '[ "$rc" -eq 0 ]' "exit $rc: $(tail -5 "$tmp/sup.err")"
left=
for p in $last_pids $(state | awk '{ print $2 }'); do kill -0 "$p" 2>/dev/null && left="$left $p"; done
check supervisor_finish_no_leftovers '[ -z "$left" ]' "still running:$left"
check supervisor_finish_state_exited '[ "$(state | awk "\$4 != \"exited\"" | wc -l)" -eq 0 ]' "state: $(state)"
check supervisor_no_child_errors '[ ! -s "$run/errors" ]' "$(cat "$run/errors" 2>&1)"
check supervisor_final_status 'grep -q "last status" "$tmp/sup.err"' "$(tail -3 "$tmp/sup.err")"

# ---- SIGTERM to the supervisor: every child stopped, exit 128+15 ----
run=$tmp/run2
cat >"$tmp/job2.ini" <<EOF
[job]
name = sup-test2-$$
run_dir = $run
[workers]
targets = 1
drafters = 1
EOF
ALL="dflashd prefetch target-0 drafter-0"
"$DFLASH" run -c "$tmp/job2.ini" --bin-dir "$bin" >"$tmp/sup2.out" 2>"$tmp/sup2.err" &
sup_pid=$!
wait_for 15 'all_ready'
pids=$(state | awk '{ print $2 }')
kill -TERM "$sup_pid"
wait_for 15 '! kill -0 "$sup_pid" 2>/dev/null'
wait "$sup_pid"
rc=$?
sup_pid=
left=
for p in $pids; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
check supervisor_sigterm_exit_143 '[ "$rc" -eq 143 ] && [ -n "$pids" ]' "exit $rc, pids '$pids': $(tail -5 "$tmp/sup2.err")"
check supervisor_sigterm_no_leftovers '[ -z "$left" ]' "still running:$left"

# ---- dflashd never sends READY=1: exit 1 after the ready timeout, nothing left running, no worker started ----
run=$tmp/run3
mkdir -p "$run"
touch "$run/noready"
sed -e "s|run2|run3|" -e "s|sup-test2|sup-test3|" "$tmp/job2.ini" >"$tmp/job3.ini"
DFLASH_READY_TIMEOUT=0.5 "$DFLASH" run -c "$tmp/job3.ini" --bin-dir "$bin" >"$tmp/sup3.out" 2>"$tmp/sup3.err" &
sup_pid=$!
wait_for 15 '! kill -0 "$sup_pid" 2>/dev/null'
wait "$sup_pid"
rc=$?
sup_pid=
pid=$(pid_of dflashd)
check supervisor_ready_timeout_exit_1 \
    '[ "$rc" -eq 1 ] && grep -q "dflashd sent no READY=1 within 0.5 s" "$tmp/sup3.err" && [ -n "$pid" ] &&
     ! kill -0 "$pid" 2>/dev/null && [ "$(grep -c " start " "$run/events")" -eq 1 ]' \
    "exit $rc, dflashd pid '$pid': $(tail -3 "$tmp/sup3.err") | $(cat "$run/events" 2>&1)"

[ "$fails" -eq 0 ]
