#!/usr/bin/env bash
# How long a restart keeps the pipeline from committing a step, at 8B scale (GPU machine): the end-to-end job of
# bench/e2e.sh (a Qwen3-8B-shaped target with random weights, bench/e2e_fixture.py; the 5-layer drafter; ~3000-token
# samples) under `dflash run`, once with target.keep_weights = true and once with false. In each run, as in
# tests/gpu/gpu_train.sh: `dflashctl rolling-restart target`, a SIGKILL of target-0, `rolling-restart drafter`, a
# SIGKILL of drafter-0, one after the other, each followed by GAP_STEPS committed steps; a poller notes when the
# ledger grows and the longest gap between two commits inside each operation's window is printed, with the
# restarted target's own log lines (load or re-import, warm-up).
# usage: BUILD=build STEPS=150 bench/restart_gap.sh   (FIXTURE=DIR: DIR/target and DIR/data.jsonl instead of
# e2e_fixture.py's, which needs torch; with BACKEND=cpu, the script's own check: tests/gpu/lib.bash)
cd "$(dirname "$0")/.." || exit 1
. tests/system/lib.bash
. tests/gpu/lib.bash
. bench/e2e_job.bash
STEPS=${STEPS:-150}
GAP_STEPS=${GAP_STEPS:-12}
if [ -n "${FIXTURE:-}" ]; then
    ln -s "$(realpath "$FIXTURE/target")" "$T/target" && cp "$FIXTURE/data.jsonl" "$T/" || exit 1
else python3 bench/e2e_fixture.py "$T" --samples $((2 * STEPS + 50)) --layers ${LAYERS:-36} || exit 1; fi
"$BIN/dflash-prepare" -o "$T/data" "$T/data.jsonl" | tail -1 || exit 1

config() { e2e_job_config "$T/$1.ini" "gap-$1" "$T/$1" "$T" && set_ini "$T/$1.ini" target.keep_weights="$2"; } # NAME KEEP

one_run() { # NAME KEEP
    local name=$1 sup poller done_at rc
    config "$name" "$2"
    "$BIN/dflash" run -c "$T/$name.ini" >"$T/$name.out" 2>&1 &
    sup=$!
    ledger_poller "$name" $sup &
    poller=$!
    gap_op() { op "$name" "$GAP_STEPS" "$@" || echo "$name: $1 failed: $(tail -2 "$T/$name.ctl")"; } # LABEL COMMAND...
    wait_step "$name" 15
    gap_op rolling_restart_target "$CTL" -c "$T/$name.ini" --wait 300 rolling-restart target
    gap_op sigkill_target kill_worker "$name" target-0
    gap_op rolling_restart_drafter "$CTL" -c "$T/$name.ini" --wait 300 rolling-restart drafter
    gap_op sigkill_drafter kill_worker "$name" drafter-0
    done_at=$(ledger_lines "$name")
    wait $sup
    rc=$?
    wait $poller
    echo "$name (target.keep_weights = $2): dflash run exit $rc, operations done by step $done_at of $STEPS"
    echo "restart gaps (keep_weights = $2): $(commit_gaps "$name")"
    grep -h "registered with the keeper\|re-imported the target's weights\|loaded the target's weights\|reloaded\|not reused\|warm-up\|up to layer" \
        "$T/$name/logs/target-0.log" | sed 's/^/  target: /' | cut -c1-260
    grep -h "re-imported the training state\|warm-up" "$T/$name/logs/drafter-0.log" | sed 's/^/  drafter: /' | cut -c1-200
}
one_run keep true
one_run nokeep false
