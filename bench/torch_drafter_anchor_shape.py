"""The PyTorch drafter step (../shared/bench/torch_drafter_anchor.py, run as it is) at another drafter's shape: the
one a dflash drafter checkpoint's config.json gives (hidden, MLP, heads, head_dim, vocabulary, taps, layers, block,
rms eps, rope theta), or the drafter that a job derives from the family's benchmark target when no checkpoint is
given: --family qwen3_5 (default) the Qwen3.5-9B-shaped target's (5 layers, hidden 4096, 16/4 heads of 256, MLP
12288, vocabulary 248320, 5 taps, theta 1e7), --family qwen3_moe the Qwen3-30B-A3B-shaped target's (5 layers, hidden
2048, 32/4 heads of 128, MLP 6144 = the target's intermediate_size, vocabulary 151936, 5 taps, theta 1e6), --family
gpt_oss the gpt-oss-20b-shaped target's (5 layers, hidden 2880, 64/8 heads of 64, MLP 2880 = the target's
intermediate_size, vocabulary 201088, 5 taps, rms eps 1e-5, theta 150000: job_plan.c's derive_drafter keeps the
target's shapes and rope_theta and drops YaRN, sinks, biases and sliding windows, a Qwen3-style drafter). The
anchor's one line of shape constants is replaced before it runs; nothing else of it changes. Used by bench/e2e_gpu.sh.
usage: python3 bench/torch_drafter_anchor_shape.py ANCHOR.py [--family qwen3_5|qwen3_moe|gpt_oss] [--config CKPT/config.json]
       [--heads NH,NKV,HD] [--dry-run] [-- ANCHOR OPTIONS (--seq, --iters, ...)]
--heads replaces the attention shape (same q/kv widths: the same parameters and FLOPs, e.g. 32,8,128 for 16,4,256);
--dry-run prints the replaced line and the anchor's arguments, and runs nothing."""
import json, os, re, sys, tempfile

args = sys.argv[1:]
rest = args[args.index("--") + 1:] if "--" in args else []
args = args[:args.index("--")] if "--" in args else args
if not args or args[0].startswith("-"):
    sys.exit(__doc__)
anchor, opts = args[0], args[1:]
FAMILIES = {   # family: (the drafter a job derives from its benchmark target, that target's name)
    "qwen3_5": (dict(H=4096, I=12288, NH=16, NKV=4, HD=256, V=248320, K=5, EPS=1e-6, THETA=1e7), "Qwen3.5-9B"),
    "qwen3_moe": (dict(H=2048, I=6144, NH=32, NKV=4, HD=128, V=151936, K=5, EPS=1e-6, THETA=1e6), "Qwen3-30B-A3B"),
    "gpt_oss": (dict(H=2880, I=2880, NH=64, NKV=8, HD=64, V=201088, K=5, EPS=1e-5, THETA=150000.0), "gpt-oss-20b"),
}
fam = opts[opts.index("--family") + 1] if "--family" in opts else "qwen3_5"
if fam not in FAMILIES:
    sys.exit(f"torch drafter anchor: --family {fam}: expected one of {', '.join(FAMILIES)}")
shape = dict(FAMILIES[fam][0], layers=5, block=16)
src_of_shape = f"the drafter derived from the {FAMILIES[fam][1]}-shaped target"
dry = "--dry-run" in opts
if "--config" in opts:
    path = opts[opts.index("--config") + 1]
    if os.path.exists(path):
        c = json.load(open(path))
        shape.update(H=c["hidden_size"], I=c["intermediate_size"], NH=c["num_attention_heads"],
                     NKV=c["num_key_value_heads"], HD=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                     V=c["vocab_size"], K=len(c["dflash_config"]["target_layer_ids"]), EPS=float(c["rms_norm_eps"]),
                     THETA=float(c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta", 1e6)),
                     layers=c["num_hidden_layers"], block=c["block_size"])
        src_of_shape = path
    else:
        print(f"torch drafter anchor: no checkpoint config {path}: {src_of_shape} instead", flush=True)
if "--heads" in opts:
    nh, nkv, hd = map(int, opts[opts.index("--heads") + 1].split(","))
    shape.update(NH=nh, NKV=nkv, HD=hd)
    src_of_shape += f" with heads {nh}/{nkv} x {hd}"
src = open(anchor).read()
line = ("H, I, NH, NKV, HD, V, K, EPS, THETA = %(H)d, %(I)d, %(NH)d, %(NKV)d, %(HD)d, %(V)d, %(K)d, %(EPS)r, %(THETA)r"
        % shape)
src, n = re.subn(r"(?m)^H, I, NH, NKV, HD, V, K, EPS, THETA = .*$", line, src)
if n != 1:
    sys.exit(f"torch drafter anchor: {anchor} has no line 'H, I, NH, NKV, HD, V, K, EPS, THETA = ...' to set the "
             f"shape with; not run")
argv = [anchor, "--layers", str(shape["layers"]), "--block", str(shape["block"])] + rest
print(f"torch drafter anchor at the shape of {src_of_shape}: {line}; {' '.join(argv[1:])}", flush=True)
if dry:
    sys.exit(0)
# run as a script of its own (a copy with the line replaced): torch.compile's guards look the anchor's globals up in
# the real __main__ module, which an exec into a fresh namespace is not (dynamo: "module '__main__' has no
# attribute 'B'")
fd, path = tempfile.mkstemp(prefix=os.path.basename(anchor)[:-3] + ".", suffix=".py")
with os.fdopen(fd, "w") as f:
    f.write(src)
os.execv(sys.executable, [sys.executable, path] + argv[1:])
