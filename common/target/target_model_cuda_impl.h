/* target_model_cuda_impl: the CUDA target's weights and workspaces, and the layer loop that both the packed forward
 * (target_model_cuda.c) and decoding against a KV cache (target_decode_cuda.c) run. Only common/model includes it. */
#ifndef DFLASH_TARGET_MODEL_CUDA_IMPL_H
#define DFLASH_TARGET_MODEL_CUDA_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "hf_config.h"
#include "matmul.h"
#include "target_model_cuda.h"
#include "util.h"

#define TC_MAX_EVENTS 4096

typedef struct tc_layer {
    uint16_t *input_norm, *post_norm; /* (H) */
    uint16_t *q_norm, *k_norm;        /* (hd), Qwen3 only */
    uint16_t *w_qkv;                  /* (qd + 2 kd, H): q_proj | k_proj | v_proj rows */
    uint16_t *w_o;                    /* (H, qd) */
    uint16_t *w_gu;                   /* (2 I, H): gate_proj | up_proj rows */
    uint16_t *w_down;                 /* (H, I) */
} tc_layer;

struct target_cuda {
    hf_config cfg;
    int nlayers, full;
    cudaStream_t stream;
    int own_stream;
    matmul_cuda *mm;
    uint16_t *embed, *lm_head, *final_norm;
    tc_layer *layers;                /* Qwen3 / Llama */
    struct target_hybrid_cuda *hy;   /* hybrid targets (target_hybrid_cuda.c): their layers and workspaces */
    double *d_inv_freq;              /* (rd/2): rd = head_dim, or rotary_dim for hybrid targets */
    size_t device_bytes;
    /* workspaces for max_tokens */
    int max_tokens, max_seqs;
    uint16_t *x, *u, *qkv, *attn, *gu, *act;
    int32_t *d_ids;                /* device copy of the batch: ids (T) | positions (T) | cu_seqlens (nseq+1) */
    int32_t *h_stage;              /* pinned staging of the same */
    cudaEvent_t staged;            /* the last upload from h_stage has completed */
    /* profiling */
    int profiling;
    cudaEvent_t ev[TC_MAX_EVENTS];
    int ev_class[TC_MAX_EVENTS];
    int nev;
    double prof_ms[TARGET_CUDA_NCLASS];
};

/* Attention against a KV cache for a forward's rows: row t is sequence seq[t] at absolute position pos[t]; every
 * layer appends the rows' keys and values to its cache (kc[li], vc[li]; sequence s at s*seq_stride elements) and
 * attends to the sequence's cached keys [0, pos[t]]. packed: every sequence of the call starts at position 0 and
 * its rows are contiguous (cu_seqlens), so the flash kernel over the rows alone gives the same result. */
typedef struct tc_kv_cache {
    uint16_t *const *kc, *const *vc;
    size_t seq_stride;
    const int32_t *seq, *pos;   /* device (T) */
    int max_pos;                /* host bound of pos */
    float *workspace;           /* kv_attention_workspace_bytes(T, nh, hd, max_pos) */
    int packed;
} tc_kv_cache;

/* The rows of a forward, on the device: ids and positions (T), cu_seqlens (nseq+1; max_seqlen its longest). */
typedef struct tc_rows {
    int T, nseq, max_seqlen;
    const int32_t *ids, *pos, *cu;
} tc_rows;

/* Embedding, layers [0, deepest], final norm and lm_head, enqueued on m->stream: taps -> aux (ld_aux), the last
 * layer's output -> last, logits of the rows logit_rows[0..nlogit) (device; NULL: every row in order) -> logits
 * (nlogit or T rows of V). kv: NULL for the packed causal forward. deepest as target_request_depth gave it. */
void target_cuda_run_layers(target_cuda *m, const tc_rows *rows, const tc_kv_cache *kv, int deepest, const int *taps,
                            int ntaps, uint16_t *aux, int ld_aux, uint16_t *last, uint16_t *logits,
                            const int32_t *logit_rows, int nlogit);

/* Pieces of the layer loop shared with the hybrid one (target_hybrid_cuda.c). */
/* Profiling: charge the span since the previous mark to class cls (no-op unless profiling). */
void target_cuda_mark(target_cuda *m, int cls);
/* Where layer li's output (the residual stream) goes: its first tap block of aux (*first_tap its index), else last
 * (the model's last layer), else m->x; *ldd its row stride. */
uint16_t *target_cuda_layer_dst(target_cuda *m, int li, const int *taps, int ntaps, uint16_t *aux, int ld_aux,
                                uint16_t *last, int *ldd, int *first_tap);
/* After layer li wrote r (ldr): the copies for a layer tapped twice, or tapped and also the last. */
void target_cuda_layer_copies(target_cuda *m, int li, int first_tap, const int *taps, int ntaps, uint16_t *aux,
                              int ld_aux, uint16_t *last, const uint16_t *r, int ldr, int T);
/* Final norm of r (ldr) and lm_head into logits (rows logit_rows, or all T), then the profile's collection. */
void target_cuda_finish(target_cuda *m, const uint16_t *r, int ldr, int T, uint16_t *logits,
                        const int32_t *logit_rows, int nlogit);

#endif
