#!/usr/bin/env bash
# dflash eval (issue 12) on the demo fixture: a drafter trained by a short `dflash run`, and the untrained drafter of
# the same job (its step-0 weights, --untrained): speculative decoding commits exactly the target-only greedy
# tokens, and the walk over the text (the target's own greedy continuation, dflash-demo make-data) gives the same
# accepted lengths block by block, on held-out prompts and on training prompts (where the trained drafter gets
# whole blocks accepted); training raises tau above the untrained drafter's. Bad input: a drafter
# made for another target (hidden size, vocab, tap layers), a prompt longer than the cache, an empty prompt file, a
# walk over a text that is not the target's greedy continuation: exit 1 with the file and field named.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
EVAL=("$BIN/dflash" eval)
make_fixture || { fail eval_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
write_config job 600
sed -i 's/^checkpoint_every = .*/checkpoint_every = 0/; s/^lr = .*/lr = 1e-2/' "$T/job.ini"
run_job job || { fail eval_job "$(tail -3 "$T/job.out")"; exit 1; }
CK=$T/job/ckpt/latest
# held-out prompts: other seeds than the training data's, answered by the target's greedy decoding
"$BIN/dflash-demo" make-data -q --target "$T/target" -o "$T/held.jsonl" --samples 12 --answer-len 24 --seed 9 \
    >/dev/null 2>>"$T/fixture.log" || { fail eval_held_out "$(tail -3 "$T/fixture.log")"; exit 1; }

for c in "trained held" "untrained held --untrained" "trained train" "untrained train --untrained"; do
    set -- $c
    name=$1_$2 file=$T/held.jsonl
    [ "$2" = train ] && file=$T/data.jsonl
    shift 2
    # decode and walk of one drafter on 12 prompts; $T/NAME.cmp gets "tau T, blocks N, longest L", or what differs
    if LIMIT=12 NEW=24 decode_equals_walk "$T/target" "$CK" "$file" "$T/$name" 0 "$@" >"$T/$name.cmp"
    then ok "eval_${name}_decode_and_walk_agree"
    else fail "eval_${name}_decode_and_walk_agree" "$(cat "$T/$name.cmp")"; fi
done
cmp_field() { sed -n "s/.*$2 \([0-9.]*\).*/\1/p" "$T/$1.cmp"; } # cmp_field NAME tau|longest
tau_th=$(cmp_field trained_held tau) max_th=$(cmp_field trained_held longest) tau_uh=$(cmp_field untrained_held tau)
tau_tt=$(cmp_field trained_train tau) max_tt=$(cmp_field trained_train longest) tau_ut=$(cmp_field untrained_train tau)
echo "# tau, held-out prompts: trained $tau_th (longest block $max_th), untrained $tau_uh;" \
    "training prompts: trained $tau_tt (longest block $max_tt), untrained $tau_ut; $(grep simulated "$T/job.out")"
if python3 -c "import sys; sys.exit(0 if $tau_tt > $tau_ut + 0.3 and $max_tt >= 3 else 1)" 2>/dev/null
then ok eval_training_raises_tau; else fail eval_training_raises_tau "trained $tau_tt (longest block $max_tt), untrained $tau_ut"; fi
# --untrained is the job's step-0 drafter: the job's seed, and the same as --init-seed with it
"${EVAL[@]}" --target "$T/target" --drafter "$CK" --prompts "$T/held.jsonl" --max-new-tokens 24 --json --init-seed 77 \
    >"$T/seed.json" 2>&1
if python3 -c "import json,sys; a=json.load(open('$T/seed.json')); b=json.load(open('$T/untrained_held.decode.json')); sys.exit(0 if a['per_prompt']==b['per_prompt'] and 'seed 77' in b['weights'] else 1)" 2>/dev/null
then ok eval_untrained_is_job_seed; else fail eval_untrained_is_job_seed "$(head -c 300 "$T/seed.json")"; fi

# --eos: generation stops at the first EOS, decoding and walk alike (an answer token of line 1 serves as EOS)
read -r eos first < <(python3 -c "import json
r = json.loads(open('$T/data.jsonl').readline()); a = r['input_ids'][r['loss_mask'].index(1):]
print(a[5], a.index(a[5]) + 1)")
for m in decode walk; do
    w=; [ $m = walk ] && w=--walk
    "${EVAL[@]}" --target "$T/target" --drafter "$CK" --prompts "$T/data.jsonl" --limit 6 --max-new-tokens 24 \
        --eos "$eos" --json $w >"$T/eos.$m.json" 2>&1
done
if python3 -c "import json, sys
d, w = (json.load(open('$T/eos.%s.json' % m)) for m in ('decode', 'walk'))
p = d['per_prompt']
sys.exit(0 if p == w['per_prompt'] and p[0]['new_tokens'] == $first and d['outputs_differ'] == 0 else 1)" 2>/dev/null
then ok eval_eos_stops_decode_and_walk_alike; else fail eval_eos_stops_decode_and_walk_alike "$(head -c 400 "$T/eos.decode.json")"; fi

# the table for people
out=$("${EVAL[@]}" --target "$T/target" --drafter "$CK" --prompts "$T/held.jsonl" --limit 3 --max-new-tokens 10 2>&1)
if [[ "$out" == *"tau (acceptance length)"* && "$out" == *"3 prompts"* && "$out" == *"speedup"* &&
      "$out" == *"per-slot acceptance"* && "$out" == *"identical to target-only greedy"* ]]; then ok eval_table
else fail eval_table "$out"; fi

# bad input: exit 1, the file and the field named
expect_error() { # name, grep patterns..., -- args
    local name=$1 pats=()
    shift
    while [ "$1" != -- ]; do pats+=("$1"); shift; done
    shift
    local out rc
    out=$("${EVAL[@]}" "$@" 2>&1); rc=$?
    for p in "${pats[@]}"; do [[ "$out" == *"$p"* ]] || { fail "$name" "exit $rc: $out (want \"$p\")"; return; }; done
    [ $rc = 1 ] && ok "$name" || fail "$name" "exit $rc: $out"
}
variant() { # dir, python expression on the config dict c
    mkdir -p "$1" && cp "$CK/model.safetensors" "$1/" &&
    python3 -c "import json; c=json.load(open('$CK/config.json')); $2; json.dump(c, open('$1/config.json','w'))"
}
variant "$T/d_hidden" "c['hidden_size']=48"
variant "$T/d_vocab" "c['vocab_size']=300"
variant "$T/d_taps" "c['num_target_layers']=8; c['dflash_config']['target_layer_ids']=[1,6]"
variant "$T/d_layers" "c['num_target_layers']=8"
A=(--target "$T/target" --prompts "$T/held.jsonl")
expect_error eval_bad_hidden_size "$T/d_hidden/config.json" hidden_size "the target's 32" -- "${A[@]}" --drafter "$T/d_hidden"
expect_error eval_bad_vocab "$T/d_vocab/config.json" vocab_size "the target's 256" -- "${A[@]}" --drafter "$T/d_vocab"
expect_error eval_bad_taps "$T/d_taps/config.json" "target_layer_ids[1] = 6" "4 layers" -- "${A[@]}" --drafter "$T/d_taps"
expect_error eval_bad_target_layers "$T/d_layers/config.json" num_target_layers "num_hidden_layers 4" -- \
    "${A[@]}" --drafter "$T/d_layers"
line=$(grep -n . "$T/held.jsonl" | python3 -c "import sys,json
for l in sys.stdin:
    n, j = l.split(':', 1); m = json.loads(j)['loss_mask']
    if m.index(1) + 24 > 40: print(n); break")
expect_error eval_prompt_longer_than_cache "$T/held.jsonl:$line" input_ids "--cache-len" -- "${A[@]}" --drafter "$CK" \
    --max-new-tokens 24 --cache-len 40
: >"$T/empty.jsonl"
echo >>"$T/blank.jsonl"
expect_error eval_empty_prompt_file "$T/empty.jsonl" "no prompt" -- --target "$T/target" --drafter "$CK" --prompts "$T/empty.jsonl"
expect_error eval_blank_prompt_file "$T/blank.jsonl" "no prompt" -- --target "$T/target" --drafter "$CK" --prompts "$T/blank.jsonl"
printf '{"input_ids": [1, 2]}\n{"input_ids": [1, 2], "loss_mask": [1, 1]}\n' >"$T/noprompt.jsonl"
expect_error eval_line_without_prompt "$T/noprompt.jsonl:2" "loss_mask[0]" -- --target "$T/target" --drafter "$CK" \
    --prompts "$T/noprompt.jsonl"
echo '{"input_ids": [1, 2, 999]}' >"$T/badid.jsonl"
expect_error eval_prompt_id_outside_vocab "$T/badid.jsonl:1" "input_ids[2] = 999" -- --target "$T/target" --drafter "$CK" \
    --prompts "$T/badid.jsonl"
# a walk over text that is not the target's greedy continuation (the data set's answers with one token changed)
python3 -c "import json
r = json.loads(open('$T/held.jsonl').readline()); r['input_ids'][-1] = (r['input_ids'][-1] + 1) % 255
print(json.dumps(r))" >"$T/notgreedy.jsonl"
expect_error eval_walk_needs_greedy_text "$T/notgreedy.jsonl:1" "greedy" -- --target "$T/target" --drafter "$CK" \
    --prompts "$T/notgreedy.jsonl" --walk
out=$("${EVAL[@]}" --target "$T/target" --prompts "$T/held.jsonl" 2>&1); rc=$?
[ $rc = 2 ] && [[ "$out" == *"--drafter"* ]] && ok eval_usage_error || fail eval_usage_error "exit $rc: $out"
out=$("${EVAL[@]}" --help 2>&1); rc=$?
[ $rc = 0 ] && [[ "$out" == *"--max-new-tokens"* && "$out" == *"--walk"* ]] && ok eval_help || fail eval_help "exit $rc: $out"
exit $FAILED
