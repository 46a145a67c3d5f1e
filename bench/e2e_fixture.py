"""End-to-end fixture (GPU machine): a target with random bf16 weights (transformers' own model class, initialised on
the GPU, written by save_pretrained as a sharded safetensors checkpoint) and a data set of random ~3000-token samples
(prompt tokens loss_mask 0, answer tokens 1) as the JSONL that dflash-prepare reads.
--family picks the target, one row of FAMILIES:
  qwen3    the Qwen3-8B shape (36 layers, H 4096, 32/8 heads of 128, FFN 12288, V 151936): Qwen3ForCausalLM
  qwen3_5  the Qwen3.5-9B hybrid shape of bench/qwen35_9b.h (32 layers, every 4th gated attention with 16/4 heads of
           256 and partial RoPE, the others Gated DeltaNet with 16 q/k x 32 v heads of 128, FFN 12288, V 248320):
           Qwen3_5ForCausalLM, config.json model_type "qwen3_5_text", weights under "model." (as the qwen35-tiny
           golden's target, which transformers wrote the same way)
  qwen3_moe the Qwen3-30B-A3B shape of bench/qwen3_30b_a3b.h (48 layers, H 2048, 32/4 heads of 128, 128 experts of
           width 768, 8 per token, norm_topk_prob, no shared expert, V 151936): Qwen3MoeForCausalLM, written as
           transformers writes it (the arguments of bench/torch_moe_anchor.py)
  gpt_oss  the gpt-oss-20b shape of bench/gpt_oss_20b.h (24 layers, H 2880, 64/8 heads of 64 with q/k/v/o biases and
           sinks, sliding window 128 on the even layers, 32 experts of width 2880, 4 per token, YaRN RoPE, V 201088):
           GptOssForCausalLM (the arguments of bench/torch_gptoss_anchor.py), its experts as bf16 in transformers'
           layout (mlp.experts.gate_up_proj [E, H, 2I] interleaved, down_proj [E, I, H], their biases) and no
           quantization_config, as transformers writes a dequantised checkpoint (the published ones ship MXFP4; dflash
           dequantises those at load, so the run after the load is the same). The full 24 layers are 20.9 B
           parameters (42 GB in bf16): e2e_gpu.sh takes 8 by default (15 GB, ~30-40 s to write and as long to load).
           --mxfp4: the experts as the published checkpoints ship them instead (mlp.experts.gate_up_proj_blocks
           [E, 2I, H/32, 16] + _scales [E, 2I, H/32], down_proj_blocks [E, H, I/32, 16] + _scales [E, H, I/32], U8,
           random FP4 codes with scales 2^-9..2^-6, and the published quantization_config), 13 GB at the full 24
           layers; the model is still built in bf16 on the GPU, its bf16 experts dropped before writing
--print-config prints the config class and its arguments as JSON and writes nothing (needs no torch: the CPU test
of e2e.sh checks them against the golden's config.json with dflash's own parser).
usage: python3 bench/e2e_fixture.py OUT_DIR [--family qwen3|qwen3_5|qwen3_moe|gpt_oss] [--samples 400] [--layers N]
       [--mxfp4] [--print-config]"""
import argparse, json, os, random, sys, time


def qwen3(layers):
    return "Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=layers, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, rope_theta=1e6, rms_norm_eps=1e-6,
        max_position_embeddings=40960, tie_word_embeddings=False)


def qwen3_5(layers):   # the arguments of bench/torch_hybrid_anchor.py
    return "Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=layers,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        num_attention_heads=16, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        vocab_size=248320, rms_norm_eps=1e-6, max_position_embeddings=262144, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True})


def qwen3_moe(layers):   # the arguments of bench/torch_moe_anchor.py
    return "Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=layers, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=False, decoder_sparse_step=1, moe_intermediate_size=768, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, mlp_only_layers=[])


def gpt_oss(layers):   # the arguments of bench/torch_gptoss_anchor.py
    return "GptOssConfig", "GptOssForCausalLM", dict(
        num_hidden_layers=layers, num_local_experts=32, num_experts_per_tok=4, vocab_size=201088, hidden_size=2880,
        intermediate_size=2880, head_dim=64, num_attention_heads=64, num_key_value_heads=8, sliding_window=128,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096})


FAMILIES = {"qwen3": (qwen3, 36), "qwen3_5": (qwen3_5, 32), "qwen3_moe": (qwen3_moe, 48),   # family: (config,
            "gpt_oss": (gpt_oss, 24)}                                                     # its full depth)

ap = argparse.ArgumentParser()
ap.add_argument("out"); ap.add_argument("--samples", type=int, default=400)
ap.add_argument("--family", choices=sorted(FAMILIES), default="qwen3")
ap.add_argument("--layers", type=int, default=0, help="default: the family's full depth")
ap.add_argument("--mxfp4", action="store_true", help="gpt_oss: the experts as MXFP4 blocks + scales")
ap.add_argument("--print-config", action="store_true")
a = ap.parse_args()
make_config, full_depth = FAMILIES[a.family]
cfg_class, model_class, kw = make_config(a.layers or full_depth)
if a.mxfp4 and a.family != "gpt_oss":
    sys.exit("e2e_fixture: --mxfp4 is gpt_oss's (family %s)" % a.family)
QUANT = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                             "model.embed_tokens", "lm_head"]}   # the published one
if a.print_config:
    print(json.dumps(dict({"config": cfg_class, "model": model_class, "kwargs": kw},
                          **({"quantization_config": QUANT} if a.mxfp4 else {}))))
    sys.exit(0)


def save_mxfp4(model, cfg, out):
    """The state dict with each layer's bf16 experts replaced by random MXFP4 blocks + scales, in ~4 GB shards with
    their index, and config.json with the quantization_config."""
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    E, H, I = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
    sd = {k: v for k, v in model.state_dict().items()
          if not k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))}
    g = torch.Generator(device="cuda").manual_seed(1)
    for i in range(cfg.num_hidden_layers):
        for name, rows, cols in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
            pre = "model.layers.%d.mlp.experts.%s_" % (i, name)
            sd[pre + "blocks"] = torch.randint(0, 256, (E, rows, cols // 32, 16), generator=g, device="cuda",
                                               dtype=torch.uint8)
            sd[pre + "scales"] = torch.randint(118, 122, (E, rows, cols // 32), generator=g, device="cuda",
                                               dtype=torch.uint8)
    shards, cur, size = [], {}, 0
    for k in sorted(sd):
        n = sd[k].numel() * sd[k].element_size()
        if cur and size + n > 4 << 30:
            shards.append(cur); cur, size = {}, 0
        cur[k] = sd[k]; size += n
    shards.append(cur)
    wmap = {}
    for j, sh in enumerate(shards):
        fn = "model-%05d-of-%05d.safetensors" % (j + 1, len(shards))
        save_file({k: v.contiguous().cpu() for k, v in sh.items()}, os.path.join(out, fn), metadata={"format": "pt"})
        wmap.update({k: fn for k in sh})
    total = sum(v.numel() * v.element_size() for v in sd.values())
    json.dump({"metadata": {"total_size": total}, "weight_map": wmap},
              open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=2)
    cfg.save_pretrained(out)
    c = json.load(open(os.path.join(out, "config.json")))
    c["quantization_config"], c["dtype"] = QUANT, "bfloat16"   # the dtype save_pretrained of a bf16 model writes
    json.dump(c, open(os.path.join(out, "config.json"), "w"), indent=2)
    return total

import torch, transformers
t0 = time.time()
if not hasattr(transformers, cfg_class) or not hasattr(transformers, model_class):
    sys.exit("e2e_fixture: transformers %s has no %s / %s (family %s)" % (transformers.__version__, cfg_class,
                                                                         model_class, a.family))
cfg = getattr(transformers, cfg_class)(**kw)
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = getattr(transformers, model_class)(cfg)
if a.mxfp4:
    nbytes = save_mxfp4(model, cfg, os.path.join(a.out, "target"))
    print("target: %s, %d layers, MXFP4 experts, %.1f GB written in %.1f s" % (a.family, kw["num_hidden_layers"],
          nbytes / 1e9, time.time() - t0), flush=True)
else:
    model.save_pretrained(os.path.join(a.out, "target"), safe_serialization=True, max_shard_size="4GB")
    print("target: %s, %d layers, %.1f B parameters written in %.1f s" % (a.family, kw["num_hidden_layers"],
          sum(p.numel() for p in model.parameters()) / 1e9, time.time() - t0), flush=True)
del model
torch.cuda.empty_cache()
rng = random.Random(7)
with open(os.path.join(a.out, "data.jsonl"), "w") as f:
    for _ in range(a.samples):
        n, p = rng.randint(2800, 3072), rng.randint(200, 600)
        ids = [rng.randrange(0, 151000) for _ in range(n)]
        f.write(json.dumps({"input_ids": ids, "loss_mask": [0] * p + [1] * (n - p)}) + "\n")
print("data: %d samples of 2800-3072 tokens" % a.samples, flush=True)
