"""What a user would run instead for a gpt-oss target: transformers' GptOssModel, timed on one GPU.

gpt-oss-20b shape (bench/gpt_oss_20b.h: 24 layers, hidden 2880, 64/8 heads of 64, 32 experts of 2880, top 4,
sliding window 128 on the even layers, sinks, biases, YaRN) with random bf16 weights (the experts as bf16, as
transformers runs a dequantised MXFP4 checkpoint without the triton kernels), one padded batch of the benchmark
sequences (torch_target_anchor.py's: 16 sequences, 19218 tokens), the tapped layers captured by forward hooks, then
the per-sequence pack loop and copy to the host, as torch_target_anchor.py does. Eager attention (transformers'
gpt-oss has no SDPA path), the default experts implementation. Prints tokens/s for the forward alone and for the
whole target step; compare with `bench_target --family gpt_oss` run in the same command.
--lengths N,N,...: another batch (bench/e2e_gpu.sh FAMILY=gpt_oss: --lengths 2936, the one sequence of its run);
the figure lines then name it: "torch gpt_oss [L layers, B x Lmax padded, N tokens] forward alone: ...".
usage: python3 torch_gptoss_anchor.py [--iters 2] [--layers 24] [--lengths 773,1876,...]
"""
import argparse, sys, time

LENGTHS = [773, 1876, 1186, 496, 1599, 909, 2012, 1322, 632, 1735, 1045, 355, 1458, 768, 1871, 1181]   # 19218 tokens
TAPS = [1, 9, 17, 25, 33]

ap = argparse.ArgumentParser()
ap.add_argument("--iters", type=int, default=2)
ap.add_argument("--layers", type=int, default=24)
ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
a = ap.parse_args()
LENGTHS = [int(x) for x in a.lengths.split(",")]
if not LENGTHS or min(LENGTHS) < 1 or a.layers < 1:
    sys.exit(f"torch gpt_oss: --lengths {a.lengths} --layers {a.layers}: expected positive lengths and layers")

try:
    import torch
    import transformers
except ImportError as e:
    print(f"torch gpt_oss: {e.name} is not installed; nothing timed")
    sys.exit(1)
if not hasattr(transformers, "GptOssConfig"):
    print(f"torch gpt_oss: transformers {transformers.__version__} has no gpt_oss model; nothing timed")
    sys.exit(1)

torch.manual_seed(0)
L = a.layers
cfg = transformers.GptOssConfig(
    num_hidden_layers=L, num_local_experts=32, num_experts_per_tok=4, vocab_size=201088, hidden_size=2880,
    intermediate_size=2880, head_dim=64, num_attention_heads=64, num_key_value_heads=8, sliding_window=128,
    layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(L)],
    max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=True,
    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "truncate": False, "original_max_position_embeddings": 4096},
    attn_implementation="eager")
torch.set_default_dtype(torch.bfloat16)
t0 = time.time()
with torch.device("cuda"):
    model = transformers.GptOssModel(cfg).eval()
torch.cuda.synchronize()
ex = model.layers[0].mlp.experts
print(f"torch gpt_oss: transformers {transformers.__version__}, torch {torch.__version__}, {L} layers built in "
      f"{time.time() - t0:.1f} s; experts {type(ex).__name__}, implementation "
      f"{getattr(cfg, '_experts_implementation', None) or 'default'}; attention eager")

taps = [t for t in TAPS if t < L]
cap = {}
for t in taps:
    model.layers[t].register_forward_hook(lambda m, i, o, t=t: cap.__setitem__(t, o[0] if isinstance(o, tuple) else o))
model.layers[L - 1].register_forward_hook(lambda m, i, o: cap.__setitem__("last", o[0] if isinstance(o, tuple) else o))
B, Lmax, ntok = len(LENGTHS), max(LENGTHS), sum(LENGTHS)
ids = torch.randint(0, cfg.vocab_size, (B, Lmax), device="cuda")
mask = torch.zeros(B, Lmax, dtype=torch.long, device="cuda")
for j, n in enumerate(LENGTHS): mask[j, :n] = 1


def forward():
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=mask, use_cache=False)


def pack():
    fc = torch.cat([cap[t] for t in taps], dim=-1)
    parts, last = [], []
    for j, n in enumerate(LENGTHS):
        parts.append(fc[j, :n]); last.append(cap["last"][j, :n])
    return torch.cat(parts).cpu(), torch.cat(last).cpu()


forward(); pack(); torch.cuda.synchronize()   # warm-up
t0 = time.time()
for _ in range(a.iters): forward()
torch.cuda.synchronize()
fwd = (time.time() - t0) / a.iters
t0 = time.time()
for _ in range(a.iters): forward(); pack()
torch.cuda.synchronize()
step = (time.time() - t0) / a.iters
tag = f"[{L} layers, {B} x {Lmax} padded, {ntok} tokens] "
print(f"torch gpt_oss {tag}forward alone: {ntok / fwd:.0f} tok/s ({fwd * 1e3:.1f} ms, {a.iters} iters; padded batch "
      f"{B} x {Lmax})")
print(f"torch gpt_oss {tag}target step (forward + capture + pack + host copy): {ntok / step:.0f} tok/s "
      f"({step * 1e3:.1f} ms); peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
