"""End-to-end fixture (GPU machine): a Qwen3-8B-shaped target with random bf16 weights (transformers' own Qwen3,
initialised on the GPU, written as a sharded safetensors checkpoint) and a data set of random ~3000-token samples
(prompt tokens loss_mask 0, answer tokens 1) as the JSONL that dflash-prepare reads.
usage: python3 bench/e2e_fixture.py OUT_DIR [--samples 400] [--layers 36]"""
import argparse, json, os, random, time, torch
from transformers import Qwen3Config, Qwen3ForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("out"); ap.add_argument("--samples", type=int, default=400); ap.add_argument("--layers", type=int, default=36)
a = ap.parse_args()
t0 = time.time()
cfg = Qwen3Config(hidden_size=4096, intermediate_size=12288, num_hidden_layers=a.layers, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=128, vocab_size=151936, rope_theta=1e6, rms_norm_eps=1e-6,
                  max_position_embeddings=40960, tie_word_embeddings=False)
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = Qwen3ForCausalLM(cfg)
model.save_pretrained(os.path.join(a.out, "target"), safe_serialization=True, max_shard_size="4GB")
print("target: %.1f B parameters written in %.1f s" % (sum(p.numel() for p in model.parameters()) / 1e9, time.time() - t0), flush=True)
rng = random.Random(7)
with open(os.path.join(a.out, "data.jsonl"), "w") as f:
    for _ in range(a.samples):
        n, p = rng.randint(2800, 3072), rng.randint(200, 600)
        ids = [rng.randrange(0, 151000) for _ in range(n)]
        f.write(json.dumps({"input_ids": ids, "loss_mask": [0] * p + [1] * (n - p)}) + "\n")
print("data: %d samples of 2800-3072 tokens" % a.samples, flush=True)
