#!/usr/bin/env bash
# Runs every test: unit binaries, golden cases, system and chaos scripts, short fuzz runs.
# Every test prints "ok <name>" or "FAIL <name>..."; a binary that dies without printing counts as one failure.
# Ends with "N passed, N failed"; exit status 0 only when nothing failed.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
# the golden cases live in the repository (tests/goldens, format in its README.md); DFLASH_GOLDENS points elsewhere
GOLDENS=${DFLASH_GOLDENS:-tests/goldens}
export DFLASH_GOLDENS=$GOLDENS
FUZZ_SECONDS=${FUZZ_SECONDS:-15}
pass=0; fail=0; skip=0; failed_names=(); skipped_lines=()
log=$(mktemp -d /tmp/dflash-tests-XXXXXX)

run_one() { # label, command...
    local label=$1; shift
    local out="$log/$(echo "$label" | tr '/ ' '__').log"
    local t0=$SECONDS
    "$@" >"$out" 2>&1
    local rc=$?
    local p f
    p=$(grep -c '^ok ' "$out"); f=$(grep -c '^FAIL ' "$out")
    if [ "$rc" -eq 77 ] && [ "$f" -eq 0 ]; then # the test says why it cannot run here
        skip=$((skip + 1)); skipped_lines+=("$label: $(tail -n 1 "$out")")
        printf '%-44s skipped  (%s)\n' "$label" "$(tail -n 1 "$out" | cut -c1-90)"
        return
    fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "FAIL $label: exit status $rc" >>"$out"; fi
    pass=$((pass + p)); fail=$((fail + f))
    printf '%-44s %3d passed %3d failed  (%ds)\n' "$label" "$p" "$f" $((SECONDS - t0))
    if [ "$f" -gt 0 ]; then
        failed_names+=("$label"); sed 's/^/    | /' "$out" | tail -40
    fi
}

for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "unit/$(basename "$t")" "$t"
done

skip_note() { # label, reason: a case that cannot run here is counted and said, never dropped silently
    skip=$((skip + 1)); skipped_lines+=("$1: $2")
    printf '%-44s skipped  (%s)\n' "$1" "$2"
}

[ -d "$GOLDENS" ] || skip_note "golden/*" "no golden cases at $GOLDENS"
for c in "$GOLDENS"/*/; do
    [ -d "$c" ] || continue
    name=$(basename "$c")
    [ "$name" = tokenizer ] && continue
    if [ ! -f "$c/case.safetensors" ]; then skip_note "golden/$name" "no case.safetensors in $c"; continue; fi
    run_one "golden/$name" bash -c "'$BUILD/tests/dflash_golden' '$c' | sed -e 's/^\\(.*\\) ok\$/ok \\1/' -e 's/^\\(.*\\) FAIL\$/FAIL \\1/'; exit \${PIPESTATUS[0]}"
done

# tokenizer and chat-template goldens: the real tokenizer files come from `make tokenizers` (build/tokenizers)
[ -d "$GOLDENS/tokenizer" ] || skip_note "golden/tokenizer/*" "no tokenizer goldens at $GOLDENS/tokenizer"
for c in "$GOLDENS"/tokenizer/*.json; do
    [ -f "$c" ] || continue
    run_one "golden/tokenizer/$(basename "$c" .json)" "$BUILD/tests/dflash_tok_golden" "$c" build/tokenizers
done

for s in tests/system/*.sh tests/chaos/*.sh; do
    [ -f "$s" ] || continue
    run_one "${s#tests/}" env BUILD="$BUILD" bash "$s"
done

if [ "${SAN:-0}" != 1 ]; then
    for f in build/fuzz/fuzz_*; do
        [ -x "$f" ] || continue
        name=$(basename "$f")
        corpus=tests/fuzz/corpus/${name#fuzz_}
        work="$log/corpus-$name"; mkdir -p "$work"
        [ -d "$corpus" ] && cp -r "$corpus"/. "$work"/
        run_one "fuzz/$name" bash -c "'$f' -max_total_time=$FUZZ_SECONDS -rss_limit_mb=2048 '$work' >/dev/null 2>'$log/$name.err' && echo 'ok $name ${FUZZ_SECONDS}s' || { tail -30 '$log/$name.err'; echo 'FAIL $name'; exit 1; }"
    done
fi

echo
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}" && echo "logs: $log"
if [ ${#skipped_lines[@]} -gt 0 ]; then
    echo "skipped:"; printf '    %s\n' "${skipped_lines[@]}"
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
