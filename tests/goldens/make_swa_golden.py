"""Golden cases of a DFlash drafter with sliding-window layers (issue 21 item 3), computed with PyTorch.

The format is make_goldens.py's (../shared/goldens): target/ (transformers' Qwen3), drafter/ (z-lab layout, whose
config.json now carries layer_types, sliding_window, use_sliding_window and is_causal), case.safetensors (inputs and
expected outputs: context, final hidden, logits, slot CE, loss, gradients, one clipped AdamW step). What changes is the
attention of a "sliding_attention" layer: on top of the DFlash mask (own sequence strictly before the anchor, own
block both ways) a query at position q sees a key at position k only when |q - k| < sliding_window, which is
z-lab's model.py (current version) with is_causal false: its mask keeps key index k for query index q when
q - k < W and k - q < W, the key index being the position (the draft cache holds the context from position 0, the
block at positions start..start+B-1). The script checks that equivalence per block, and that transformers' Qwen3Config
reads the written config.json back with that window.
usage: python3 make_swa_golden.py OUTDIR [CASE...]   (cases: swa-tiny, swa-narrow)
"""
import json, math, os, sys
import torch
import torch.nn.functional as Fn
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

CASES = {
  # W longer than the block, shorter than most contexts: only context rows are cut
  "swa-tiny": dict(H=64, I=96, L=6, nh=4, nkv=2, hd=16, V=256, theta=1e6, dtype="float32",
                   taps=[1, 3, 4], dl=3, B=4, gamma=3.0, mask=250, lens=[37, 64, 1, 20], prompt=[10, 20, 0, 5],
                   n_anchor=[5, 8, 0, 3], seed=4321,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention"], window=6),
  # W shorter than the block: block slots far apart do not see each other, late slots see no context (bf16 weights)
  "swa-narrow": dict(H=64, I=96, L=6, nh=4, nkv=2, hd=16, V=256, theta=1e6, dtype="bfloat16",
                     taps=[2, 4], dl=2, B=8, gamma=4.0, mask=250, lens=[50, 31], prompt=[12, 4],
                     n_anchor=[6, 4], seed=77,
                     layer_types=["full_attention", "sliding_attention"], window=3),
}
HP = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.01, clip=1.0)

def rms(x, w, eps):
    v = x.float().pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(v + eps))

def rot_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)

def rope(x, pos, theta):          # x [n, heads, d], pos [n]
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    f = pos.double()[:, None] * inv[None, :]
    emb = torch.cat((f, f), dim=-1)
    cos, sin = emb.cos().float()[:, None, :], emb.sin().float()[:, None, :]
    return x * cos + rot_half(x) * sin

def zlab_visible(nq, nk, window):
    """z-lab model.py's _attention_mask with is_causal false: query index nk - nq + i against key index k."""
    qp = nk - nq + torch.arange(nq)[:, None]
    kp = torch.arange(nk)[None, :]
    return (qp - kp < window) & (kp - qp < window)

def drafter_forward(P, c, aux, ids, seq_of, pos_of, anchors, anchor_seq, embed, lm_head):
    H, nh, nkv, hd, B, eps = c["H"], c["nh"], c["nkv"], c["hd"], c["B"], 1e-6
    T, N = ids.shape[0], anchors.shape[0]
    F = rms(aux @ P["fc.weight"].T, P["hidden_norm.weight"], eps)
    starts = torch.zeros(len(c["lens"]) + 1, dtype=torch.long)
    starts[1:] = torch.cumsum(torch.tensor(c["lens"]), 0)
    blk_ids = torch.full((N, B), c["mask"], dtype=torch.long)
    blk_ids[:, 0] = ids[starts[anchor_seq] + anchors]
    x = embed[blk_ids.reshape(-1)].clone()
    bpos = (anchors[:, None] + torch.arange(B)[None, :]).reshape(-1)
    kpos = torch.cat([pos_of, bpos])
    qa = anchors.repeat_interleave(B); qs = anchor_seq.repeat_interleave(B); qb = torch.arange(N).repeat_interleave(B)
    m_ctx = (seq_of[None, :] == qs[:, None]) & (pos_of[None, :] < qa[:, None])
    m_blk = qb[:, None] == qb[None, :]
    full = torch.cat([m_ctx, m_blk], dim=1)
    # a sliding layer: also |query position - key position| < W
    win = full & ((bpos[:, None] - kpos[None, :]).abs() < c["window"])
    # the same rows as z-lab's inference mask: block j alone on keys [its context 0..a-1, its block]
    for j in range(N):
        a, s = int(anchors[j]), int(anchor_seq[j])
        rows = win[j * B:(j + 1) * B]
        mine = torch.cat([rows[:, starts[s]:starts[s] + a], rows[:, T + j * B:T + (j + 1) * B]], dim=1)
        assert torch.equal(mine, zlab_visible(B, a + B, c["window"])), f"block {j}: mask differs from z-lab's"
        assert int(rows.sum()) == int(mine.sum()), f"block {j}: sees rows outside its sequence or block"
    g = nh // nkv
    for i in range(c["dl"]):
        mask = win if c["layer_types"][i] == "sliding_attention" else full
        p = lambda n: P[f"layers.{i}.{n}"]
        u = rms(x, p("input_layernorm.weight"), eps)
        q = (u @ p("self_attn.q_proj.weight").T).view(-1, nh, hd)
        q = rms(q, p("self_attn.q_norm.weight"), eps)
        kv_in = torch.cat([F, u], dim=0)
        k = rms((kv_in @ p("self_attn.k_proj.weight").T).view(-1, nkv, hd), p("self_attn.k_norm.weight"), eps)
        v = (kv_in @ p("self_attn.v_proj.weight").T).view(-1, nkv, hd)
        q, k = rope(q, bpos, c["theta"]), rope(k, kpos, c["theta"])
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        s = s.masked_fill(~mask[None], float("-inf"))
        o = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(-1, nh * hd)
        x = x + o @ p("self_attn.o_proj.weight").T
        y = rms(x, p("post_attention_layernorm.weight"), eps)
        x = x + (Fn.silu(y @ p("mlp.gate_proj.weight").T) * (y @ p("mlp.up_proj.weight").T)) @ p("mlp.down_proj.weight").T
    h = rms(x, P["norm.weight"], eps)
    return F, h, h @ lm_head.T, blk_ids, bpos, kpos, full, win

def slot_targets(c, ids, lm, anchors, anchor_seq):
    B, N = c["B"], anchors.shape[0]
    starts = [0]
    for n in c["lens"]: starts.append(starts[-1] + n)
    labels = torch.zeros(N * B, dtype=torch.long); w = torch.zeros(N * B)
    for j in range(N):
        s, a = int(anchor_seq[j]), int(anchors[j])
        for k in range(1, B):
            if a + k < c["lens"][s] and lm[starts[s] + a + k]:
                labels[j * B + k] = ids[starts[s] + a + k]; w[j * B + k] = math.exp(-(k - 1) / c["gamma"])
    return labels, w

def drafter_config(c):
    """The drafter's config.json as dflash exports it (hf_config_write_dflash)."""
    return dict(architectures=["DFlashDraftModel"], model_type="qwen3", hidden_size=c["H"], intermediate_size=c["I"],
                num_hidden_layers=c["dl"], num_attention_heads=c["nh"], num_key_value_heads=c["nkv"], head_dim=c["hd"],
                rms_norm_eps=1e-6, rope_theta=c["theta"], vocab_size=c["V"], max_position_embeddings=4096,
                tie_word_embeddings=False, attention_bias=False, torch_dtype=c["dtype"], block_size=c["B"],
                num_target_layers=c["L"], layer_types=c["layer_types"], use_sliding_window=True,
                sliding_window=c["window"], is_causal=False,
                dflash_config=dict(mask_token_id=c["mask"], target_layer_ids=c["taps"]))

def make(outdir, name):
    c = CASES[name]; torch.manual_seed(c["seed"]); g = torch.Generator().manual_seed(c["seed"])
    dt = getattr(torch, c["dtype"])
    cfg = Qwen3Config(vocab_size=c["V"], hidden_size=c["H"], intermediate_size=c["I"], num_hidden_layers=c["L"],
                      num_attention_heads=c["nh"], num_key_value_heads=c["nkv"], head_dim=c["hd"], rope_theta=c["theta"],
                      rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=False,
                      initializer_range=0.1, attn_implementation="eager")
    tgt = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in tgt.named_parameters():
            if p.ndim == 1: p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
        for p in tgt.parameters(): p.copy_(p.to(dt).float())
    os.makedirs(f"{outdir}/{name}", exist_ok=True)
    tgt.to(dt).save_pretrained(f"{outdir}/{name}/target", safe_serialization=True); tgt.float()
    lens = c["lens"]; T = sum(lens)
    ids = torch.randint(0, c["V"] - 16, (T,), generator=g)
    seq_of = torch.cat([torch.full((n,), s) for s, n in enumerate(lens)])
    pos_of = torch.cat([torch.arange(n) for n in lens])
    lm = torch.cat([(torch.arange(n) >= pr).int() for n, pr in zip(lens, c["prompt"])])
    cu = torch.tensor([0] + list(torch.cumsum(torch.tensor(lens), 0)), dtype=torch.int32)
    caps = {}
    hooks = [tgt.model.layers[i].register_forward_hook(lambda m, a, o, i=i: caps.__setitem__(i, o[0] if isinstance(o, tuple) else o))
             for i in range(c["L"])]
    aux, last, logits = [], [], []
    with torch.no_grad():
        for s, n in enumerate(lens):
            x = ids[cu[s]:cu[s + 1]][None]
            out = tgt(input_ids=x, position_ids=torch.arange(n)[None])
            aux.append(torch.cat([caps[t][0] for t in c["taps"]], dim=-1)); last.append(caps[c["L"] - 1][0]); logits.append(out.logits[0])
    for h in hooks: h.remove()
    aux, last, logits = torch.cat(aux), torch.cat(last), torch.cat(logits)
    H, K = c["H"], len(c["taps"])
    P = {"fc.weight": torch.randn(H, K * H, generator=g) * 0.1, "hidden_norm.weight": 1 + 0.1 * torch.randn(H, generator=g),
         "norm.weight": 1 + 0.1 * torch.randn(H, generator=g)}
    for i in range(c["dl"]):
        pre = f"layers.{i}."
        for n, shp in [("self_attn.q_proj.weight", (c["nh"] * c["hd"], H)), ("self_attn.k_proj.weight", (c["nkv"] * c["hd"], H)),
                       ("self_attn.v_proj.weight", (c["nkv"] * c["hd"], H)), ("self_attn.o_proj.weight", (H, c["nh"] * c["hd"])),
                       ("mlp.gate_proj.weight", (c["I"], H)), ("mlp.up_proj.weight", (c["I"], H)), ("mlp.down_proj.weight", (H, c["I"]))]:
            P[pre + n] = torch.randn(*shp, generator=g) * 0.1
        for n, d in [("input_layernorm.weight", H), ("post_attention_layernorm.weight", H), ("self_attn.q_norm.weight", c["hd"]),
                     ("self_attn.k_norm.weight", c["hd"])]:
            P[pre + n] = 1 + 0.1 * torch.randn(d, generator=g)
    P = {k: v.to(dt).float().requires_grad_(True) for k, v in P.items()}
    P0s = {k: v.detach().clone() for k, v in P.items()}
    anchors, aseq = [], []
    for s, n in enumerate(lens):
        cand = [a for a in range(n - 1) if lm[cu[s] + a] and lm[cu[s] + a + 1]]
        if not cand or c["n_anchor"][s] == 0: continue
        pick = sorted(torch.randperm(len(cand), generator=g)[: c["n_anchor"][s] - 1].tolist())
        chosen = sorted(set([cand[i] for i in pick] + [cand[-1]]))
        anchors += chosen; aseq += [s] * len(chosen)
    anchors, aseq = torch.tensor(anchors), torch.tensor(aseq)
    embed, lm_head = tgt.model.embed_tokens.weight.detach(), tgt.lm_head.weight.detach()
    Fctx, h, dlogits, blk_ids, bpos, kpos, full, win = drafter_forward(P, c, aux, ids, seq_of, pos_of, anchors, aseq, embed, lm_head)
    cut = int(full.sum() - win.sum())
    assert cut > 0, "the window cuts nothing: not a sliding-window case"
    labels, w = slot_targets(c, ids, lm, anchors, aseq)
    ce = Fn.cross_entropy(dlogits, labels, reduction="none") * (w > 0)
    loss = (ce * w).sum() / w.sum()
    loss.backward()
    names = sorted(P)
    gn = torch.sqrt(sum((P[n].grad.double() ** 2).sum() for n in names)).float()
    clip = min(1.0, HP["clip"] / (gn.item() + 1e-6))
    opt = torch.optim.AdamW([P[n] for n in names], lr=HP["lr"], betas=(HP["beta1"], HP["beta2"]), eps=HP["eps"], weight_decay=0.0)
    with torch.no_grad():
        for n in names:
            P[n].grad.mul_(clip)
            if P[n].ndim >= 2: P[n].mul_(1 - HP["lr"] * HP["weight_decay"])
    grads = {f"grad.{n}": (P[n].grad / clip).detach().clone() for n in names}
    opt.step()
    dconf = drafter_config(c)
    # transformers' own reading of the exported config: the window survives only with use_sliding_window
    tc = Qwen3Config(**{k: v for k, v in dconf.items() if k not in ("architectures", "model_type")})
    hf_read = (f"transformers' Qwen3Config reads sliding_window={tc.sliding_window} layer_types={list(tc.layer_types)} "
               f"is_causal={getattr(tc, 'is_causal', None)}")
    print(f"{name}: {hf_read}", flush=True)
    meta = dict(case=name, block_size=c["B"], gamma=c["gamma"], mask_token_id=c["mask"], target_layer_ids=c["taps"],
                layer_types=c["layer_types"], sliding_window=c["window"],
                window="sliding_attention layers: a query at position q sees a key at position k only when |q-k| < "
                       "sliding_window (z-lab model.py, is_causal false), on top of the DFlash mask",
                loss="sum(w*ce)/sum(w) over valid slots; slot k>=1 of anchor a predicts token a+k; w=exp(-(k-1)/gamma)",
                optimizer=dict(HP, decay_on="tensors with ndim>=2", clip_on="global L2 norm of all trainable grads, coef=min(1,clip/(norm+1e-6))"),
                zlab_crosscheck=f"per block, the sliding mask equals z-lab's _attention_mask (is_causal false, window {c['window']}); "
                                f"the window hides {cut} of {int(full.sum())} visible (query, key) pairs; {hf_read}")
    t = {"input_ids": ids.int(), "cu_seqlens": cu, "position_ids": pos_of.int(), "loss_mask": lm.int(),
         "target.aux_hidden": aux, "target.last_hidden": last, "target.logits": logits,
         "anchors": anchors.int(), "anchor_seq": aseq.int(), "drafter.block_ids": blk_ids.reshape(-1).int(),
         "drafter.context": Fctx.detach(), "drafter.final_hidden": h.detach(), "drafter.logits": dlogits.detach(),
         "drafter.slot_label": labels.int(), "drafter.slot_weight": w, "drafter.slot_ce": ce.detach(),
         "drafter.loss": loss.detach().reshape(1), "drafter.grad_norm": gn.reshape(1)}
    t.update(grads)
    t.update({f"step1.{n}": P[n].detach().clone() for n in names})
    save_file({k: v.contiguous() for k, v in t.items()}, f"{outdir}/{name}/case.safetensors", metadata={"json": json.dumps(meta)})
    os.makedirs(f"{outdir}/{name}/drafter", exist_ok=True)
    save_file({n: P0s[n].to(dt).contiguous() for n in names}, f"{outdir}/{name}/drafter/model.safetensors")
    json.dump(dconf, open(f"{outdir}/{name}/drafter/config.json", "w"), indent=2)
    print(f"{name}: T={T} anchors={len(anchors)} window={c['window']} cut={cut}/{int(full.sum())} loss={loss.item():.6f} "
          f"grad_norm={gn.item():.6f}", flush=True)

if __name__ == "__main__":
    out, names = sys.argv[1], sys.argv[2:] or list(CASES)
    for name in names:
        make(out, name)
