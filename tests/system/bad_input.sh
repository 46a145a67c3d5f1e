#!/usr/bin/env bash
# Bad input reaching the pipeline: a corrupt or truncated shard and a config naming a missing model get clear
# errors naming the file, found at start; settings wrong together are refused at start naming them.
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

# a shard with a flipped byte, then a truncated shard: found at start (issue 19, item 9), before any worker ran: dflash
# run fails naming the file (a shard that breaks under a running job: start_checks.sh, give_up.sh)
for kind in corrupt truncated; do
    mkdir -p "$T/data-$kind"
    cp "$T/data"/*.shard "$T/data-$kind/"
    f=$(ls "$T/data-$kind"/*.shard | head -1)
    size=$(stat -c %s "$f")
    if [ $kind = corrupt ]; then
        printf '\x5a' | dd of="$f" bs=1 seek=$((size - 20)) conv=notrunc status=none
        want="$f: checksum mismatch"
    else
        truncate -s $((size / 2)) "$f"
        want="$f: truncated"
    fi
    write_config $kind 10
    sed -i "s|^path = .*|path = $T/data-$kind|" "$T/$kind.ini"
    run_job $kind; rc=$?
    if [ $rc -eq 1 ] && grep -qF "$want" "$T/$kind.out"; then ok "${kind}_shard_names_the_file"
    else fail "${kind}_shard_names_the_file" "exit $rc: $(grep ERROR "$T/$kind.out" | tail -1)"; fi
    if [ ! -e "$T/$kind/logs/prefetch.log" ]; then ok "${kind}_shard_found_before_any_worker_started"
    else fail "${kind}_shard_found_before_any_worker_started" "the prefetcher ran"; fi
done
exit $FAILED
