"""What a user would run instead for a qwen3_moe target: transformers' Qwen3-MoE model, timed on one GPU.

Qwen3-30B-A3B shape (bench/qwen3_30b_a3b.h: 48 layers, hidden 2048, 32/4 heads of 128 with q/k norm, every MLP a
sparse MoE block of 128 experts of width 768, 8 per token, norm_topk_prob, no shared expert, vocab 151936) with random
bf16 weights: transformers' Qwen3MoeForCausalLM built on the GPU with its default attention (sdpa) and its default
experts implementation (the MoE path a user has; printed), timed through its decoder stack (`.model`: the target
step needs the layers' hidden states, not logits, as bench_target computes them) on one padded batch of the benchmark
sequences (torch_target_anchor.py's: 16 sequences, 19218 tokens), the tapped layers captured by forward hooks, then
the per-sequence pack loop and copy to the host, as torch_target_anchor.py does for Qwen3. Prints tokens/s for the
forward alone and for the whole target step; useful FLOPs count the active parameters (the experts a token does not
use left out), as `bench_target --family qwen3_moe` does. Compare with that, run in the same command (one after the
other: the 48-layer model in bf16 is 61 GB, each process holds its own).
--then L:LENGTHS (repeatable): after the main figure, also time the forward of the model's first L layers on another
padded batch (e.g. 16:2936, one sample of bench/e2e.sh at the depth its fixture was cut to), with the same weights.
usage: python3 bench/torch_moe_anchor.py [--layers 48] [--iters 3] [--warmup 2] [--vocab 151936] [--lengths 773,...]
       [--then L:LENGTHS]... [--tflops 790]
"""
import argparse, sys, time

LENGTHS = [773, 1876, 1186, 496, 1599, 909, 2012, 1322, 632, 1735, 1045, 355, 1458, 768, 1871, 1181]   # 19218 tokens
TAPS = [1, 9, 17, 25, 33]

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=48)
ap.add_argument("--iters", type=int, default=3)
ap.add_argument("--warmup", type=int, default=2)
ap.add_argument("--vocab", type=int, default=151936)
ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
ap.add_argument("--then", action="append", default=[], metavar="L:LENGTHS")
ap.add_argument("--tflops", type=float, default=790.0)
a = ap.parse_args()
lengths = [int(x) for x in a.lengths.split(",")]
cuts = []
for c in a.then:
    l, _, ls = c.partition(":")
    if not l.isdigit() or not 1 <= int(l) <= a.layers or not ls:
        sys.exit(f"torch qwen3_moe: --then {c}: expected L:LENGTHS with 1 <= L <= --layers {a.layers}")
    cuts.append((int(l), [int(x) for x in ls.split(",")]))

try:
    import torch
    import transformers
except ImportError as e:
    print(f"torch qwen3_moe: {e.name} is not installed; nothing timed")
    sys.exit(1)
Config = getattr(transformers, "Qwen3MoeConfig", None)
CausalLM = getattr(transformers, "Qwen3MoeForCausalLM", None)
if Config is None or CausalLM is None:
    print(f"torch qwen3_moe: transformers {transformers.__version__} has no Qwen3MoeConfig / Qwen3MoeForCausalLM")
    sys.exit(1)

torch.manual_seed(0)
H, E, K, MI = 2048, 128, 8, 768
cfg = Config(vocab_size=a.vocab, hidden_size=H, intermediate_size=6144, num_hidden_layers=a.layers,
             num_attention_heads=32, num_key_value_heads=4, head_dim=128, max_position_embeddings=40960,
             rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
             tie_word_embeddings=False, decoder_sparse_step=1,
             moe_intermediate_size=MI, num_experts=E, num_experts_per_tok=K, norm_topk_prob=True, mlp_only_layers=[],
             attn_implementation="sdpa")
t0 = time.time()
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = CausalLM(cfg).model.eval()   # the decoder stack; the lm_head stays out of the timed forward
torch.cuda.synchronize()
mlp = model.layers[0].mlp
ex = getattr(mlp, "experts", mlp)
impl = (getattr(cfg, "_experts_implementation", None) or getattr(cfg, "experts_implementation", None) or "default")
print(f"torch qwen3_moe: Qwen3-30B-A3B shape, {a.layers} layers, vocab {a.vocab}; built on the GPU in "
      f"{time.time() - t0:.1f} s; mlp {type(mlp).__name__}, experts {type(ex).__name__}, implementation {impl}; "
      f"attention {cfg._attn_implementation}; transformers {transformers.__version__}, torch {torch.__version__}",
      flush=True)

cap = {}
hooks = []


def hook_layers(n):   # taps below n and the n-th layer's output
    for h in hooks: h.remove()
    hooks.clear()
    for t in [t for t in TAPS if t < n]:
        hooks.append(model.layers[t].register_forward_hook(
            lambda m, i, o, t=t: cap.__setitem__(t, o[0] if isinstance(o, tuple) else o)))
    hooks.append(model.layers[n - 1].register_forward_hook(
        lambda m, i, o: cap.__setitem__("last", o[0] if isinstance(o, tuple) else o)))


def batch(lens):
    B, L = len(lens), max(lens)
    ids = torch.randint(0, cfg.vocab_size, (B, L), device="cuda")
    mask = torch.zeros(B, L, dtype=torch.long, device="cuda")
    for j, n in enumerate(lens): mask[j, :n] = 1
    return ids, mask


def timed(f, iters):
    for _ in range(a.warmup): f()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(iters): f()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / iters


def flops_per_token(n, lens):
    """2 x the active non-embedding parameters of n layers (+ the final norm) + causal attention, as bench_target"""
    per = sum(p.numel() for p in model.layers[0].parameters()) - (E - K) * 3 * H * MI
    attn = 4 * n * 32 * 128 * sum(x * x / 2 for x in lens) / sum(lens)
    return 2 * (per * n + H) + attn


def case(n, lens, step_too):
    ids, mask = batch(lens)
    taps = [t for t in TAPS if t < n]
    hook_layers(n)
    keep = model.layers
    model.layers = keep[:n]   # the first n layers (forward runs over self.layers[:num_hidden_layers])

    def forward():
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=mask, use_cache=False)

    def step():
        forward()
        fc = torch.cat([cap[t] for t in taps], dim=-1)
        parts, last = [], []
        for j, m in enumerate(lens):
            parts.append(fc[j, :m]); last.append(cap["last"][j, :m])
        return torch.cat(parts).cpu(), torch.cat(last).cpu()

    ntok, fpt = sum(lens), flops_per_token(n, lens)
    try:
        tf = timed(forward, a.iters)
        ts = timed(step, a.iters) if step_too else None
    finally:
        model.layers = keep
    tag = f"[{n} layers, {len(lens)} x {max(lens)} padded, {ntok} tokens]"
    print(f"torch qwen3_moe {tag} forward: {ntok / tf:.0f} tok/s ({tf * 1e3:.1f} ms, "
          f"{fpt * ntok / tf / 1e12:.0f} TFLOP/s useful)", flush=True)
    if ts:
        print(f"torch qwen3_moe {tag} target step (forward + pack + host copy): {ntok / ts:.0f} tok/s", flush=True)
    print(f"ideal at {a.tflops:.0f} TFLOP/s: {a.tflops * 1e12 / fpt:.0f} tok/s ({fpt / 1e9:.2f} GFLOP/token)")


case(a.layers, lengths, True)
print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
for n, lens in cuts:
    case(n, lens, False)
