#!/usr/bin/env bash
# What --resume refuses (issue 19, items 2, 4, 5 and 15): every setting that decides which batches make a step or
# what a batch holds, changed, is refused naming the setting and both values (a safe change is accepted); another
# data set (a shard replaced, rewritten, truncated, removed or added, or data.path at other data) is refused naming
# the shard; a ledger that is not the committed history (a line deleted, a line changed) is refused untouched, naming
# the first bad line, while a torn last line is cut and the console says so; no checkpoint at all says so.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
make_fixture || { fail resume_checks_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
"$BIN/dflash-demo" make-data -q --target "$T/target" -o "$T/other.jsonl" --samples 40 --answer-len 20 --seed 9 \
    >/dev/null 2>>"$T/fixture.log" && "$BIN/dflash-prepare" -o "$T/other" "$T/other.jsonl" >/dev/null 2>&1 ||
    { fail resume_checks_fixture "other data"; exit 1; }

# --resume where no checkpoint was ever written
write_config none 10
if run_job none --resume; then fail resume_without_checkpoint_refused "exit 0"
elif grep -q "there is no checkpoint in $T/none/ckpt to resume from" "$T/none.out" &&
     ! grep -q "unable to open" "$T/none.out"; then ok resume_without_checkpoint_says_so
else fail resume_without_checkpoint_says_so "$(tail -2 "$T/none.out")"; fi

# a finished run to resume (its data, two shards, in a folder of its own, which the data cases change)
"$BIN/dflash-prepare" --max-tokens-per-shard 1000 -o "$T/data2" "$T/data.jsonl" >/dev/null 2>&1
[ "$(ls "$T/data2"/*.shard | wc -l)" -eq 2 ] || { fail resume_checks_fixture "two shards"; exit 1; }
mkdir -p "$T/data-base"
cp "$T/data2"/*.shard "$T/data-base/"
write_config base 20
sed -i "s|^path = .*|path = $T/data-base|" "$T/base.ini"
run_job base || { fail resume_checks_base_run "$(tail -3 "$T/base.out")"; exit 1; }
cp "$T/base/ledger.jsonl" "$T/base-ledger.jsonl"

# every batch setting (common/job/run_record.c: run_record_plan_keys), changed on --resume (workers.drafters and
# workers.targets may change: tests/system/reshard.sh)
for c in job.seed=78:77 data.max_batch_tokens=96:128 \
         data.max_batch_seqs=4:8 drafter.block_size=8:4 drafter.max_anchors=4:8 drafter.mask_token_id=100:-1; do
    set=${c%:*} was=${c##*:} key=${c%%=*} now=${set#*=}
    run_job base --resume --set "$set"; rc=$?
    if [ $rc -eq 1 ] && grep -qF -- "--resume: $key = $now, but the run was started with $key = $was" "$T/base.out" &&
       grep -qF "Safe to change on a resume" "$T/base.out"; then ok "resume_refuses_changed_setting ($key $was -> $now)"
    else fail resume_refuses_changed_setting "$set: exit $rc: $(grep ERROR "$T/base.out" | tail -1)"; fi
done
if cmp -s "$T/base/ledger.jsonl" "$T/base-ledger.jsonl"; then ok resume_refusals_leave_the_ledger
else fail resume_refusals_leave_the_ledger "the ledger changed"; fi

# the data set changed between the run and its resume: every way a shard can change
f=$(ls "$T/data-base"/*.shard | head -1)
name=$(basename "$f")
last=$(basename "$(ls "$T/data-base"/*.shard | tail -1)")
o=$(ls "$T/other"/*.shard | head -1)
restore() { rm -f "$T/data-base"/*; cp "$T/data2"/*.shard "$T/data-base/"; }
for kind in replaced overwritten truncated removed added other_path; do
    restore
    extra=()
    case $kind in
    replaced) cp "$o" "$T/data-base/.new" && mv "$T/data-base/.new" "$f"; want="shard $f is" ;;
    overwritten) cp "$o" "$f"; want="shard $f is" ;;
    truncated) truncate -s $(($(stat -c %s "$f") / 2)) "$f"; want="$f: truncated" ;;
    removed) rm "$T/data-base/$last"; want="shard $last (shard 2 of 2) is missing from data.path $T/data-base" ;;
    added) cp "$o" "$T/data-base/zz-extra.shard"; want="shard $T/data-base/zz-extra.shard is new" ;;
    other_path) extra=(--set "data.path=$T/other"); want="shard $o is" ;;
    esac
    run_job base --resume "${extra[@]}"; rc=$?
    if [ $rc -eq 1 ] && grep -qF "$want" "$T/base.out"; then ok "resume_refuses_changed_data ($kind: $(grep -o "the data set changed: shard [^ ]* [^ ]* [^ ]*\|truncated" "$T/base.out" | head -1 | sed "s|$T/||g"))"
    else fail resume_refuses_changed_data "$kind: exit $rc: $(grep ERROR "$T/base.out" | tail -1)"; fi
done
restore

# a ledger with a hole, then with a changed line: refused untouched, naming the first bad line
for kind in hole garbage; do
    cp "$T/base-ledger.jsonl" "$T/base/ledger.jsonl"
    if [ $kind = hole ]; then sed -i 3d "$T/base/ledger.jsonl"; want="ledger.jsonl:3: the line of step 3 where step 2 belongs"
    else sed -i '5s/.*/not a ledger line/' "$T/base/ledger.jsonl"; want="ledger.jsonl:5: not a ledger line"; fi
    cp "$T/base/ledger.jsonl" "$T/bad-ledger.jsonl"
    run_job base --resume --set train.steps=25; rc=$?
    if [ $rc -eq 1 ] && grep -qF "$want" "$T/base.out" && cmp -s "$T/base/ledger.jsonl" "$T/bad-ledger.jsonl"; then
        ok "resume_refuses_a_ledger_that_is_not_the_history ($kind: $want; the file is untouched)"
    else fail resume_refuses_a_ledger_that_is_not_the_history "$kind: exit $rc: $(grep ERROR "$T/base.out" | tail -1)"; fi
done

# a torn last line is cut, the console says so; a safe change (more steps, another lr) resumes
cp "$T/base-ledger.jsonl" "$T/base/ledger.jsonl"
printf '{"step": 20, "batches": [40, ' >>"$T/base/ledger.jsonl"
if run_job base --resume --set train.steps=25 --set train.lr=1e-3 &&
   grep -q "WARN.*dflashd: .*ledger.jsonl: cut a torn last line" "$T/base.out"; then
    ok resume_cuts_a_torn_last_line_and_says_so
else fail resume_cuts_a_torn_last_line_and_says_so "$(tail -3 "$T/base.out")"; fi
if msg=$(check_ledger base 25 2); then ok "resume_with_safe_changes_completes ($msg)"
else fail resume_with_safe_changes_completes "$msg"; fi
exit $FAILED
