"""Golden cases for a tiny gpt-oss target (gpt_oss: attention with q/k/v/o biases and learned per-head sinks,
sliding-window layers alternating with full ones, YaRN RoPE; an MoE MLP of biased experts with a router bias,
top-k then softmax over the k, the clamped SwiGLU on interleaved gate/up columns), computed with transformers' own
modeling_gpt_oss.py (eager attention), random seeded weights, no network, on the CPU.

usage: python3 make_gptoss_golden.py OUTDIR [CASE ...]   cases: gptoss-tiny (fp32), gptoss-tiny-bf16,
                                                           gptoss-mxfp4 (experts as MXFP4 blocks + scales)
Writes OUTDIR/CASE/target/ (config.json + model.safetensors) and OUTDIR/CASE/case.safetensors in the layout of
tests/goldens/README.md, target part only (input_ids, position_ids, cu_seqlens [i32]; target.aux_hidden [T,K*H],
target.last_hidden [T,H] = output of the last layer BEFORE the final norm, target.logits [T,V]); its
__metadata__["json"] holds target_layer_ids (taps) and checks. As make_qwen3moe_golden.py: the bf16 cases store
bf16 weights and their expected values are the fp32 forward of those weights (the model cast to bf16 and back, so
RoPE's inv_freq buffer is bf16-rounded as well). Each sequence runs alone (batch 1, no padding); the case
concatenates them; one sequence is a single token; the sliding window (6) is shorter than the other sequences.

gptoss-mxfp4: the experts' weights are rounded to MXFP4 (groups of 32 along the input dimension, an e8m0 scale
each), and the checkpoint stores them as published gpt-oss checkpoints do: mlp.experts.{gate_up,down}_proj_blocks
(uint8, E x out x in/32 x 16, two fp4 codes a byte, low nibble first) and _scales (uint8, E x out x in/32, exponent
+127), the biases and every other weight bf16, config.json with quantization_config {quant_method: mxfp4}. The
expected values are the forward of the model transformers loads from that checkpoint (Mxfp4Config(dequantize=True));
its dequantised experts are checked equal to the rounding made here.

The committed cases were made by tests/gpu/gptoss_goldens.sh on the GPU machine (transformers 5.17, torch 2.11, CPU
tensors), which prints each case into the run's log as tar | xz | base64 with a checksum.
"""
import inspect, json, math, os, sys
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

LT = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
COMMON = dict(vocab_size=256, hidden_size=96, num_hidden_layers=len(LT), layer_types=LT, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
              sliding_window=6, rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=False,
              attention_bias=True,
              rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                               "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096})
CASES = {
    "gptoss-tiny": dict(dtype="float32", taps=[0, 2, 3], lens=[9, 1, 30, 17], seed=2025),
    "gptoss-tiny-bf16": dict(dtype="bfloat16", taps=[1, 2, 3], lens=[1, 23, 12, 6], seed=91),
    "gptoss-mxfp4": dict(dtype="bfloat16", mxfp4=True, taps=[0, 1, 3], lens=[14, 1, 25], seed=7),
}
FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def reinit(model, g, dt):
    """Weights with O(1) effect everywhere, exactly representable in the stored dtype. The experts' gate/up weights
    are large enough that the SwiGLU clamp (limit 7) is reached by some rows."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("sinks"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif n.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:                                # RMSNorm scales
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.ndim == 3:                                # experts: HF (E, in, out)
                s = 4.0 if "gate_up" in n else 1.0
                p.copy_(s * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
            else:                                            # [out, in]
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            p.copy_(p.to(dt).float())


def mxfp4_quantize(w):
    """w (E, out, in) fp32 -> blocks (E, out, in/32, 16) u8, scales (E, out, in/32) u8, the dequantised (E, out, in)."""
    E, O, I = w.shape
    g = w.reshape(E, O, I // 32, 32)
    amax = g.abs().amax(-1).clamp_min(1e-30)
    ex = torch.ceil(torch.log2(amax / 6.0)).to(torch.int32)            # amax / 2^ex <= 6
    v = g / torch.ldexp(torch.ones(()), ex)[..., None]
    idx = (v.abs()[..., None] - FP4[:8]).abs().argmin(-1)             # nearest magnitude code 0..7
    idx = torch.where((v < 0) & (idx > 0), idx + 8, idx)
    deq = FP4[idx] * torch.ldexp(torch.ones(()), ex)[..., None]
    codes = idx.to(torch.uint8).reshape(E, O, I // 32, 16, 2)
    blocks = (codes[..., 0] | (codes[..., 1] << 4)).contiguous()
    scales = (ex + 127).to(torch.uint8).contiguous()
    return blocks, scales, deq.reshape(E, O, I)


def experts_source():
    src = inspect.getsource(transformers.models.gpt_oss.modeling_gpt_oss)
    return {"interleaved_gate_up": "[..., ::2]" in src, "swiglu_alpha_from_config": "swiglu_alpha" in src}


def make(outdir, name):
    c = CASES[name]
    torch.manual_seed(c["seed"]); g = torch.Generator().manual_seed(c["seed"])
    dt = getattr(torch, c["dtype"])
    cfg = transformers.GptOssConfig(**COMMON, attn_implementation="eager")
    model = transformers.GptOssForCausalLM(cfg).float().eval()
    reinit(model, g, dt)
    L, lens, E = cfg.num_hidden_layers, c["lens"], cfg.num_local_experts
    d = os.path.join(outdir, name); tdir = os.path.join(d, "target"); os.makedirs(d, exist_ok=True)
    meta_extra = {}
    if c.get("mxfp4"):
        q = {}
        with torch.no_grad():
            for i in range(L):
                ex = model.model.layers[i].mlp.experts
                for nm in ("gate_up_proj", "down_proj"):
                    p = getattr(ex, nm)                             # HF (E, in, out)
                    blocks, scales, deq = mxfp4_quantize(p.detach().float().transpose(1, 2).contiguous())
                    p.copy_(deq.transpose(1, 2))
                    q[f"model.layers.{i}.mlp.experts.{nm}_blocks"] = blocks
                    q[f"model.layers.{i}.mlp.experts.{nm}_scales"] = scales
        model.to(dt).save_pretrained(tdir, safe_serialization=True)
        st = os.path.join(tdir, "model.safetensors")
        sd = load_file(st)
        for i in range(L):
            for nm in ("gate_up_proj", "down_proj"):
                del sd[f"model.layers.{i}.mlp.experts.{nm}"]
        sd.update(q)
        save_file(sd, st, metadata={"format": "pt"})
        cj = os.path.join(tdir, "config.json")
        conf = json.load(open(cj))
        conf["quantization_config"] = {"quant_method": "mxfp4",
                                       "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                  "model.embed_tokens", "lm_head"]}
        json.dump(conf, open(cj, "w"), indent=2)
        mine = {n: p.detach().float().clone() for n, p in model.named_parameters() if ".experts." in n}
        # transformers' own dequantisation of that checkpoint
        try:
            qc = transformers.Mxfp4Config(dequantize=True)
            ref = transformers.GptOssForCausalLM.from_pretrained(tdir, quantization_config=qc,
                                                                 dtype=torch.bfloat16, attn_implementation="eager")
            how = "from_pretrained(Mxfp4Config(dequantize=True))"
        except Exception as e:  # noqa: BLE001
            print(f"  from_pretrained failed: {type(e).__name__}: {e}")
            from transformers.integrations.mxfp4 import convert_moe_packed_tensors
            ref = None
            how = "convert_moe_packed_tensors"
            for i in range(L):
                for nm in ("gate_up_proj", "down_proj"):
                    deq = convert_moe_packed_tensors(q[f"model.layers.{i}.mlp.experts.{nm}_blocks"],
                                                     q[f"model.layers.{i}.mlp.experts.{nm}_scales"]).float()
                    n = f"model.layers.{i}.mlp.experts.{nm}"
                    if deq.shape != mine[n].shape: deq = deq.transpose(1, 2)
                    diff = float((deq - mine[n]).abs().max())
                    print(f"  {n}: transformers' dequantisation vs ours: max |diff| {diff}")
                    if diff != 0: sys.exit(f"{name}: transformers dequantises {n} differently")
        if ref is not None:
            rp = dict(ref.named_parameters())
            worst = 0.0
            for n, p in mine.items():
                r = rp[n].detach().float()
                if r.shape != p.shape: sys.exit(f"{name}: {n}: transformers {list(r.shape)} vs ours {list(p.shape)}")
                worst = max(worst, float((r - p).abs().max()))
            print(f"  transformers' dequantised experts vs ours: max |diff| {worst}")
            if worst != 0: sys.exit(f"{name}: transformers dequantises the experts differently (max diff {worst})")
            model = ref.to(torch.bfloat16).float().eval()   # buffers (RoPE's inv_freq) bf16-rounded as the others
        if ref is None:
            model = model.to(dt).float().eval()
        meta_extra = {"mxfp4_dequantised_by": how}
    else:
        model.to(dt).save_pretrained(tdir, safe_serialization=True)
        model.float()
    ids = torch.randint(0, cfg.vocab_size, (sum(lens),), generator=g)
    cu = torch.tensor([0] + torch.cumsum(torch.tensor(lens), 0).tolist(), dtype=torch.int32)
    pos = torch.cat([torch.arange(n) for n in lens])
    caps, gaps, clamp = {}, [], [0, 0]
    hooks = [model.model.layers[i].register_forward_hook(
        lambda m, a, o, i=i: caps.__setitem__(i, (o[0] if isinstance(o, tuple) else o).detach())) for i in range(L)]
    K = cfg.num_experts_per_tok
    def router_hook(m, a, o):   # the routing margin: k-th vs (k+1)-th router logit (a near-tie flips a pick)
        x = a[0].reshape(-1, a[0].shape[-1]).float()
        lg = torch.nn.functional.linear(x, m.weight.float(), m.bias.float()).sort(-1, descending=True).values
        gaps.append(float((lg[:, K - 1] - lg[:, K]).min()))
        ex = m_experts[id(m)]
        w = ex.gate_up_proj.float()
        if w.shape[1] != x.shape[1]: w = w.transpose(1, 2)          # (E, 2I, H) layout
        gu = torch.einsum("th,ehj->etj", x, w) + ex.gate_up_proj_bias.float()[:, None, :]
        clamp[0] += int((gu[..., ::2] > 7.0).sum()) + int((gu[..., 1::2].abs() > 7.0).sum()); clamp[1] += gu.numel()
    m_experts = {}
    for i in range(L):
        mlp = model.model.layers[i].mlp
        m_experts[id(mlp.router)] = mlp.experts
        hooks.append(mlp.router.register_forward_hook(router_hook))
    aux, last, logits = [], [], []
    with torch.no_grad():
        for s, n in enumerate(lens):
            out = model(input_ids=ids[cu[s]:cu[s + 1]][None], position_ids=torch.arange(n)[None], use_cache=False)
            aux.append(torch.cat([caps[t][0] for t in c["taps"]], dim=-1))
            last.append(caps[L - 1][0]); logits.append(out.logits[0])
    for h in hooks: h.remove()
    rot = model.model.rotary_emb
    t = {"input_ids": ids.int(), "position_ids": pos.int(), "cu_seqlens": cu,
         "target.aux_hidden": torch.cat(aux).float().contiguous(),
         "target.last_hidden": torch.cat(last).float().contiguous(),
         "target.logits": torch.cat(logits).float().contiguous(),
         "rope.inv_freq": rot.inv_freq.float().contiguous()}
    meta = {"case": name, "target_layer_ids": c["taps"], "seq_lens": lens, "dtype": c["dtype"], "layer_types": LT,
            "sliding_window": cfg.sliding_window, "min_router_topk_gap": min(gaps),
            "clamped_fraction": clamp[0] / max(1, clamp[1]), "rope_attention_scaling": float(rot.attention_scaling),
            "transformers_version": transformers.__version__, "torch_version": torch.__version__,
            "attn_implementation": "eager", **experts_source(), **meta_extra,
            "note": "aux_hidden/last_hidden: forward-hook outputs of model.model.layers[l], pre final norm; "
                    "rope.inv_freq: the model's buffer as the forward used it"}
    save_file(t, os.path.join(d, "case.safetensors"), metadata={"json": json.dumps(meta)})
    print(f"== {name}: {os.path.abspath(d)}")
    print("  meta:", json.dumps({k: v for k, v in meta.items() if k != "note"}))
    for k, v in t.items():
        print(f"  {k:20s} {str(v.dtype):14s} {list(v.shape)}  max|.|={float(v.abs().max()):.4g}")
    with safe_open(os.path.join(tdir, "model.safetensors"), "pt") as f:
        keys = sorted(f.keys())
        print(f"  checkpoint: {len(keys)} tensors; layer-0 and global keys:")
        for k in keys:
            if not k.startswith("model.layers.") or k.startswith("model.layers.0."):
                print(f"    {k} {f.get_slice(k).get_dtype()} {list(f.get_slice(k).get_shape())}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print("transformers", transformers.__version__, "torch", torch.__version__)
    bad = 0
    for nm in sys.argv[2:] or list(CASES):
        try:
            make(sys.argv[1], nm)
        except Exception:  # noqa: BLE001 -- one case failing keeps the others
            import traceback; traceback.print_exc(); bad += 1
    sys.exit(1 if bad else 0)
