/* attn_block_cuda: the attention sub-layer of the Qwen3 / Llama decoder layer on CUDA, shared by the dense,
 * qwen3_moe and gpt_oss families (the CUDA twin of attn_block.h, with its gpt_oss options): RMSNorm, one fused q|k|v GEMM, per-head q/k norm + RoPE, flash
 * attention over the packed sequences (or, decoding, the rows' keys and values appended to the cache and
 * flash-decoding against it), o_proj GEMM whose epilogue adds the residual; its device weights, workspaces and the
 * decoding cache of every layer's keys and values (one allocation, per layer keys then values, each
 * (nseq, max_len, nkv*hd) bf16). Allocation through target_cuda_alloc; CUDA failures exit via CHECK_CUDA; a load
 * error names the tensor. One caller per target (the layers run one after another on its stream). */
#ifndef DFLASH_ATTN_BLOCK_CUDA_H
#define DFLASH_ATTN_BLOCK_CUDA_H

#include <stdint.h>

#include "target_model_cuda_impl.h"

typedef struct attn_cuda_layer {
    uint16_t *input_norm;             /* (H) */
    uint16_t *q_norm, *k_norm;        /* (hd), Qwen3 only */
    uint16_t *w_qkv;                  /* (qd + 2 kd, H): q_proj | k_proj | v_proj rows */
    uint16_t *w_o;                    /* (H, qd) */
    /* gpt_oss's options (attn_block.h): fp32 biases of q|k|v (qd + 2 kd) and o (H), sink logits (nh); NULL: none;
     * the layer's window (0, as alloc leaves it: none; the family sets it: hf_layer_window) */
    float *b_qkv, *b_o, *sinks;
    int window;
} attn_cuda_layer;

/* Workspaces for m->max_tokens rows. */
typedef struct attn_cuda {
    uint16_t *qkv, *attn;             /* (T, qd + 2 kd), (T, qd) */
} attn_cuda;

void attn_cuda_layer_alloc(target_cuda *m, attn_cuda_layer *l);
void attn_cuda_layer_free(attn_cuda_layer *l);
/* Upload layer `layer`'s attention weights (input_layernorm, self_attn.*) from st, names under prefix. */
int attn_cuda_layer_load(target_cuda *m, attn_cuda_layer *l, const st_file *st, const char *prefix, int layer,
                         errbuf *err);
/* Random weights from *seed (advanced): linear weights uniform with half-width a, norms 1. */
void attn_cuda_layer_init_random(target_cuda *m, attn_cuda_layer *l, uint64_t *seed, float a);
void attn_cuda_alloc(target_cuda *m, attn_cuda *w);
void attn_cuda_free(attn_cuda *w);

/* Layer li's attention over rows, enqueued on m->stream: m->x = r (ldr) + o_proj(attention(rmsnorm(r))); m->u is
 * used. kv: NULL (packed causal) or the decoding cache, whose state is attn_cuda_cache_new's. */
void attn_cuda_forward(target_cuda *m, const attn_cuda *w, const attn_cuda_layer *l, int li, const tc_rows *rows,
                       const tc_kv_cache *kv, const uint16_t *r, int ldr);

/* The keys and values of m->nlayers layers for nseq x max_len positions, steps of at most max_step rows: a
 * target_cuda_ops cache_new / cache_destroy pair (a crop needs nothing: positions past a length are overwritten). */
int attn_cuda_cache_new(target_cuda *m, int nseq, int max_len, int max_step, void **state, size_t *bytes,
                        errbuf *err);
void attn_cuda_cache_destroy(void *state);

#endif
