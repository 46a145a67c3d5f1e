#!/usr/bin/env bash
# dflash-prepare --chat end to end with the real tokenizers (build/tokenizers, from `make tokenizers`): the golden
# conversations (tests/goldens/tokenizer/*.json, made with thinking off) as messages JSONL and as ShareGPT JSONL
# become shards whose ids and loss masks equal the goldens' (on 1 and on 3 threads); the chat-template goldens
# (template-*.json: thinking on and off, tools, reasoning) likewise, one run per set of template arguments given
# as --template-arg; bad lines are named file:line with their reason. Skipped (77) without the files.
set -u
BUILD=${BUILD:-build}
GOLDENS=${DFLASH_GOLDENS:-tests/goldens}
PREP=$BUILD/bin/dflash-prepare
TOKS=build/tokenizers
fails=0
ok() { echo "ok $1"; }
fail() { echo "FAIL $1${2:+: $2}"; fails=$((fails + 1)); }
[ -f $TOKS/qwen3/tokenizer.json ] && [ -f $TOKS/llama3/tokenizer.json ] || { echo "no tokenizer files in $TOKS (make tokenizers)"; exit 77; }
tmp=$(mktemp -d /tmp/dflash-prepare-chat-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

for name in qwen3 llama3; do
    golden=$GOLDENS/tokenizer/$name.json
    [ -f "$golden" ] || { fail "chat_$name" "no $golden"; continue; }
    python3 - "$golden" "$tmp/$name" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); out = sys.argv[2]
back = {"user": "human", "assistant": "gpt", "system": "system"}
with open(out + ".jsonl", "w") as f, open(out + ".sharegpt.jsonl", "w") as g:
    for c in d["chats"]:
        f.write(json.dumps({"messages": c["messages"]}) + "\n")
        g.write(json.dumps({"conversations": [{"from": back[m["role"]], "value": m["content"]} for m in c["messages"]]}) + "\n")
    f.write('{"messages": []}\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    f.write('{"messages": [{"role": "robot", "content": "hi"}]}\nnot json\n{"text": "x"}\n')
PY
    for kind in jsonl sharegpt.jsonl; do
        label="chat_${name}_${kind%.jsonl}"
        threads=1; [ "$kind" = jsonl ] || threads=3 # several threads keep the line order
        "$PREP" --chat --tokenizer $TOKS/$name --template-arg enable_thinking=false --threads $threads -o "$tmp/out-$name-$kind" "$tmp/$name.$kind" \
            >"$tmp/stdout" 2>"$tmp/stderr"
        rc=$?
        [ $rc -eq 0 ] || { fail "$label" "exit $rc: $(tail -3 "$tmp/stderr")"; continue; }
        why=$(python3 - "$golden" "$tmp/out-$name-$kind/shard-00000.shard" <<'PY'
import json, struct, sys
d = json.load(open(sys.argv[1])); b = open(sys.argv[2], "rb").read()
hb, n, T = struct.unpack_from("<I", b, 12)[0], *struct.unpack_from("<QQ", b, 16)
off = struct.unpack_from("<%dQ" % (n + 1), b, hb); tok = struct.unpack_from("<%dI" % T, b, hb + 8 * (n + 1))
mask = b[hb + 8 * (n + 1) + 4 * T: hb + 8 * (n + 1) + 5 * T]
if n != len(d["chats"]): print("%d samples, want %d" % (n, len(d["chats"]))); sys.exit()
for i, c in enumerate(d["chats"]):
    if list(tok[off[i]:off[i + 1]]) != c["ids"]: print("sample %d: ids differ" % i); sys.exit()
    if list(mask[off[i]:off[i + 1]]) != c["loss_mask"]: print("sample %d: loss_mask differs" % i); sys.exit()
PY
)
        [ -z "$why" ] && ok "$label" || fail "$label" "$why"
    done
    f=$tmp/$name.jsonl; n=$(python3 -c "import json;print(len(json.load(open('$golden'))['chats']))")
    "$PREP" --chat --tokenizer $TOKS/$name --template-arg enable_thinking=false --force -o "$tmp/out-$name-jsonl" "$f" \
        >"$tmp/stdout" 2>"$tmp/stderr"
    e=$(cat "$tmp/stderr")
    if [[ "$e" == *"$f:$((n + 1)): skipped: empty conversation"* && "$e" == *"$f:$((n + 2)): skipped: no assistant turn"* &&
          "$e" == *"$f:$((n + 3)): skipped: unknown role"*robot* && "$e" == *"$f:$((n + 4)): skipped: invalid JSON"* &&
          "$e" == *"$f:$((n + 5)): skipped: neither messages nor conversations"* ]]; then ok "chat_${name}_bad_lines"
    else fail "chat_${name}_bad_lines" "$e"; fi
done
"$PREP" --chat -o "$tmp/x" "$tmp/qwen3.jsonl" >/dev/null 2>&1
[ $? -eq 2 ] && ok chat_needs_tokenizer || fail chat_needs_tokenizer "exit not 2"
# without --tokenizer, -c JOB.ini takes the job's target folder: the same shards
# the chat-template goldens: every chat's ids and mask, grouped by template arguments (one prepare run per group)
for name in qwen3 qwen2_5 llama3 llama3_1 llama3_2 gptoss; do
    golden=$GOLDENS/tokenizer/template-$name.json
    [ -f "$golden" ] && [ -f $TOKS/$name/tokenizer.json ] || { echo "no $golden or $TOKS/$name (make tokenizers)"; continue; }
    groups=$(python3 - "$golden" "$tmp/tpl-$name" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); groups = {}
for i, c in enumerate(d["chats"]):
    groups.setdefault(json.dumps(c["args"], sort_keys=True), []).append(i)
for g, (args, idx) in enumerate(sorted(groups.items())):
    with open("%s-%d.jsonl" % (sys.argv[2], g), "w") as f:
        for i in idx:
            c = d["chats"][i]; line = {"messages": c["messages"]}
            if "tools" in c: line["tools"] = c["tools"]
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    json.dump(idx, open("%s-%d.idx" % (sys.argv[2], g), "w"))
    with open("%s-%d.args" % (sys.argv[2], g), "w") as f:  # one argument a line (values may hold spaces)
        for k, v in json.loads(args).items(): f.write("--template-arg\n%s=%s\n" % (k, json.dumps(v)))
    print(g, " ".join("%s=%s" % (k, json.dumps(v)) for k, v in json.loads(args).items()))
PY
)
    while read -r g shown; do
        label="chat_template_${name}_$g${shown:+ ($shown)}"
        mapfile -t targs <"$tmp/tpl-$name-$g.args"
        "$PREP" --chat --tokenizer $TOKS/$name "${targs[@]}" --threads 2 -o "$tmp/tpl-out-$name-$g" "$tmp/tpl-$name-$g.jsonl" \
            >"$tmp/stdout" 2>"$tmp/stderr" || { fail "$label" "exit $?: $(tail -3 "$tmp/stderr")"; continue; }
        why=$(python3 - "$golden" "$tmp/tpl-out-$name-$g/shard-00000.shard" "$tmp/tpl-$name-$g.idx" <<'PY'
import json, struct, sys
d = json.load(open(sys.argv[1])); b = open(sys.argv[2], "rb").read(); idx = json.load(open(sys.argv[3]))
hb, n, T = struct.unpack_from("<I", b, 12)[0], *struct.unpack_from("<QQ", b, 16)
off = struct.unpack_from("<%dQ" % (n + 1), b, hb); tok = struct.unpack_from("<%dI" % T, b, hb + 8 * (n + 1))
mask = b[hb + 8 * (n + 1) + 4 * T: hb + 8 * (n + 1) + 5 * T]
if n != len(idx): print("%d samples, want %d" % (n, len(idx))); sys.exit()
for s, i in enumerate(idx):
    c = d["chats"][i]
    if list(tok[off[s]:off[s + 1]]) != c["ids"]: print("chat %d: ids differ" % i); sys.exit()
    if list(mask[off[s]:off[s + 1]]) != c["loss_mask"]: print("chat %d: loss_mask differs" % i); sys.exit()
print("")
PY
)
        [ -z "$why" ] && ok "$label" || fail "$label" "$why"
    done <<<"$groups"
done
printf '[job]\nname = chat\nrun_dir = %s/run\n[data]\npath = %s/data\n[target]\nmodel = %s\n' "$tmp" "$tmp" "$TOKS/qwen3" >"$tmp/job.ini"
"$PREP" --chat -c "$tmp/job.ini" --template-arg enable_thinking=false --threads 2 -o "$tmp/out-cfg" "$tmp/qwen3.jsonl" >/dev/null 2>"$tmp/stderr" &&
    cmp -s "$tmp/out-cfg/shard-00000.shard" "$tmp/out-qwen3-jsonl/shard-00000.shard" && ok chat_tokenizer_from_job_config ||
    fail chat_tokenizer_from_job_config "$(tail -2 "$tmp/stderr")"
[ $fails -eq 0 ]
