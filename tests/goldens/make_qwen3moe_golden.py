"""Golden cases for a tiny Qwen3-MoE target (qwen3_moe: Qwen3 attention with q/k norm, GQA and RoPE; a sparse MoE
MLP with a softmax router, top-k with norm_topk_prob, SwiGLU experts and no shared expert; a dense MLP on the layers
mlp_only_layers names and where (i+1) % decoder_sparse_step != 0), computed with transformers' own
modeling_qwen3_moe.py, random seeded weights, no network.

usage: python3 make_qwen3moe_golden.py OUTDIR [CASE ...]   cases: qwen3moe-tiny (fp32), qwen3moe-tiny-bf16
Writes OUTDIR/CASE/target/ (config.json + model.safetensors, by save_pretrained) and OUTDIR/CASE/case.safetensors
in the layout of tests/goldens/README.md, target part only (input_ids, position_ids, cu_seqlens [i32];
target.aux_hidden [T,K*H], target.last_hidden [T,H] = output of the last layer BEFORE the final norm,
target.logits [T,V]); its __metadata__["json"] holds target_layer_ids (taps) and checks. As make_goldens.py's
tiny-bf16, the bf16 case stores bf16 weights and its expected values are the fp32 forward of those weights (the
model cast to bf16 and back, so RoPE's inv_freq buffer is bf16-rounded as well). Each sequence runs alone (batch 1,
no padding); the case concatenates them; one sequence is a single token. 'Output of layer l' is captured with a
forward hook on model.model.layers[l].
"""
import json, math, os, sys
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

COMMON = dict(vocab_size=256, hidden_size=64, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, intermediate_size=96, hidden_act="silu", rms_norm_eps=1e-6, max_position_embeddings=4096,
              tie_word_embeddings=False, attention_bias=False,
              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
CASES = {
    # MoE on layers 1, 2, 3, 5 (sparse step 1, mlp_only_layers 0 and 4); renormalised top-2 of 8
    "qwen3moe-tiny": dict(dtype="float32", kw=dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24,
                                                   norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0, 4]),
                          taps=[1, 3, 4], lens=[9, 1, 30, 17], seed=2024),
    # MoE on layers 1 and 3 ((i+1) % 2 == 0, but 5 is in mlp_only_layers); top-3 of 8, weights not renormalised
    "qwen3moe-tiny-bf16": dict(dtype="bfloat16", kw=dict(num_experts=8, num_experts_per_tok=3,
                                                         moe_intermediate_size=24, norm_topk_prob=False,
                                                         decoder_sparse_step=2, mlp_only_layers=[5]),
                               taps=[0, 2, 3], lens=[1, 23, 12, 6], seed=77),
}


def reinit(model, g, dt):
    """Weights with O(1) effect everywhere, exactly representable in the stored dtype."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.ndim == 1:                                  # RMSNorm scales
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:                                            # [out,in], fused experts [E,out,in]
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            p.copy_(p.to(dt).float())


def make(outdir, name):
    c = CASES[name]
    torch.manual_seed(c["seed"]); g = torch.Generator().manual_seed(c["seed"])
    dt = getattr(torch, c["dtype"])
    cfg = transformers.Qwen3MoeConfig(**{**COMMON, **c["kw"]}, attn_implementation="eager")
    model = transformers.Qwen3MoeForCausalLM(cfg).float().eval()
    reinit(model, g, dt)
    L, lens = cfg.num_hidden_layers, c["lens"]
    kinds = [type(model.model.layers[i].mlp).__name__ for i in range(L)]
    if len(set(kinds)) != 2:
        sys.exit(f"{name}: want both MLP kinds among the layers, got {kinds}")
    d = os.path.join(outdir, name); os.makedirs(d, exist_ok=True)
    model.to(dt).save_pretrained(os.path.join(d, "target"), safe_serialization=True)
    model.float()
    ids = torch.randint(0, cfg.vocab_size, (sum(lens),), generator=g)
    cu = torch.tensor([0] + torch.cumsum(torch.tensor(lens), 0).tolist(), dtype=torch.int32)
    pos = torch.cat([torch.arange(n) for n in lens])
    caps, gaps = {}, []
    hooks = [model.model.layers[i].register_forward_hook(
        lambda m, a, o, i=i: caps.__setitem__(i, (o[0] if isinstance(o, tuple) else o).detach())) for i in range(L)]
    # the routing margin: the gap between the k-th and the (k+1)-th router probability of every routed row (a
    # near-tie would make the selected experts depend on rounding)
    def gate_hook(m, a, o):
        logits = torch.nn.functional.linear(a[0].reshape(-1, a[0].shape[-1]).float(), m.weight.float())
        p = logits.softmax(-1).sort(-1, descending=True).values
        gaps.append(float((p[:, cfg.num_experts_per_tok - 1] - p[:, cfg.num_experts_per_tok]).min()))
    for i in range(L):
        if hasattr(model.model.layers[i].mlp, "gate"):
            hooks.append(model.model.layers[i].mlp.gate.register_forward_hook(gate_hook))
    aux, last, logits = [], [], []
    with torch.no_grad():
        for s, n in enumerate(lens):
            out = model(input_ids=ids[cu[s]:cu[s + 1]][None], position_ids=torch.arange(n)[None], use_cache=False)
            aux.append(torch.cat([caps[t][0] for t in c["taps"]], dim=-1))
            last.append(caps[L - 1][0]); logits.append(out.logits[0])
    for h in hooks: h.remove()
    t = {"input_ids": ids.int(), "position_ids": pos.int(), "cu_seqlens": cu,
         "target.aux_hidden": torch.cat(aux).float().contiguous(),
         "target.last_hidden": torch.cat(last).float().contiguous(),
         "target.logits": torch.cat(logits).float().contiguous()}
    meta = {"case": name, "target_layer_ids": c["taps"], "seq_lens": lens, "dtype": c["dtype"], "mlp_kinds": kinds,
            "min_router_topk_gap": min(gaps), "experts_implementation": getattr(cfg, "_experts_implementation", None),
            "transformers_version": transformers.__version__, "torch_version": torch.__version__,
            "attn_implementation": "eager",
            "note": "aux_hidden/last_hidden: forward-hook outputs of model.model.layers[l], pre final norm"}
    save_file(t, os.path.join(d, "case.safetensors"), metadata={"json": json.dumps(meta)})
    print(f"== {name}: {os.path.abspath(d)}")
    print("  mlp kinds:", kinds, " min router top-k gap: %.3g" % min(gaps))
    for k, v in t.items():
        print(f"  {k:20s} {str(v.dtype):14s} {list(v.shape)}  max|.|={float(v.abs().max()):.4g}")
    with safe_open(os.path.join(d, "target", "model.safetensors"), "pt") as f:
        keys = sorted(f.keys())
        print(f"  checkpoint: {len(keys)} tensors; layer-0/1 and global keys:")
        for k in keys:
            if not k.startswith("model.layers.") or k.startswith(("model.layers.0.", "model.layers.1.mlp.experts.0.",
                                                                 "model.layers.1.mlp.gate")):
                print(f"    {k} {f.get_slice(k).get_dtype()} {list(f.get_slice(k).get_shape())}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for nm in sys.argv[2:] or list(CASES):
        make(sys.argv[1], nm)
