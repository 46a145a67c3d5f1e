"""What a user would run instead for a hybrid target: transformers' Qwen3.5 text model, timed on one GPU.

Qwen3.5-9B shape (32 layers, hidden 4096, 3 Gated DeltaNet : 1 gated attention, 16/4 attention heads of 256, linear
heads 16 q/k x 32 v of 128, conv kernel 4, FFN 12288) with random bf16 weights, one padded batch of the benchmark
sequences (the batch of torch_target_anchor.py: 16 sequences, 19218 tokens), the tapped layers captured by forward
hooks, then the per-sequence pack loop and copy to the host, as torch_target_anchor.py does for Qwen3. The linear-
attention layers run on transformers' torch fallback (flash-linear-attention and causal-conv1d blocked from
importing) and, when flash-linear-attention imports, on its kernels too: each path in its own process.
Prints tokens/s for the forward alone and for the whole target step. Compare with
`bench_target --family qwen3_5` run in the same command.
--family qwen3_5_moe: the Qwen3.5-35B-A3B shape instead (bench/qwen35_a3b.h: 40 layers, hidden 2048, 16/2 attention
heads of 256, every MLP a sparse MoE block of 256 experts of width 512, 8 routed + 1 gated shared expert of width
512), transformers' Qwen3_5MoeTextModel with its default experts implementation; useful FLOPs count the active
parameters (the routed experts a token does not use left out), as bench_target does. Compare with
`bench_target --family qwen3_5_moe`.
usage: python3 torch_hybrid_anchor.py [--family qwen3_5|qwen3_5_moe] [--path both|torch|fla] [--iters 3]
       [--layers 32|40] [--vocab 248320]
       [--lengths 773,1876,...]   (the batch's sequence lengths; default the benchmark batch; e2e_gpu.sh
                                   gives one ~3000-token sample, the batch of bench/e2e.sh)
"""
import argparse, os, subprocess, sys

LENGTHS = [773, 1876, 1186, 496, 1599, 909, 2012, 1322, 632, 1735, 1045, 355, 1458, 768, 1871, 1181]   # 19218 tokens
TAPS = [1, 9, 17, 25, 33]

ap = argparse.ArgumentParser()
ap.add_argument("--family", choices=["qwen3_5", "qwen3_5_moe"], default="qwen3_5")
ap.add_argument("--path", choices=["both", "torch", "fla"], default="both")
ap.add_argument("--tflops", type=float, default=790.0)
ap.add_argument("--iters", type=int, default=3)
ap.add_argument("--layers", type=int, default=0)   # 0: the shape's (32 dense, 40 MoE)
ap.add_argument("--vocab", type=int, default=248320)
ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
a = ap.parse_args()
moe = a.family == "qwen3_5_moe"
a.layers = a.layers or (40 if moe else 32)
LENGTHS = [int(x) for x in a.lengths.split(",")]

if a.path == "both":   # one process per path: blocking an import must happen before transformers binds its kernels
    rc = 0
    for p in ("torch", "fla"):
        argv = [sys.executable, os.path.abspath(__file__), "--family", a.family, "--path", p, "--tflops", str(a.tflops), "--iters",
                str(a.iters), "--layers", str(a.layers), "--vocab", str(a.vocab), "--lengths", a.lengths]
        rc |= subprocess.call(argv)
    sys.exit(rc)

if a.path == "torch":
    for _m in ("fla", "causal_conv1d"):   # None in sys.modules => the import fails => the torch fallbacks are bound
        sys.modules[_m] = None
else:
    try:
        import fla  # noqa: F401
    except Exception as e:  # noqa: BLE001
        print(f"torch hybrid [fla]: flash-linear-attention is not importable here ({type(e).__name__}: {e}); "
              f"skipped (pip install flash-linear-attention to time it)")
        sys.exit(0)

import time
try:
    import torch
    import transformers
except ImportError as e:
    print(f"torch hybrid: {e.name} is not installed; nothing timed")
    sys.exit(1)
pre = "Qwen3_5Moe" if moe else "Qwen3_5"
Config = getattr(transformers, pre + "TextConfig", None)
Model = getattr(transformers, pre + "TextModel", None)
CausalLM = getattr(transformers, pre + "ForCausalLM", None)
if Config is None or (Model is None and CausalLM is None):
    print(f"torch hybrid: transformers {transformers.__version__} has no {pre} text model ({pre}TextConfig / "
          f"{pre}TextModel / {pre}ForCausalLM); it needs transformers >= 5 with the {a.family} model; nothing timed")
    sys.exit(1)

torch.manual_seed(0)
layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(a.layers)]
shape = dict(hidden_size=4096, intermediate_size=12288, num_key_value_heads=4)
if moe:   # Qwen3.5-35B-A3B (transformers' Qwen3_5MoeTextConfig defaults, spelled out)
    shape = dict(hidden_size=2048, num_key_value_heads=2, num_experts=256, num_experts_per_tok=8,
                 moe_intermediate_size=512, shared_expert_intermediate_size=512)
cfg = Config(**shape, num_hidden_layers=a.layers, layer_types=layer_types,
             num_attention_heads=16, head_dim=256, linear_num_key_heads=16,
             linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
             vocab_size=a.vocab, rms_norm_eps=1e-6, max_position_embeddings=262144, tie_word_embeddings=False,
             rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                              "mrope_section": [11, 11, 10], "mrope_interleaved": True},
             attn_implementation="sdpa")
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = (Model(cfg) if Model is not None else CausalLM(cfg).model).eval()

if moe:   # which experts implementation transformers runs
    ex = getattr(model.layers[0].mlp, "experts", model.layers[0].mlp)
    print(f"torch hybrid [{a.path}]: experts {type(ex).__name__}, implementation "
          f"{getattr(cfg, '_experts_implementation', None) or getattr(cfg, 'experts_implementation', None) or 'default'}")
if a.path == "torch":   # say which linear-attention kernels transformers bound
    mod = sys.modules[type(model.layers[0].linear_attn).__module__]
    fn = getattr(model.layers[0].linear_attn, "chunk_gated_delta_rule", None)
    print(f"torch hybrid [torch]: chunk_gated_delta_rule = {getattr(fn, '__name__', fn)} ({mod.__name__})")

taps = [t for t in TAPS if t < a.layers]
cap = {}
for t in taps:
    model.layers[t].register_forward_hook(lambda m, i, o, t=t: cap.__setitem__(t, o[0] if isinstance(o, tuple) else o))
model.layers[a.layers - 1].register_forward_hook(lambda m, i, o: cap.__setitem__("last", o[0] if isinstance(o, tuple) else o))
B, L, ntok = len(LENGTHS), max(LENGTHS), sum(LENGTHS)
ids = torch.randint(0, cfg.vocab_size, (B, L), device="cuda")
mask = torch.zeros(B, L, dtype=torch.long, device="cuda")
for j, n in enumerate(LENGTHS): mask[j, :n] = 1


def forward():
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=mask, use_cache=False)


def pack():
    fc = torch.cat([cap[t] for t in taps], dim=-1)
    parts, last = [], []
    for j, n in enumerate(LENGTHS):
        parts.append(fc[j, :n]); last.append(cap["last"][j, :n])
    return torch.cat(parts), torch.cat(last)


def step():
    forward(); aux, last = pack(); return aux.cpu(), last.cpu()


def timed(f):
    for _ in range(2): f()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(a.iters): f()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / a.iters


# FLOPs as bench_target counts them: 2 x non-embedding parameters + softmax attention of the full-attention layers
nonembed = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n)
if moe:   # the active parameters: the routed experts a token does not use left out
    nonembed -= a.layers * (cfg.num_experts - cfg.num_experts_per_tok) * 3 * cfg.hidden_size * cfg.moe_intermediate_size
nfull = sum(1 for t in layer_types if t == "full_attention")
attn = 4 * nfull * 16 * 256 * sum(n * n / 2 for n in LENGTHS) / ntok
flops_tok = 2 * nonembed + attn
tf = timed(forward)
ts = timed(step)
print(f"torch hybrid [{a.path}]: {a.family}{' (Qwen3.5-35B-A3B shape)' if moe else ''}; batch {B} sequences, {ntok} tokens, padded to {L}; {a.layers} layers ({nfull} full "
      f"attention), vocab {a.vocab}; transformers {transformers.__version__}, torch {torch.__version__}")
print(f"torch hybrid [{a.path}] forward: {ntok / tf:.0f} tok/s ({tf * 1e3:.0f} ms, "
      f"{flops_tok * ntok / tf / 1e12:.0f} TFLOP/s useful)")
print(f"torch hybrid [{a.path}] target step (forward + pack + host copy): {ntok / ts:.0f} tok/s")
print(f"ideal at {a.tflops:.0f} TFLOP/s: {a.tflops * 1e12 / flops_tok:.0f} tok/s ({flops_tok / 1e9:.2f} GFLOP/token)")
print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
