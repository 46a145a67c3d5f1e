/* target_model_cuda_impl: the CUDA target as the generic code (target_model_cuda.c, target_decode_cuda.c) and the
 * families' CUDA files (target_dense_cuda.c, target_hybrid_cuda.c) share it, the operations a family gives the
 * CUDA backend, and the pieces the families use (target_base_cuda.c). The generic code owns the stream, cuBLASLt,
 * the frozen tables, RoPE frequencies, the residual stream and the batch staging; the family owns its layers and
 * their workspaces (m->layers). Only common/target includes it. */
#ifndef DFLASH_TARGET_MODEL_CUDA_IMPL_H
#define DFLASH_TARGET_MODEL_CUDA_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "hf_config.h"
#include "matmul.h"
#include "safetensors.h"
#include "target_family.h"
#include "target_model_cuda.h"
#include "util.h"

#define TC_MAX_EVENTS 4096

typedef struct target_cuda_ops target_cuda_ops;

struct target_cuda {
    hf_config cfg;
    const target_family *fam;        /* chosen from cfg (target_family_of) */
    const target_cuda_ops *ops;      /* the family's CUDA operations */
    int nlayers, full;
    cudaStream_t stream;
    int own_stream;
    matmul_cuda *mm;
    uint16_t *embed, *lm_head, *final_norm;
    void *layers;                    /* the family's layers and workspaces */
    double *d_inv_freq;              /* (fam->rope_dims(cfg)/2) */
    size_t device_bytes;
    struct target_arena *arena;      /* NULL: every buffer cudaMalloc'ed; else carved from it in allocation order
                                      * (target_cuda_load_kept: the weights outlive the process) */
    /* workspaces for max_tokens: the residual stream x and the normed rows u (T, H) */
    int max_tokens, max_seqs;
    int gemv_rows;                 /* linear layers of at most this many rows run the GEMV (target_cuda_linear) */
    uint16_t *x, *u;
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

/* A decoding step's view of the cache for a forward's rows: row t is sequence seq[t] at absolute position pos[t];
 * every layer appends the rows' keys and values (or states) to the family's part of the cache (state) and attends
 * to the sequence's cached rows [0, pos[t]]. packed: every sequence of the call starts at position 0 and its rows
 * are contiguous (cu_seqlens), so the flash kernel over the rows alone gives the same result. */
typedef struct tc_kv_cache {
    void *state;                /* the family's (cache_new) */
    const int32_t *seq, *pos;   /* device (T) */
    int max_pos;                /* host bound of pos */
    int packed;
} tc_kv_cache;

/* The rows of a forward, on the device: ids and positions (T), cu_seqlens (nseq+1; max_seqlen its longest). */
typedef struct tc_rows {
    int T, nseq, max_seqlen;
    const int32_t *ids, *pos, *cu;
} tc_rows;

/* A family's operations on the CUDA backend; the cache operations are NULL when it cannot decode there (its row's
 * can[TARGET_BACKEND_CUDA] says so, and target_cuda_cache_create checks that first). */
struct target_cuda_ops {
    /* Weight buffers and workspaces of m->nlayers layers for m->max_tokens rows (m->cfg, m->stream, m->mm set):
     * m->layers. Refuses shapes its kernels do not take, naming them. */
    int (*create)(target_cuda *m, errbuf *err);
    void (*destroy)(target_cuda *m);
    /* Upload layers [0, m->nlayers) from st (names under prefix). It writes only the device buffers create made:
     * a model whose arena already holds this checkpoint's weights skips it (target_cuda_load_kept). */
    int (*load)(target_cuda *m, const st_file *st, const char *prefix, errbuf *err);
    /* Deterministic random weights from *seed (advanced), linear weights uniform with half-width a, norms 1. */
    void (*init_random)(target_cuda *m, uint64_t *seed, float a);
    /* Layer li over rows, enqueued on m->stream: the residual stream comes in at r (row stride ldr) and the layer's
     * output goes to dst (ldd; may be r). m->u and m->x are the layer's to use. kv: NULL (packed causal forward)
     * or the decoding cache. */
    void (*layer)(target_cuda *m, int li, const tc_rows *rows, const tc_kv_cache *kv, const uint16_t *r, int ldr,
                  uint16_t *dst, int ldd);
    /* The family's part of a decoding cache of nseq x max_len positions, steps of at most max_step rows: *state,
     * its device bytes added to *bytes. -ENOMEM naming the size when the device is full. */
    int (*cache_new)(target_cuda *m, int nseq, int max_len, int max_step, void **state, size_t *bytes, errbuf *err);
    void (*cache_destroy)(void *state);
    /* Before a step's forward (NULL: nothing to do): sequence seqs[i] (i < nrun) gets n[i] rows from position
     * past[i], ids concatenated (host). keep: the family records what a later crop into this forward needs (0 while
     * a crop re-runs tokens, target_decode_cuda.c). Enqueues on m->stream what the step's layers read. */
    void (*cache_begin)(void *state, int nrun, const int *seqs, const int *past, const int *n, const int32_t *ids,
                        int keep);
    /* Sequence seq holding `held` positions keeps len (0 <= len <= held): returns how many tokens the caller must
     * run again (keep = 0) from position *rerun_from, ids *rerun_ids, to rebuild the states (0: none; the caller
     * sets the length to *rerun_from first), or -EINVAL with nothing changed (target_cpu_ops' cache_crop
     * contract). NULL: the lengths say it all. */
    int (*cache_crop)(void *state, int seq, int len, int held, int *rerun_from, const int32_t **rerun_ids,
                      errbuf *err);
    /* 1: a decoding step's layers (kv != NULL, not packed, kv->max_pos the cache's last position) read every value
     * that changes from step to step from device memory (the rows' ids, positions, sequences), launch the same
     * kernels with the same arguments for the same shape, and neither synchronise nor allocate, and cache_begin is
     * NULL: target_decode_cuda.c captures such a step as one CUDA graph and replays it. 0: every step is launched
     * kernel by kernel. */
    int step_graph;
};

/* The CUDA operations of family f (target_family_cuda.c: the rows of target_families.def). */
const target_cuda_ops *target_family_cuda_ops(const target_family *f);

/* ---- pieces shared by the generic code and the families (target_base_cuda.c) ---- */
/* cudaMalloc (or the arena's next buffer: create must allocate in the same order for the same shape, so that a
 * re-imported arena finds every weight where it was), counted in m->device_bytes; CUDA failures exit through
 * CHECK_CUDA. */
void *target_cuda_alloc(target_cuda *m, size_t bytes);
/* cudaFree *p (a void ** passed as void *; a part of an arena is left alone) and NULL it. */
void target_cuda_free(void *p);
/* dst (n bf16, device) = bf16(src[i] + add), through a host staging buffer. */
void target_cuda_put(uint16_t *dst, const float *src, size_t n, float add);
/* A linear layer of T rows on m->stream, matmul_forward_cuda's contract (y = x·wᵀ + beta·c): the GEMV kernels
 * (gemv.h) for the few rows of a decoding step (T <= m->gemv_rows, target_cuda_set_gemv_rows), else cuBLASLt.
 * Every target linear layer whose rows are activations goes through here. */
void target_cuda_linear(target_cuda *m, uint16_t *y, int ldy, const uint16_t *c, int ldc, float beta,
                        const uint16_t *x, int ldx, const uint16_t *w, int T, int n, int k);
/* y = rmsnorm(x; norm_w, eps)·wᵀ (a layer's input norm and its first linear layer): for the few rows of a decoding
 * step one GEMV with the norm on the fly (gemv_rmsnorm_forward_cuda; u is not written), else rmsnorm_forward_cuda
 * into u (T rows of k) and target_cuda_linear. */
void target_cuda_norm_linear(target_cuda *m, uint16_t *y, int ldy, uint16_t *u, const uint16_t *x, int ldx,
                             const uint16_t *norm_w, float eps, const uint16_t *w, int T, int n, int k);
/* act (T, I; ldact) = swiglu(rmsnorm(x; norm_w, eps)·w_guᵀ), w_gu (2I, k) the gate's rows then the up's (an MLP's
 * first half): for the few rows of a decoding step one GEMV with the norm and SwiGLU folded in
 * (gemv_rmsnorm_swiglu_forward_cuda; gu and u are not written; the same bits); on an sm_90a device (unless
 * DFLASH_GATEUP_FUSED=0) rmsnorm_forward_cuda into u and the GEMM with SwiGLU in its epilogue
 * (matmul_swiglu_forward_cuda; gu is not written); else target_cuda_norm_linear into gu (T, 2I) and
 * swiglu_forward_cuda. Marks its kernels' classes. */
void target_cuda_norm_linear_swiglu(target_cuda *m, uint16_t *act, int ldact, uint16_t *gu, uint16_t *u,
                                    const uint16_t *x, int ldx, const uint16_t *norm_w, float eps, const uint16_t *w_gu,
                                    int T, int I, int k);
/* Profiling: charge the span since the previous mark to class cls (no-op unless profiling). */
void target_cuda_mark(target_cuda *m, int cls);

/* Embedding, layers [0, deepest], final norm and lm_head, enqueued on m->stream: taps -> aux (ld_aux), the last
 * layer's output -> last, logits of the rows logit_rows[0..nlogit) (device; NULL: every row in order) -> logits
 * (nlogit or T rows of V). kv: NULL for the packed causal forward. deepest as target_request_depth gave it. */
void target_cuda_run_layers(target_cuda *m, const tc_rows *rows, const tc_kv_cache *kv, int deepest, const int *taps,
                            int ntaps, uint16_t *aux, int ld_aux, uint16_t *last, uint16_t *logits,
                            const int32_t *logit_rows, int nlogit);

#endif
