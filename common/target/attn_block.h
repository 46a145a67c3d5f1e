/* attn_block: the attention sub-layer of the Qwen3 / Llama decoder layer on the CPU (fp32), shared by the dense,
 * qwen3_moe and gpt_oss families: input RMSNorm, q/k/v projections (with biases: gpt_oss), optional q/k RMSNorm per
 * head (Qwen3), full RoPE (YaRN's attention factor in the logit scale, hf_attn_scale), causal GQA attention (with a
 * sliding window and sink logits: gpt_oss) within the packed sequences or against a KV cache, o_proj added to the residual stream; its weights;
 * and the decoding cache of every layer's keys and values. A block owns its weights, the activations are the
 * caller's (one call at a time per attn_acts). Errors name the checkpoint tensor. */
#ifndef DFLASH_ATTN_BLOCK_H
#define DFLASH_ATTN_BLOCK_H

#include <stddef.h>
#include <stdint.h>

#include "hf_config.h"
#include "safetensors.h"
#include "util.h"

typedef struct attn_block {
    float *input_norm;                   /* (H) */
    float *q_norm, *k_norm;              /* (hd), when c->has_qk_norm */
    float *wq, *wk, *wv, *wo;            /* (nh*hd, H), (nkv*hd, H) x2, (H, nh*hd) */
    /* gpt_oss's options: biases (c->attention_bias; NULL: none) of q, k, v (nh*hd, nkv*hd x2) and o (H); a sink
     * logit per head (c->attn_sinks: self_attn.sinks (nh)); the layer's window (hf_layer_window; 0: none) */
    float *bq, *bk, *bv, *bo;
    float *sinks;
    int window;
} attn_block;

/* The block's activations over T rows: u (T, H) the normed rows (the caller may reuse it for its MLP), q and attn
 * (T, nh*hd), k and v (T, nkv*hd; or rows of a KV cache). Zero-initialised is empty. */
typedef struct attn_acts {
    float *u, *q, *k, *v, *attn;
    int rows;                            /* rows they hold */
} attn_acts;

/* Where the attention finds its keys and values. NULL: within each sequence of the packed rows (cu_seqlens), from
 * a->k / a->v. A cache: a->k / a->v point at the new rows' place in it (the block computes them there), and row t
 * attends to keys [0, pos[t]] of sequence seq[t] of kc / vc (kv_attention's layout). */
typedef struct attn_kv_view {
    const float *kc, *vc;
    size_t seq_stride;
    const int32_t *seq;
} attn_kv_view;

/* The attention weights of layer `layer` of c from st, under "<prefix>layers.<layer>.": input_layernorm and
 * self_attn.{q,k,v,o}_proj (and q_norm / k_norm; the projections' .bias, self_attn.sinks). On failure a holds what was loaded (attn_block_free frees it). */
int attn_block_load(attn_block *a, const st_file *st, const hf_config *c, const char *prefix, int layer, errbuf *err);
void attn_block_free(attn_block *a);

/* Grow a to T rows (with k and v unless the rows' keys and values live in a cache). */
void attn_acts_reserve(attn_acts *a, const hf_config *c, int T, int with_kv);
void attn_acts_free(attn_acts *a);

/* x (T, H) += o_proj(attention(rows x at positions pos)), in place; kv as above (cu_seqlens and nseq are read only
 * without one). inv_freq: (head_dim/2) RoPE frequencies. */
void attn_block_forward_cpu(const attn_block *w, const hf_config *c, const double *inv_freq, float *x,
                            const attn_acts *a, int T, const int32_t *pos, const int32_t *cu_seqlens, int nseq,
                            const attn_kv_view *kv);

/* Decoding: every layer's keys and values, (num_layers, nseq, max_len, nkv*hd), post q/k norm and RoPE. Positions
 * past a sequence's length are simply overwritten later, so a crop needs nothing here. */
typedef struct attn_kv_cache {
    int nseq, max_len, kd;
    float *k, *v;
} attn_kv_cache;

void attn_kv_cache_init(attn_kv_cache *k, const hf_config *c, int nseq, int max_len);
void attn_kv_cache_free(attn_kv_cache *k);
/* Layer li's view for the new rows of sequence seq from position past (seqs: the sequence of each new row): a->k /
 * a->v point at their place in the cache, *kv at the layer's cache. a is a copy of the caller's acts (its own k and
 * v are not freed here, nor may the copy's be). */
void attn_kv_cache_rows(const attn_kv_cache *k, int li, int seq, int past, const int32_t *seqs, attn_acts *a,
                        attn_kv_view *kv);

#endif
