"""Decode prompts with the DFlash authors' own loop: z-lab's dflash/model.py (DFlashDraftModel loaded from a dflash
checkpoint folder by transformers' from_pretrained, dflash_generate at temperature 0), on a Hugging Face target
(transformers' Qwen3ForCausalLM). Writes one JSON object per attention mode (OUT.<mode>.json; a mode that fails
writes its error and the others still run; exit 1 then): tau as z-lab's benchmark computes it (the mean over prompts
of the mean acceptance length), the per-prompt acceptance lengths, and the same blocks cut as dflash eval counts them
(dflash stops at max_new_tokens new tokens, the first one from the prefill: its last block commits only what fits;
z-lab's loop verifies whole blocks and may run one past the end), so that the two taus compare block for block.

Prompts as dflash's prompt_file reads them (a JSONL line's leading run of loss_mask 0 / labels -100 tokens; a line of
input_ids alone is all prompt). The target's greedy choice never picks the drafter's mask token (dflash eval's rule: a
reserved id, as DFlash adds it to the vocabulary), applied to the target's own forward only (the drafter's logits,
z-lab's target.lm_head on the draft, are left as they are).

--attn lists the attention functions the drafter runs, one decoding each, in one process (the target runs sdpa):
  window  transformers' eager attention with flash-attention's sliding window as transformers' flash_attention_2
          applies it (window_size (W-1, W-1), the query aligned to the end of the keys, only when the keys outnumber
          W): what model.py does when flash_attn is installed (z-lab's benchmark prefers it), in fp32 and without
          flash_attn, registered through transformers' AttentionInterface. model.py hands each layer's
          sliding_window to the attention function and builds no mask itself;
  eager   transformers' eager attention as it is: it ignores sliding_window (as sdpa does), which is what model.py
          decodes with when flash_attn is not installed (its benchmark then falls back to sdpa);
  flash_attention_2  flash-attn itself (fp16/bf16 only: use --dtype bfloat16), when it imports.
usage: python3 tests/gpu/zlab_decode.py --model-py Z/dflash/model.py --target DIR --drafter DIR --prompts JSONL
       --out PREFIX [--limit 16] [--max-new-tokens 32] [--attn window,eager,flash_attention_2]
       [--dtype float32|bfloat16]   (flash_attention_2 always bfloat16; skipped, said in its JSON, without flash_attn)
"""
import argparse, importlib.util, json, sys

ap = argparse.ArgumentParser()
ap.add_argument("--model-py", required=True)
ap.add_argument("--target", required=True)
ap.add_argument("--drafter", required=True)
ap.add_argument("--prompts", required=True)
ap.add_argument("--limit", type=int, default=16)
ap.add_argument("--max-new-tokens", type=int, default=32)
ap.add_argument("--attn", default="window", help="comma-separated: window, eager, flash_attention_2")
ap.add_argument("--out", required=True, help="writes OUT.<attn>.json per mode")
ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
a = ap.parse_args()

import torch
import transformers
from transformers import AttentionInterface, Qwen3ForCausalLM

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda" if torch.cuda.is_available() else "cpu"


def load_zlab(path):
    """z-lab's model.py as a module; names it imports from modeling_qwen3 that this transformers moved are put back
    from their homes first (said in the output)"""
    import transformers.models.qwen3.modeling_qwen3 as mq
    homes = {"FlashAttentionKwargs": "transformers.modeling_flash_attention_utils",
             "GradientCheckpointingLayer": "transformers.modeling_layers",
             "ALL_ATTENTION_FUNCTIONS": "transformers.modeling_utils"}
    shimmed = []
    for name, home in homes.items():
        if not hasattr(mq, name):
            setattr(mq, name, getattr(importlib.import_module(home), name))
            shimmed.append(name)
    spec = importlib.util.spec_from_file_location("zlab_dflash_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, shimmed


zlab, shimmed = load_zlab(a.model_py)
seen = {"calls": 0, "windows": set()}


def window_attention(module, query, key, value, attention_mask, sliding_window=None, **kw):
    """eager attention + flash_attention_2's sliding window (transformers' _flash_attention_forward: window_size
    (W-1, W-1) when the keys outnumber W; flash-attn aligns query i with key index sk - sq + i)"""
    seen["calls"] += 1
    seen["windows"].add(sliding_window)
    if attention_mask is not None:
        raise RuntimeError("zlab_decode: the drafter got an attention mask; z-lab's loop passes none")
    sq, sk = query.shape[2], key.shape[2]
    causal = kw.pop("is_causal", None)
    causal = getattr(module, "is_causal", False) if causal is None else causal
    qi = torch.arange(sq, device=query.device)[:, None] + (sk - sq)
    kj = torch.arange(sk, device=query.device)[None, :]
    vis = torch.ones(sq, sk, dtype=torch.bool, device=query.device)
    if sliding_window is not None and sk > sliding_window:
        vis &= (qi - kj).abs() < sliding_window
    if causal and sq > 1:
        vis &= kj <= qi
    mask = torch.zeros(sq, sk, dtype=query.dtype, device=query.device).masked_fill(~vis, float("-inf"))
    return zlab.eager_attention_forward(module, query, key, value, mask[None, None], **kw)


# (the name must not contain "flash": transformers 5 takes such a name for a flash-attention kernel to look up)
AttentionInterface.register("window_mask", window_attention)

prompts = []
for lineno, line in enumerate(open(a.prompts), 1):
    if not line.strip():
        continue
    r = json.loads(line)
    ids = r["input_ids"]
    m = r.get("loss_mask")
    if m is None and "labels" in r:
        m = [0 if x == -100 else 1 for x in r["labels"]]
    plen = next((i for i, x in enumerate(m) if x), len(ids)) if m is not None else len(ids)
    prompts.append((lineno, ids[:plen]))
    if a.limit > 0 and len(prompts) == a.limit:
        break


def load_drafter(impl, dt):
    """z-lab's DFlashDraftModel.from_pretrained on the checkpoint folder, running attention impl"""
    how = "from_pretrained(attn_implementation=%r)" % impl
    try:
        draft, info = zlab.DFlashDraftModel.from_pretrained(a.drafter, dtype=dt, attn_implementation=impl,
                                                            output_loading_info=True)
    except Exception as e:  # noqa: BLE001  (a registered name refused at load: set after loading instead)
        if impl != "window_mask":
            raise
        draft, info = zlab.DFlashDraftModel.from_pretrained(a.drafter, dtype=dt, attn_implementation="eager",
                                                            output_loading_info=True)
        for set_it in (lambda: draft.set_attn_implementation(impl),
                       lambda: setattr(draft.config, "_attn_implementation", impl),
                       lambda: setattr(draft.config, "_attn_implementation_internal", impl)):
            try:
                set_it()
            except Exception:  # noqa: BLE001
                pass
            if draft.config._attn_implementation == impl:
                break
        how = "loaded eager (%s: %s), then set to %r" % (type(e).__name__, str(e)[:120], impl)
    draft = draft.to(dev).eval()
    if draft.config._attn_implementation != impl:
        raise RuntimeError("the drafter runs %r, not %r (%s)" % (draft.config._attn_implementation, impl, how))
    missing = [k for k in info.get("missing_keys", []) if "rotary_emb" not in k]
    if missing or info.get("unexpected_keys"):
        raise RuntimeError("z-lab's DFlashDraftModel does not take %s as it is: missing %s, unexpected %s" %
                           (a.drafter, missing, info.get("unexpected_keys")))
    return draft, how


def decode(attn, dtype):
    dt = getattr(torch, dtype)
    impl = {"window": "window_mask", "eager": "eager", "flash_attention_2": "flash_attention_2"}[attn]
    if attn == "flash_attention_2":
        try:
            import flash_attn  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return {"attn": attn, "skipped": "flash_attn does not import here (%s: %s)" % (type(e).__name__, e)}
    target = Qwen3ForCausalLM.from_pretrained(a.target, dtype=dt, attn_implementation="sdpa").to(dev).eval()
    draft, how = load_drafter(impl, dt)
    mask_id = draft.mask_token_id

    def no_mask_token(module, args, kwargs, out):   # dflash eval's rule for the target's own greedy choice
        out.logits[..., mask_id] = float("-inf")
        return out

    target.register_forward_hook(no_mask_token, with_kwargs=True)
    seen["calls"], seen["windows"] = 0, set()
    per, tau_z, tau_c = [], [], []
    for lineno, p in prompts:
        ids = torch.tensor([p], dtype=torch.long, device=dev)
        r = zlab.dflash_generate(draft, target=target, input_ids=ids, max_new_tokens=a.max_new_tokens,
                                 stop_token_ids=None, temperature=0.0, return_stats=True)
        acc = [int(x) for x in r.acceptance_lengths]
        cut, have = [], 1   # dflash's accounting: the prefill's token, then each block's commit up to max_new
        for x in acc:
            if have >= a.max_new_tokens:
                break
            x = min(x, a.max_new_tokens - have)
            cut.append(x)
            have += x
        new = [int(t) for t in r.output_ids[0, len(p):len(p) + a.max_new_tokens].tolist()]
        per.append({"line": lineno, "prompt_tokens": len(p), "accepted_zlab": acc, "accepted": cut, "tokens": new})
        tau_z.append(sum(acc) / len(acc))
        if cut:
            tau_c.append(sum(cut) / len(cut))
    return {"attn": attn, "attn_implementation": draft.config._attn_implementation, "set_by": how, "dtype": dtype,
            "device": dev, "tau_zlab": sum(tau_z) / len(tau_z), "tau": sum(tau_c) / len(tau_c) if tau_c else 0,
            "prompts": len(per), "block_size": draft.block_size, "mask_token_id": mask_id,
            "layer_types": list(getattr(draft.config, "layer_types", []) or []),
            "sliding_window": getattr(draft.config, "sliding_window", None),
            "layer_windows": [l.self_attn.sliding_window for l in draft.layers],
            "window_calls": seen["calls"], "windows_seen": sorted(map(str, seen["windows"])),
            "shimmed_imports": shimmed, "transformers": transformers.__version__, "torch": torch.__version__,
            "per_prompt": per}


rc = 0
for attn in a.attn.split(","):
    dtype = "bfloat16" if attn == "flash_attention_2" else a.dtype   # flash-attn: fp16/bf16 only
    try:
        res = decode(attn, dtype)
    except Exception as e:  # noqa: BLE001  (one mode failing leaves the others' results)
        import traceback
        traceback.print_exc()
        res, rc = {"attn": attn, "error": "%s: %s" % (type(e).__name__, e)}, 1
    with open("%s.%s.json" % (a.out, attn), "w") as f:
        json.dump(res, f)
    print("zlab_decode %s: %s" % (attn, res.get("error") or res.get("skipped") or "tau %.4f (whole last blocks %.4f)"
                                  % (res["tau"], res["tau_zlab"])), flush=True)
sys.exit(rc)
