/* dflash_attention: the DFlash training attention. Queries are the N*B block slots; keys/values are the context
 * rows (from F, the fused target hidden states) plus the block rows. The mask is kept as the structure it is:
 * block j sees context rows [ctx_start[j], ctx_start[j] + ctx_len[j]) (its sequence, positions strictly before
 * its anchor) and its own B block rows, both directions; nothing else. A sliding-window layer (window W > 0)
 * narrows that per query slot (dflash_attn_window). GQA; no (Q, K) matrix is ever built.
 * The forward saves the log-sum-exp per (query, head) for the backward. */
#ifndef DFLASH_KERNEL_DFLASH_ATTENTION_H
#define DFLASH_KERNEL_DFLASH_ATTENTION_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dflash_attn_shape {
    int nblocks;      /* N */
    int block_size;   /* B */
    int nh, nkv, hd;  /* query heads, kv heads, head dim */
    float scale;      /* 1/sqrt(hd) */
    int window;       /* sliding window W of this layer (z-lab's sliding_window); 0: full attention */
    int max_ctx;      /* 0, or at least every block's ctx_len (the longest context a block sees; with packed
                       * sequences the longest sequence's, not T): only the CUDA backward's dS workspace layout reads
                       * it (dflash_attention_backward_workspace), 0 taking T */
} dflash_attn_shape;

#ifdef __CUDACC__
#define DFLASH_ATTN_HD __host__ __device__
#else
#define DFLASH_ATTN_HD
#endif

/* The keys that slot i of a block sees under window W, the one rule of the CPU reference and the CUDA kernels:
 * the block's context rows are the positions a-clen..a-1 just before its anchor a (row r of the clen is position
 * a-clen+r) and slot s sits at a+s. As z-lab's model.py (current version) with is_causal false, a query at position
 * q sees a key at position k only when |q - k| < W: context rows r in [*c0, clen) with a+i - (a-clen+r) < W, i.e.
 * r >= clen + i - W + 1, and block slots s in [*b0, *b1) with |i - s| < W. W = 0: [0, clen) and [0, B). */
static inline DFLASH_ATTN_HD void dflash_attn_window(int clen, int B, int i, int W, int *c0, int *b0, int *b1)
{
    if (W <= 0) {
        *c0 = 0, *b0 = 0, *b1 = B;
        return;
    }
    const int lo = clen + i - W + 1;
    *c0 = lo < 0 ? 0 : lo > clen ? clen : lo;
    *b0 = i - W + 1 < 0 ? 0 : i - W + 1;
    *b1 = i + W > B ? B : i + W;
}

/* The walk of a CUDA dq CTA that sums two blocks' dQ (DFLASH_ATTENTION_DQ_WS=pair): the union of two ranges of key
 * tiles [s0, e0) and [s1, e1) (empty when s >= e), ascending, each tile once. The tile after t (t = -1: the first):
 * the least tile > t in either range, or INT_MAX past the last. Each block's own tiles come in its own order
 * (ascending), so each sums what it would alone in the same order. */
static inline DFLASH_ATTN_HD int dflash_attn_tile_union_next(int t, int s0, int e0, int s1, int e1)
{
    int n0 = t + 1 < s0 ? s0 : t + 1, n1 = t + 1 < s1 ? s1 : t + 1;
    if (n0 >= e0) n0 = INT_MAX;
    if (n1 >= e1) n1 = INT_MAX;
    return n0 < n1 ? n0 : n1;
}

/* out (N*B, nh*hd); q (N*B, nh*hd); kc, vc (T, nkv*hd) context keys/values; kb, vb (N*B, nkv*hd) block
 * keys/values; ctx_start/ctx_len (N); lse (N*B, nh) written for the backward. */
void dflash_attention_forward_cpu(float *out, float *lse, const float *q, const float *kc, const float *vc,
                                  const float *kb, const float *vb, const int32_t *ctx_start,
                                  const int32_t *ctx_len, const dflash_attn_shape *s);
/* Gradients from dout (N*B, nh*hd): dq (overwritten), dkc/dvc (T, nkv*hd) and dkb/dvb (N*B, nkv*hd) accumulated
 * (+=; the caller zeroes them). Needs the forward's inputs, out and lse. */
void dflash_attention_backward_cpu(float *dq, float *dkc, float *dvc, float *dkb, float *dvb, const float *dout,
                                   const float *out, const float *lse, const float *q, const float *kc,
                                   const float *vc, const float *kb, const float *vb, const int32_t *ctx_start,
                                   const int32_t *ctx_len, const dflash_attn_shape *s);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA: bf16 tensors (uint16_t bits), fp32 softmax and accumulation, the lse in fp32. Device pointers; each row
 * stride (elements) may exceed the row so a tensor can be a column block of a wider one. ctx_start/ctx_len are
 * device arrays with 0 <= ctx_start[j] and ctx_start[j] + ctx_len[j] <= T. Tensor cores for hd 16/32/64/128/256 with
 * 16-byte aligned rows (wgmma at hd 128 on an sm_90 device unless DFLASH_ATTENTION=mma_sync, mma.sync otherwise), a
 * scalar path otherwise. Deterministic: the same inputs give the same bits (no atomics).
 * Fastest with the anchors of a sequence sorted (a block's context is then a prefix of the sequence). */
typedef struct dflash_attn_cuda_in {
    const uint16_t *q;  int ldq;   /* (N*B, nh*hd) */
    const uint16_t *kc; int ldkc;  /* (T, nkv*hd) context keys */
    const uint16_t *vc; int ldvc;  /* (T, nkv*hd) context values */
    const uint16_t *kb; int ldkb;  /* (N*B, nkv*hd) block keys */
    const uint16_t *vb; int ldvb;  /* (N*B, nkv*hd) block values */
    const int32_t *ctx_start, *ctx_len; /* (N), device */
    int T;                         /* context rows */
} dflash_attn_cuda_in;

typedef struct dflash_attn_cuda_grads {
    uint16_t *dq;  int lddq;   /* (N*B, nh*hd) */
    uint16_t *dkc; int lddkc;  /* (T, nkv*hd) */
    uint16_t *dvc; int lddvc;  /* (T, nkv*hd) */
    uint16_t *dkb; int lddkb;  /* (N*B, nkv*hd) */
    uint16_t *dvb; int lddvb;  /* (N*B, nkv*hd) */
} dflash_attn_cuda_grads;

/* out (N*B, nh*hd; ldo) and lse (N*B, nh; fp32, natural log) for the backward, on stream. */
void dflash_attention_forward_cuda(uint16_t *out, int ldo, float *lse, const dflash_attn_cuda_in *in,
                                   const dflash_attn_shape *s, void *stream);
/* Bytes of the backward's dS workspace for shape s over T context rows (0: the kernels for s take none, as on a device
 * without wgmma or at head_dim != 128): nkv * N * ceil(G*B/64) * (the 64-row tiles a block's context and its rows can
 * meet: its context at most min(s->max_ctx or T, window - 1) rows) 8 KB dS tiles, about 2 bytes per (query, head,
 * context row) pair, then 2 fp32 dK|dV partials (64 KB each) per 64 context rows and kv head. Window 0 and max_ctx 0
 * need the most, fewer blocks or rows less: size once for the largest shape; a call whose shape (its max_ctx) needs
 * more than the workspace given recomputes. */
size_t dflash_attention_backward_workspace(const dflash_attn_shape *s, int T);
/* All five gradients are OVERWRITTEN (unlike the CPU version, which accumulates into dkc..dvb); rows of kc/vc that
 * no block sees get 0. dout (N*B, nh*hd; lddo); out and lse from the forward; delta (N*B, nh) fp32 workspace
 * (rowsum(dout*out), overwritten); workspace (workspace_bytes, at least dflash_attention_backward_workspace's) holds
 * the dS tiles the dk/dv kernel hands to dq; NULL or smaller than this shape needs: dq recomputes them (slower; also
 * DFLASH_ATTENTION_DQ=recompute).
 * On stream. */
void dflash_attention_backward_cuda(const dflash_attn_cuda_grads *g, float *delta, void *workspace,
                                    size_t workspace_bytes, const uint16_t *dout, int lddo, const uint16_t *out,
                                    int ldo, const float *lse, const dflash_attn_cuda_in *in,
                                    const dflash_attn_shape *s, void *stream);
/* The backward's dk/dv CTAs where it takes the dS workspace, for tests and A/B runs: variant i of
 * dflash_attention_dkv_variants() (its name as DFLASH_ATTENTION_DKV takes it: "wg1" the one-warpgroup CTAs, "wg2..."
 * a producer and two consumer warpgroups with one schedule or another) is forced by dflash_attention_dkv_force(i); -1
 * goes back to what the environment says (unset: "wg2_tma4_bulk" without a window, "wg1" under one). The same bits all
 * ways. */
int dflash_attention_dkv_variants(void);
const char *dflash_attention_dkv_variant(int i); /* NULL past the last */
void dflash_attention_dkv_force(int i);
/* The dq CTAs that follow them, likewise: variant i of dflash_attention_dq_variants() (as DFLASH_ATTENTION_DQ_WS names
 * it: "one" a block a CTA, the default; "pair" two; "tma" one, staged by the bulk copy engine) forced by
 * dflash_attention_dq_force(i), -1 back to the environment's. The same bits all ways. */
int dflash_attention_dq_variants(void);
const char *dflash_attention_dq_variant(int i); /* NULL past the last */
void dflash_attention_dq_force(int i);
/* The forward's CTAs, likewise (head_dim 128 on wgmma): variant i of dflash_attention_fwd_variants() (as
 * DFLASH_ATTENTION_FWD names it: "cp_async" K and V staged by cp.async, "tma" by the bulk copy engine (the default), "ws" a producer
 * and two pipelined consumer warpgroups, "ws_turns" those taking turns) forced by dflash_attention_fwd_force(i), -1
 * back to the environment's. The same bits all ways. */
int dflash_attention_fwd_variants(void);
const char *dflash_attention_fwd_variant(int i); /* NULL past the last */
void dflash_attention_fwd_force(int i);
#ifdef __cplusplus
}
#endif

#endif
