#!/usr/bin/env bash
# dflash-prepare end to end: good lines of both kinds (loss_mask, labels) plus bad lines become shards that
# --inspect validates; skipped lines are named file:line; --strict, a missing input, an occupied output folder and
# usage errors fail with the documented exit codes. Run from the repo root; expects ${BUILD:-build}/bin/dflash-prepare.
set -u
BUILD=${BUILD:-build}
PREP=$BUILD/bin/dflash-prepare
fails=0
ok() { echo "ok $1"; }
fail() { echo "FAIL $1${2:+: $2}"; fails=$((fails + 1)); }
check() { # name, condition (evaluated), detail on failure
    if eval "$2"; then ok "$1"; else fail "$1" "${3:-}"; fi
}

if [ ! -x "$PREP" ]; then
    fail prepare_binary "$PREP not found (build it first)"
    exit 1
fi
tmp=$(mktemp -d /tmp/dflash-prepare-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

in=$tmp/data.jsonl
cat >"$in" <<'EOF'
{"input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]}
{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}
{"input_ids": [8, 9], "loss_mask": [1, 0, 1]}
{"input_ids": [10, 11, "broken
{"input_ids": [12, 13], "labels": [-100, -100]}
{"input_ids": [14, 15, 16], "loss_mask": [1, 1, 1], "labels": [-100, -100, -100]}

{"input_ids": [17], "labels": [17]}
EOF
# Good: lines 1, 2, 6, 8 -> 4 samples, 4+3+3+1 = 11 tokens, 2+2+3+1 = 8 trained. Bad: 3 (length), 4 (JSON),
# 5 (no trained token); line 7 is blank (ignored).

out=$tmp/out
"$PREP" -o "$out" "$in" >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
check prepare_exit_0 '[ "$rc" -eq 0 ]' "exit $rc: $(cat "$tmp/stderr")"
check prepare_one_shard '[ -f "$out/shard-00000.shard" ] && [ "$(ls "$out" | wc -l)" -eq 1 ]' "$(ls -A "$out" 2>&1)"
check prepare_summary 'grep -q "^prepared 4 samples (11 tokens, 8 trained) into 1 shard; skipped 3 lines" "$tmp/stdout"' \
    "$(cat "$tmp/stdout")"
check prepare_names_mismatch_line 'grep -q "^$in:3: skipped: length mismatch" "$tmp/stderr"' "$(cat "$tmp/stderr")"
check prepare_names_json_line 'grep -q "^$in:4: skipped: invalid JSON" "$tmp/stderr"' "$(cat "$tmp/stderr")"
check prepare_names_untrained_line 'grep -q "^$in:5: skipped: no trained token" "$tmp/stderr"'
check prepare_blank_line_ignored '! grep -q ":7:" "$tmp/stderr"'

"$PREP" --inspect "$out/shard-00000.shard" >"$tmp/inspect" 2>&1
rc=$?
check inspect_counts '[ "$rc" -eq 0 ] && grep -q "shard-00000.shard: 4 samples, 11 tokens, 8 trained" "$tmp/inspect"' \
    "exit $rc: $(cat "$tmp/inspect")"
"$PREP" --inspect --vocab 17 "$out" >"$tmp/inspect" 2>&1
rc=$?
check inspect_vocab_fails '[ "$rc" -eq 1 ] && grep -q "shard-00000.shard: sample 3 .*id 17 >= vocab 17" "$tmp/inspect"' \
    "exit $rc: $(cat "$tmp/inspect")"
# A corrupt shard: flip one byte in the token ids.
cp "$out/shard-00000.shard" "$tmp/bad.shard"
printf '\x7f' | dd of="$tmp/bad.shard" bs=1 seek=$((64 + 8 * 5 + 2)) conv=notrunc status=none
"$PREP" --inspect "$tmp/bad.shard" >"$tmp/inspect" 2>&1
rc=$?
check inspect_detects_corruption '[ "$rc" -eq 1 ] && grep -q "$tmp/bad.shard: checksum mismatch" "$tmp/inspect"' \
    "exit $rc: $(cat "$tmp/inspect")"

# Several shards: with a 4-token cap the samples (4, 3, 3, 1 tokens) fill shards of 4, 3 and 3+1 tokens.
"$PREP" --max-tokens-per-shard 4 -o "$tmp/many" "$in" >/dev/null 2>&1
check prepare_splits_shards '[ "$(ls "$tmp/many"/*.shard | wc -l)" -eq 3 ]' "$(ls "$tmp/many")"
"$PREP" --inspect "$tmp/many" >"$tmp/inspect" 2>&1
check inspect_folder_total 'grep -q "^total: 3 shards, 4 samples, 11 tokens, 8 trained" "$tmp/inspect"' "$(cat "$tmp/inspect")"

# --max-len and --vocab skip with their reasons.
"$PREP" --max-len 3 --vocab 17 -o "$tmp/lim" "$in" >"$tmp/stdout" 2>"$tmp/stderr"
check prepare_limits 'grep -q "^prepared 2 samples (6 tokens" "$tmp/stdout" && grep -q "^$in:1: skipped: longer than --max-len" "$tmp/stderr" && grep -q "^$in:8: skipped: token id out of range" "$tmp/stderr"' \
    "$(cat "$tmp/stdout" "$tmp/stderr")"

# --strict: the first bad line is fatal, named, and nothing is left behind (the 4-token cap has published
# shard-00000 before line 3 fails; it must be removed again).
"$PREP" --strict --max-tokens-per-shard 4 -o "$tmp/strict" "$in" >/dev/null 2>"$tmp/stderr"
rc=$?
check strict_fails '[ "$rc" -eq 1 ] && grep -q "$in:3: length mismatch" "$tmp/stderr"' "exit $rc: $(cat "$tmp/stderr")"
check strict_leaves_no_shards '[ -z "$(ls -A "$tmp/strict" 2>/dev/null)" ] && grep -q "removed the 1 shard" "$tmp/stderr"' \
    "$(ls -A "$tmp/strict"; cat "$tmp/stderr")"

# A missing input: exit 1 naming it, before anything is written.
"$PREP" -o "$tmp/miss" "$in" "$tmp/nope.jsonl" >/dev/null 2>"$tmp/stderr"
rc=$?
check missing_input_fails '[ "$rc" -eq 1 ] && grep -q "cannot open input $tmp/nope.jsonl: No such file" "$tmp/stderr"' \
    "exit $rc: $(cat "$tmp/stderr")"
check missing_input_writes_nothing '[ ! -e "$tmp/miss" ]'

# An output folder that already holds shards is refused unless --force.
"$PREP" -o "$out" "$in" >/dev/null 2>"$tmp/stderr"
rc=$?
check occupied_output_refused '[ "$rc" -eq 1 ] && grep -q "already holds 1 \*.shard" "$tmp/stderr"' "exit $rc: $(cat "$tmp/stderr")"
"$PREP" --force -o "$out" "$in" >/dev/null 2>&1
check force_overwrites '[ "$?" -eq 0 ] && [ "$(ls "$out" | wc -l)" -eq 1 ]'

# Only bad lines: nothing prepared is an error.
printf '{"input_ids": [1], "labels": [-100]}\n' >"$tmp/allbad.jsonl"
"$PREP" -o "$tmp/none" "$tmp/allbad.jsonl" >/dev/null 2>"$tmp/stderr"
rc=$?
check nothing_prepared_fails '[ "$rc" -eq 1 ] && grep -q "no valid samples" "$tmp/stderr"' "exit $rc"

# Usage errors exit 2; --help exits 0.
"$PREP" "$in" >/dev/null 2>&1; rc1=$?
"$PREP" -o "$tmp/u" >/dev/null 2>&1; rc2=$?
"$PREP" --max-len abc -o "$tmp/u" "$in" >/dev/null 2>&1; rc3=$?
"$PREP" --no-such-option >/dev/null 2>&1; rc4=$?
check usage_errors_exit_2 '[ "$rc1$rc2$rc3$rc4" = 2222 ]' "got $rc1 $rc2 $rc3 $rc4"
"$PREP" --help >"$tmp/help" 2>&1
check help_exit_0 '[ "$?" -eq 0 ] && grep -q "usage: dflash-prepare" "$tmp/help"'

[ "$fails" -eq 0 ]
