#!/usr/bin/env bash
# What a job checks before anything starts, and a data set changing under a running job (issue 19, items 4, 7, 9 and
# 15): a missing or empty data folder, an id outside the target's vocabulary, no sample with a trained token within a
# batch are refused at start naming the folder, shard and id, before any worker started (no prefetch restarts);
# samples cut to a batch are warned about on the console; `dflash-prepare -c job.ini` skips ids outside the target's
# vocabulary; a shard replaced, overwritten in place, truncated or removed under the running prefetcher is an error
# naming it and ends the run (never a hang); `--set x` is a usage error (exit 2) for every command; `--inspect data/`
# names the shards without a double slash.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
make_fixture || { fail start_checks_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }

# the data folder: missing, empty; an id >= the target's vocabulary (256)
mkdir -p "$T/data-empty"
python3 -c 'import json; print(json.dumps({"input_ids": [1, 2, 3, 300, 5, 6], "loss_mask": [0, 0, 1, 1, 1, 1]}))' \
    >"$T/bigid.jsonl"
"$BIN/dflash-prepare" -o "$T/data-bigid" "$T/data.jsonl" "$T/bigid.jsonl" >/dev/null 2>&1
for c in "missing:$T/no-such-data:$T/no-such-data: cannot open dataset" \
         "empty:$T/data-empty:$T/data-empty: no *.shard files" \
         "bigid:$T/data-bigid:data-bigid/shard-00000.shard: sample 48 (dataset sample 48), token 3: id 300 >= vocab 256"; do
    kind=${c%%:*} rest=${c#*:}
    path=${rest%%:*} want=${rest#*:}
    write_config $kind 10
    sed -i "s|^path = .*|path = $path|" "$T/$kind.ini"
    run_job $kind; rc=$?
    if [ $rc -eq 1 ] && grep -qF "$want" "$T/$kind.out" && [ ! -e "$T/$kind/logs/prefetch.log" ]; then
        ok "data_refused_at_start ($kind: $(grep -oF "$want" "$T/$kind.out" | head -1))"
    else fail data_refused_at_start "$kind: exit $rc, prefetch started: $([ -e "$T/$kind/logs/prefetch.log" ] && echo yes || echo no): $(grep ERROR "$T/$kind.out" | tail -1)"; fi
done

# dflash-prepare -c job.ini: the target's vocabulary, without --vocab
write_config prep 10
if "$BIN/dflash-prepare" -c "$T/prep.ini" -o "$T/data-prep" "$T/bigid.jsonl" "$T/data.jsonl" >"$T/prep.out" 2>&1 &&
   grep -qF "bigid.jsonl:1: skipped: token id out of range: input_ids[3] = 300 >= the 256 ids of target.model" "$T/prep.out" &&
   grep -q "prepared 48 samples" "$T/prep.out"; then ok prepare_checks_ids_against_the_job_target
else fail prepare_checks_ids_against_the_job_target "$(head -3 "$T/prep.out")"; fi

# no sample keeps a trained token within data.max_batch_tokens: refused; samples cut: a console warning
write_config tiny 10
run_job tiny --set data.max_batch_tokens=2; rc=$?
if [ $rc -eq 1 ] && grep -q "no sample of the 48 has a trained token within its first data.max_batch_tokens = 2 tokens" "$T/tiny.out"; then
    ok "no_trainable_sample_refused_at_start ($(grep -o "data.max_batch_tokens = [0-9]* makes at least one sample trainable" "$T/tiny.out"))"
else fail no_trainable_sample_refused_at_start "exit $rc: $(grep ERROR "$T/tiny.out" | tail -1)"; fi
write_config cut 4
if run_job cut --set data.max_batch_tokens=40 &&
   grep -q "WARN.*dflashd: [0-9]* of 48 samples are longer than data.max_batch_tokens = 40 (the longest: 48 tokens)" "$T/cut.out"; then
    ok "cut_samples_warned_on_the_console ($(grep -o "[0-9]* of 48 samples are longer" "$T/cut.out"))"
else fail cut_samples_warned_on_the_console "$(grep -i "warn\|error" "$T/cut.out" | tail -2)"; fi

# a shard that changes under the running prefetcher: every way; the run ends (status 1) naming it
"$BIN/dflash-demo" make-data -q --target "$T/target" -o "$T/other.jsonl" --samples 40 --answer-len 20 --seed 9 \
    >/dev/null 2>&1 && "$BIN/dflash-prepare" -o "$T/other" "$T/other.jsonl" >/dev/null 2>&1
o=$(ls "$T/other"/*.shard | head -1)
for kind in replaced overwritten truncated removed; do
    mkdir -p "$T/data-$kind"
    "$BIN/dflash-prepare" --max-tokens-per-shard 1000 -o "$T/data-$kind" "$T/data.jsonl" >/dev/null 2>&1
    f=$(ls "$T/data-$kind"/*.shard | head -1)
    write_config $kind 100000
    sed -i "s|^path = .*|path = $T/data-$kind|" "$T/$kind.ini"
    "$BIN/dflash" run -c "$T/$kind.ini" >"$T/$kind.out" 2>&1 &
    sup=$!
    deadline=$((SECONDS + 120)) # a bound on a broken build, not a timing assertion: the job cannot finish
    until [ "$({ wc -l <"$T/$kind/ledger.jsonl"; } 2>/dev/null || echo 0)" -ge 3 ] || [ $SECONDS -ge $deadline ]; do sleep 0.1; done
    case $kind in
    replaced) cp "$o" "$T/data-$kind/.new" && mv "$T/data-$kind/.new" "$f" ;;
    overwritten) printf '\x5a\x5a\x5a\x5a' | dd of="$f" bs=1 seek=$(($(stat -c %s "$f") - 20)) conv=notrunc status=none ;;
    truncated) truncate -s $(($(stat -c %s "$f") / 2)) "$f" ;;
    removed) rm "$f" ;;
    esac
    deadline=$((SECONDS + 300))
    while kill -0 $sup 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    hung=0
    kill -0 $sup 2>/dev/null && { hung=1; kill -TERM $sup; }
    wait $sup
    rc=$?
    if [ $hung = 0 ] && [ $rc -eq 1 ] && grep -q "gave up on the job: prefetch failed .*$f" "$T/$kind.out" &&
       grep -q "ERROR.*$f.*\(changed under the running prefetcher\|truncated under the running prefetcher\)" "$T/$kind/logs/prefetch.log"; then
        ok "shard_changed_under_the_job_is_an_error ($kind: $(grep -o "$f: the shard [^(:]*" "$T/$kind/logs/prefetch.log" | head -1 | sed "s|$T/||"))"
    else fail shard_changed_under_the_job_is_an_error "$kind: hung $hung, exit $rc: $(grep ERROR "$T/$kind/logs/prefetch.log" | head -1)"; fi
done

# --set without '=' is a usage error (exit 2) for every command that takes --set
for cmd in "dflash run" dflashd dflash-prefetch dflash-target dflash-drafter; do
    set -- $cmd
    b=$1; shift
    "$BIN/$b" "$@" -c "$T/prep.ini" --set x >"$T/set.out" 2>&1; rc=$?
    if [ $rc -eq 2 ] && grep -qF -- '--set "x": expected section.key=value' "$T/set.out"; then ok "set_without_value_is_a_usage_error ($cmd)"
    else fail set_without_value_is_a_usage_error "$cmd: exit $rc: $(head -1 "$T/set.out")"; fi
done

# --inspect of a folder given with a trailing slash
if "$BIN/dflash-prepare" --inspect "$T/data/" >"$T/inspect.out" 2>&1 && grep -q "^$T/data/shard-00000.shard:" "$T/inspect.out" &&
   ! grep -q "//" "$T/inspect.out"; then ok inspect_names_shards_without_a_double_slash
else fail inspect_names_shards_without_a_double_slash "$(head -1 "$T/inspect.out")"; fi
exit $FAILED
