#!/usr/bin/env bash
# GPU system test (GPU machine): dflashd + dflash-prefetch + one dflash-target-cuda fill GPU pool slots of a
# job.backend = cuda job; tests/gpu/slot_consumer registers as drafter-0 (before the target has deposited its pool,
# so it is refused with a retryable answer first), imports the pool's VMM memory and checks every slot against the
# CPU forward. The consumer SIGKILLs the target twice mid-run while it fills a slot, and the script restarts it (as
# `dflash run` / systemd would); it must re-import its pool and its device weights from dflashd, and the consumer must see batches 0..N-1
# exactly once, in order, all correct.
# Usage: BUILD=build/gpu-h tests/gpu/gpu_pipeline.sh   (needs $BUILD/bin/* and $BUILD/gpu/slot_consumer)
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
. tests/gpu/lib.bash
N=${N:-30}
STEPS=$N
CONSUMER=${BUILD:-build}/gpu/slot_consumer

"$BIN/dflash-demo" make-target "$T/target" --seed 11 --hidden 64 --layers 4 --heads 4 --kv-heads 2 --head-dim 16 \
    --intermediate 128 --vocab 256 --dtype bf16 >/dev/null 2>"$T/fixture.log" &&
prepared_data "$T/target" "$T/data" --samples 48 --answer-len 24 --seed 5 ||
    { fail gpu_pipeline_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }

# the job the target fills and the consumer (as drafter-0) checks: 3 taps, 3 pool slots, a 60 s watchdog
gpu_config gpu drafter.num_taps=3 train.checkpoint_every=1000 ring.pool_slots=3 workers.watchdog_sec=60 \
    workers.heartbeat_timeout_sec=60
mkdir -p "$T/gpu"
"$BIN/dflashd" -c "$T/gpu.ini" >"$T/dflashd.log" 2>&1 &
keeper=$!
"$CONSUMER" -c "$T/gpu.ini" -n "$N" -w 120 -K $((N / 3)),$((2 * N / 3)) >"$T/consumer.out" 2>"$T/consumer.log" &
consumer=$!
"$BIN/dflash-prefetch" -c "$T/gpu.ini" >"$T/prefetch.log" 2>&1 &
prefetch=$!
sleep 1 # the consumer registers first: refused (retryable) until the target has deposited its pool
start_target() { "$BIN/dflash-target-cuda" -c "$T/gpu.ini" --index 0 >>"$T/target.log" 2>&1 & target=$!; }
start_target
# the consumer SIGKILLs the target twice while it is filling a slot; restart it as `dflash run` / systemd would
trc= cdead=
while [ -z "$trc" ]; do
    if ! kill -0 $target 2>/dev/null; then
        wait $target; st=$?
        echo "--- target exited with status $st" >>"$T/target.log"
        if [ $st -eq 137 ]; then start_target; else trc=$st; fi
    fi
    if [ -z "$cdead" ] && ! kill -0 $consumer 2>/dev/null; then cdead=$SECONDS; fi
    if [ -n "$cdead" ] && [ -z "$trc" ] && [ $((SECONDS - cdead)) -gt 30 ]; then
        kill -9 $target 2>/dev/null; wait $target 2>/dev/null; trc="(still running 30 s after the consumer ended)"
    fi
    sleep 0.02
done
[ "$trc" = 0 ] || kill -9 $consumer 2>/dev/null # the target failed: do not wait for the consumer's timeouts
wait $consumer
crc=$?
cat "$T/consumer.out"
[ $crc -eq 0 ] && grep -q '^ok gpu_consumer_batches' "$T/consumer.out" && ok "gpu_pipeline_batches_exactly_once_in_order ($N)" ||
    fail gpu_pipeline_batches_exactly_once_in_order "consumer status $crc: $(grep -v '^ok' "$T/consumer.out" | head -3; tail -3 "$T/consumer.log")"

grep -q 'not deposited by target-0 yet' "$T/consumer.log" && ok gpu_pipeline_consumer_waited_for_deposit ||
    fail gpu_pipeline_consumer_waited_for_deposit "the consumer was never told to wait for the pool"
ndep=$(grep -c 'target-0 deposited its GPU pool' "$T/dflashd.log")
nimp=$(grep -c 're-imported pool 0' "$T/target.log")
[ "$ndep" -eq 1 ] && [ "$nimp" -eq 2 ] && ok "gpu_pipeline_target_reimports_pool (deposited $ndep, re-imported $nimp)" ||
    fail gpu_pipeline_target_reimports_pool "deposited $ndep times, re-imported $nimp times (expected 1, 2)"
# its device weights too: deposited once, re-imported by both restarted instances (whose slots the consumer checked)
wdep=$(grep -c 'target-0 deposited its device weights' "$T/dflashd.log")
wimp=$(grep -c "re-imported the target's weights" "$T/target.log")
[ "$wdep" -eq 1 ] && [ "$wimp" -eq 2 ] && ok "gpu_pipeline_target_reimports_weights (deposited $wdep, re-imported $wimp)" ||
    fail gpu_pipeline_target_reimports_weights "deposited $wdep times, re-imported $wimp times (expected 1, 2)"
grep -q 'warm-up:' "$T/target.log" && ok gpu_pipeline_target_warm_up || fail gpu_pipeline_target_warm_up "no warm-up line"

# the job is marked finished by the consumer: the last target instance and prefetch exit 0 by themselves
wait $prefetch; prc=$?
[ "$trc" = 0 ] && [ $prc -eq 0 ] && ok gpu_pipeline_workers_exit_cleanly ||
    fail gpu_pipeline_workers_exit_cleanly "target exit $trc, prefetch exit $prc: $(tail -3 "$T/target.log")"
kill $keeper 2>/dev/null; wait $keeper 2>/dev/null
[ $FAILED -eq 0 ] || { echo "--- target.log"; tail -20 "$T/target.log"; echo "--- dflashd.log"; tail -20 "$T/dflashd.log"; }
exit $FAILED
