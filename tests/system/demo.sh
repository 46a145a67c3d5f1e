#!/usr/bin/env bash
# dflash-demo end to end: make-target writes a Qwen3 config.json with the fields transformers writes and a
# safetensors file listing every tensor with its transformers name and shape (same names and shapes as the tiny
# golden target when it is there); make-data writes well-formed, masked, reproducible samples whose answers are
# not one repeated token; usage errors exit 2 and name the flag. Run from the repo root; expects
# ${BUILD:-build}/bin/dflash-demo.
set -u
BUILD=${BUILD:-build}
DEMO=$BUILD/bin/dflash-demo
GOLDEN=${GOLDEN:-${DFLASH_GOLDENS:-tests/goldens}/tiny/target}
fails=0
ok() { echo "ok $1"; }
fail() { echo "FAIL $1${2:+: $2}"; fails=$((fails + 1)); }
check() { # name, condition (evaluated), detail on failure
    if eval "$2"; then ok "$1"; else fail "$1" "${3:-}"; fi
}

if [ ! -x "$DEMO" ]; then
    fail demo_binary "$DEMO not found (build it first)"
    exit 1
fi
tmp=$(mktemp -d /tmp/dflash-demo-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# ---- make-target ----
"$DEMO" make-target "$tmp/target" --seed 7 >"$tmp/out" 2>&1
rc=$?
check target_exit_0 '[ "$rc" -eq 0 ] && [ -f "$tmp/target/config.json" ] && [ -f "$tmp/target/model.safetensors" ]' \
    "exit $rc: $(cat "$tmp/out")"

# Prints nothing when the config and the tensors are right, else one line per problem. $3: golden dir or "".
cat >"$tmp/check_target.py" <<'EOF'
import json, struct, sys
d, dtype, golden = sys.argv[1], sys.argv[2], sys.argv[3]
cfg = json.load(open(d + "/config.json"))
want = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 160,
        "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rms_norm_eps": 1e-6, "rope_theta": 1e6, "vocab_size": 512, "max_position_embeddings": 4096,
        "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
        "torch_dtype": {"F32": "float32", "BF16": "bfloat16"}[dtype]}
for k, v in want.items():
    if cfg.get(k) != v or type(cfg.get(k)) != type(v):
        print("config.json: %s = %r, want %r" % (k, cfg.get(k), v))
def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        f.seek(0, 2)
        return h, 8 + n, f.tell()
h, base, size = header(d + "/model.safetensors")
h.pop("__metadata__", None)
H, I, V, hd, qd, kd = 64, 160, 512, 16, 64, 32
exp = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H], "lm_head.weight": [V, H]}
for i in range(8):
    p = "model.layers.%d." % i
    exp.update({p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
                p + "self_attn.q_proj.weight": [qd, H], p + "self_attn.k_proj.weight": [kd, H],
                p + "self_attn.v_proj.weight": [kd, H], p + "self_attn.o_proj.weight": [H, qd],
                p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd],
                p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H], p + "mlp.down_proj.weight": [H, I]})
for k in sorted(set(exp) | set(h)):
    if k not in h: print("model.safetensors: missing " + k)
    elif k not in exp: print("model.safetensors: unexpected " + k)
    elif h[k]["shape"] != exp[k] or h[k]["dtype"] != dtype:
        print("model.safetensors: %s is %s %s, want %s %s" % (k, h[k]["dtype"], h[k]["shape"], dtype, exp[k]))
esize = {"F32": 4, "BF16": 2}[dtype]
total = sum(esize * (s[0] * (s[1] if len(s) > 1 else 1)) for s in exp.values())
if size - base != total: print("model.safetensors: %d data bytes, want %d" % (size - base, total))
if golden:
    g, _, _ = header(golden + "/model.safetensors")
    g.pop("__metadata__", None)
    gs = {k: v["shape"] for k, v in g.items()}
    ms = {k: v["shape"] for k, v in h.items()}
    if gs != ms: print("names/shapes differ from the golden target %s" % golden)
    gc = json.load(open(golden + "/config.json"))
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "vocab_size", "model_type", "architectures", "tie_word_embeddings", "rms_norm_eps"):
        if gc.get(k) != cfg.get(k): print("config.json: %s = %r, golden has %r" % (k, cfg.get(k), gc.get(k)))
EOF
g=""; [ -f "$GOLDEN/model.safetensors" ] && g=$GOLDEN
python3 "$tmp/check_target.py" "$tmp/target" F32 "$g" >"$tmp/problems" 2>&1
check target_config_and_tensors '[ ! -s "$tmp/problems" ]' "$(head -5 "$tmp/problems")"

"$DEMO" make-target "$tmp/target2" --seed 7 >/dev/null 2>&1
check target_deterministic 'cmp -s "$tmp/target/model.safetensors" "$tmp/target2/model.safetensors" &&
    cmp -s "$tmp/target/config.json" "$tmp/target2/config.json"'
"$DEMO" make-target "$tmp/target3" --seed 8 >/dev/null 2>&1
check target_seed_matters '! cmp -s "$tmp/target/model.safetensors" "$tmp/target3/model.safetensors"'

"$DEMO" make-target "$tmp/bf16" --seed 7 --dtype bf16 >"$tmp/out" 2>&1
rc=$?
python3 "$tmp/check_target.py" "$tmp/bf16" BF16 "" >"$tmp/problems" 2>&1
check target_bf16 '[ "$rc" -eq 0 ] && [ ! -s "$tmp/problems" ]' "exit $rc: $(cat "$tmp/out") $(head -5 "$tmp/problems")"

# ---- make-data ----
data=$tmp/data.jsonl
"$DEMO" make-data --target "$tmp/target" -o "$data" --samples 16 --seed 3 >"$tmp/out" 2>"$tmp/err"
rc=$?
check data_exit_0 '[ "$rc" -eq 0 ] && [ "$(wc -l <"$data")" -eq 16 ]' "exit $rc: $(cat "$tmp/err")"
check data_summary 'grep -q "16 samples" "$tmp/out" && grep -q "distinct-answer-token ratio" "$tmp/out"' \
    "$(cat "$tmp/out")"

# Checks every line: same lengths, prompt (8..24 tokens, ids < 511) masked, 48 answer tokens trained, ids < 511;
# answers not all one repeated token, and not all the same answer.
cat >"$tmp/check_data.py" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
answers = []
for n, r in enumerate(rows, 1):
    ids, m = r["input_ids"], r["loss_mask"]
    if len(ids) != len(m): print("line %d: %d ids, %d mask entries" % (n, len(ids), len(m))); continue
    p = m.index(1) if 1 in m else len(m)
    if not (8 <= p <= 24) or m != [0] * p + [1] * (len(m) - p) or len(m) - p != 48:
        print("line %d: mask is not 0 x prompt (8..24) then 1 x 48" % n)
    if any(not isinstance(i, int) or i < 0 or i >= 511 for i in ids): print("line %d: id outside [0, 511)" % n)
    answers.append(tuple(ids[p:]))
if all(len(set(a)) == 1 for a in answers): print("every answer is one repeated token")
if len(set(answers)) < 2: print("every answer is the same")
mean = sum(len(set(a)) / len(a) for a in answers) / max(len(answers), 1)
if mean < 0.2: print("mean distinct-token ratio of the answers is %.3f" % mean)
EOF
python3 "$tmp/check_data.py" "$data" >"$tmp/problems" 2>&1
check data_lines_well_formed '[ ! -s "$tmp/problems" ]' "$(head -5 "$tmp/problems")"

"$DEMO" make-data -q --target "$tmp/target" -o "$tmp/data2.jsonl" --samples 16 --seed 3 >/dev/null 2>&1
check data_deterministic 'cmp -s "$data" "$tmp/data2.jsonl"'
"$DEMO" make-data -q --target "$tmp/target" -o "$tmp/data3.jsonl" --samples 16 --seed 3 --threads 1 --batch 5 \
    >/dev/null 2>&1
check data_same_any_batching 'cmp -s "$data" "$tmp/data3.jsonl"'
"$DEMO" make-data -q --target "$tmp/target" -o "$tmp/data4.jsonl" --samples 16 --seed 4 >/dev/null 2>&1
check data_seed_matters '! cmp -s "$data" "$tmp/data4.jsonl"'
check data_no_tmp_left '[ -z "$(ls "$tmp" | grep "\.tmp$")" ]'

# Shards from the data, when dflash-prepare is built.
if [ -x "$BUILD/bin/dflash-prepare" ]; then
    "$BUILD/bin/dflash-prepare" -o "$tmp/shards" --vocab 512 --strict "$data" >"$tmp/out" 2>&1
    rc=$?
    check data_prepares '[ "$rc" -eq 0 ] && grep -q "^prepared 16 samples" "$tmp/out"' "exit $rc: $(cat "$tmp/out")"
fi

# ---- errors ----
"$DEMO" make-data --target "$tmp/nowhere" -o "$tmp/x.jsonl" --samples 2 >"$tmp/out" 2>&1
rc=$?
check data_missing_target_names_it '[ "$rc" -eq 1 ] && grep -q "$tmp/nowhere" "$tmp/out" && [ ! -e "$tmp/x.jsonl" ]' \
    "exit $rc: $(cat "$tmp/out")"
"$DEMO" make-target "$tmp/t4" --kv-heads 3 >"$tmp/out" 2>&1
rc=$?
check target_bad_kv_heads '[ "$rc" -eq 2 ] && grep -q -- "--kv-heads" "$tmp/out"' "exit $rc: $(cat "$tmp/out")"
"$DEMO" make-target "$tmp/t4" --dtype f16 >"$tmp/out" 2>&1
rc=$?
check target_bad_dtype '[ "$rc" -eq 2 ] && grep -q -- "--dtype" "$tmp/out"' "exit $rc: $(cat "$tmp/out")"
"$DEMO" make-data --target "$tmp/target" -o "$tmp/x.jsonl" --prompt-len 9:3 >"$tmp/out" 2>&1
rc=$?
check data_bad_prompt_len '[ "$rc" -eq 2 ] && grep -q -- "--prompt-len" "$tmp/out"' "exit $rc: $(cat "$tmp/out")"
"$DEMO" make-data -o "$tmp/x.jsonl" >"$tmp/out" 2>&1
rc=$?
check data_missing_target_flag '[ "$rc" -eq 2 ] && grep -q -- "--target" "$tmp/out"' "exit $rc: $(cat "$tmp/out")"
"$DEMO" frobnicate >"$tmp/out" 2>&1
rc=$?
check demo_unknown_command '[ "$rc" -eq 2 ] && grep -q "frobnicate" "$tmp/out"' "exit $rc: $(cat "$tmp/out")"
"$DEMO" --help >"$tmp/h0" 2>&1 && "$DEMO" make-target --help >"$tmp/h1" 2>&1 &&
    "$DEMO" make-data --help >"$tmp/h2" 2>&1
rc=$?
check demo_help '[ "$rc" -eq 0 ] && grep -q make-data "$tmp/h0" && grep -q -- "--kv-heads" "$tmp/h1" &&
    grep -q -- "--answer-len" "$tmp/h2"'

exit $((fails > 0))
