#!/usr/bin/env bash
# Bad input reaching the pipeline: a corrupt or truncated shard and a config naming a missing model get clear
# errors naming the file, and dflashd stays up while a worker fails to start.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
make_fixture || { fail bad_input_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }

# a config naming a missing model: dflash run fails and says which file
write_config nomodel 10
sed -i "s|^model = .*|model = $T/no-such-model|" "$T/nomodel.ini"
if run_job nomodel; then fail missing_model_fails "dflash run succeeded"
elif grep -rq "no-such-model" "$T/nomodel.out" "$T/nomodel/logs" 2>/dev/null; then ok missing_model_names_the_file
else fail missing_model_names_the_file "$(tail -3 "$T/nomodel.out")"; fi

# settings valid alone and wrong together (or beyond what dflashd can hold) are refused at start, naming them
write_config settings 10
for c in "workers.heartbeat_timeout_sec=0.5:heartbeat_timeout_sec = 0.5 is below twice control.heartbeat_sec" \
         "drafter.num_taps=9:drafter.num_taps = 9 is more than the 4 layers" \
         "ring.pool_slots=2000:ring.pool_slots" \
         "train.min_lr=0.01:train.min_lr=0.01: train.min_lr = 0.01 is above train.lr = 0.003" \
         "drafter.taps=1,2,1:drafter.taps: layer 1 is listed twice (taps 1 and 3 of the list)"; do
    set=${c%%:*} want=${c#*:}
    run_job settings --set "$set"; rc=$?
    if [ $rc -eq 1 ] && grep -qF "$want" "$T/settings.out"; then ok "setting_refused_at_start ($set: $(grep -oF "$want" "$T/settings.out" | head -1))"
    else fail setting_refused_at_start "$set: exit $rc: $(tail -2 "$T/settings.out")"; fi
    rm -rf "$T/settings"
done

# a shard with a flipped byte, then a truncated shard: prefetch fails naming the file, dflashd keeps running
for kind in corrupt truncated; do
    mkdir -p "$T/data-$kind"
    cp "$T/data"/*.shard "$T/data-$kind/"
    f=$(ls "$T/data-$kind"/*.shard | head -1)
    size=$(stat -c %s "$f")
    if [ $kind = corrupt ]; then
        printf '\x5a' | dd of="$f" bs=1 seek=$((size - 20)) conv=notrunc status=none
    else
        truncate -s $((size / 2)) "$f"
    fi
    write_config $kind 10
    sed -i "s|^path = .*|path = $T/data-$kind|" "$T/$kind.ini"
    "$BIN/dflash" run -c "$T/$kind.ini" >"$T/$kind.out" 2>&1 &
    sup=$!
    deadline=$((SECONDS + 30))
    until grep -qs "$f" "$T/$kind/logs/prefetch.log" || [ $SECONDS -ge $deadline ]; do sleep 0.1; done
    pid1=$(awk '$1 == "dflashd" {print $2}' "$T/$kind/supervisor.state" 2>/dev/null)
    sleep 1.5
    pid2=$(awk '$1 == "dflashd" {print $2}' "$T/$kind/supervisor.state" 2>/dev/null)
    if grep -qs "$f" "$T/$kind/logs/prefetch.log"; then ok "${kind}_shard_names_the_file"
    else fail "${kind}_shard_names_the_file" "$(tail -2 "$T/$kind/logs/prefetch.log" 2>/dev/null)"; fi
    if [ -n "$pid1" ] && [ "$pid1" = "$pid2" ] && kill -0 "$pid1" 2>/dev/null; then ok "${kind}_shard_dflashd_stays_up"
    else fail "${kind}_shard_dflashd_stays_up" "dflashd pid $pid1 -> $pid2"; fi
    if [ $kind = corrupt ]; then
        # a worker that keeps failing before it is ready ends the run (like systemd's start limit), saying why
        deadline=$((SECONDS + 60))
        while kill -0 $sup 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
        kill -TERM $sup 2>/dev/null
        wait $sup
        rc=$?
        if [ $rc -eq 1 ] && grep -q "prefetch failed 8 times in a row before becoming ready.*$f" "$T/$kind.out"; then
            ok corrupt_shard_ends_the_run_with_the_reason
        else
            fail corrupt_shard_ends_the_run_with_the_reason "exit $rc: $(tail -2 "$T/$kind.out")"
        fi
        continue
    fi
    kill -TERM $sup
    wait $sup
done
exit $FAILED
