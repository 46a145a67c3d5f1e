#!/usr/bin/env bash
# The learnable demo target (dflash-demo make-target --kind repeat): its greedy continuation is the token PERIOD
# positions back, on every prompt of make-data, and a drafter trained briefly on its self-distilled data decodes
# held-out prompts (another seed) with an acceptance length well above the untrained drafter's (dflash eval --json,
# the same job's step-0 weights). Also: make-target refuses a shape too small for the codes, naming the flags.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash

# the fixture of lib.bash's make_fixture, with the repeat target; period 4 = write_config's block size
make_fixture --kind repeat --period 4 &&
"$BIN/dflash-demo" make-data -q --target "$T/target" -o "$T/held.jsonl" --samples 12 --answer-len 24 --seed 9 \
    >/dev/null 2>>"$T/fixture.log" ||
    { fail demo_learns_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }

# and make run's target (the default shape, period 8), answering 16 prompts
"$BIN/dflash-demo" make-target "$T/demo" --kind repeat --seed 7 >/dev/null 2>>"$T/fixture.log" &&
"$BIN/dflash-demo" make-data -q --target "$T/demo" -o "$T/demo.jsonl" --samples 16 --seed 8 \
    >/dev/null 2>>"$T/fixture.log" || { fail demo_learns_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }

# every answer token (training and held-out data) is the token PERIOD positions back
repeats() { # PERIOD FILE...
python3 - "$@" <<'EOP'
import json, sys
P = int(sys.argv[1])
n = bad = 0
for path in sys.argv[2:]:
    for i, line in enumerate(open(path), 1):
        r = json.loads(line)
        ids, mask = r["input_ids"], r["loss_mask"]
        for t in range(len(ids)):
            if mask[t]:
                n += 1
                bad += ids[t] != ids[t - P]
print("%d of %d answer tokens are not the token %d back" % (bad, n, P))
sys.exit(1 if bad or not n else 0)
EOP
}
check=$(repeats 4 "$T/data.jsonl" "$T/held.jsonl") && ok demo_repeat_continuation || fail demo_repeat_continuation "$check"
check=$(repeats 8 "$T/demo.jsonl") && ok demo_repeat_continuation_make_run_shape ||
    fail demo_repeat_continuation_make_run_shape "$check"

write_config job 300
sed -i "s/^lr = .*/lr = 1e-2/; s/^max_anchors = .*/max_anchors = 32/" "$T/job.ini"
run_job job || { fail demo_learns_job "$(tail -3 "$T/job.out")"; exit 1; }
tau() { # extra eval args; prints tau
    "$BIN/dflash" eval --target "$T/target" --drafter "$T/job/ckpt/latest" --prompts "$T/held.jsonl" --limit 12 \
        --max-new-tokens 24 --json "$@" 2>>"$T/eval.err" | python3 -c 'import json, sys; print(json.load(sys.stdin)["tau"])'
}
u=$(tau --untrained) && t=$(tau) || { fail demo_learns_eval "$(tail -3 "$T/eval.err")"; exit 1; }
echo "# held-out tau (block 4): untrained $u -> trained $t after 300 steps"
# block 4: tau is at most 4; an untrained drafter stays near 1
if python3 -c "import sys; sys.exit(0 if $u < 1.3 and $t >= 2.5 else 1)"; then ok demo_learns_held_out_tau
else fail demo_learns_held_out_tau "untrained $u, trained $t (want < 1.3 and >= 2.5)"; fi

"$BIN/dflash-demo" make-target "$T/small" --kind repeat --hidden 16 --kv-heads 1 --head-dim 4 --heads 2 \
    >"$T/small.out" 2>&1
rc=$?
if [ "$rc" -eq 2 ] && grep -q -- "--kind repeat" "$T/small.out" && grep -q -- "--vocab 512" "$T/small.out"; then
    ok demo_repeat_shape_refused
else fail demo_repeat_shape_refused "exit $rc: $(cat "$T/small.out")"; fi
exit $FAILED
