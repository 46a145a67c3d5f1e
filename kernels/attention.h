/* attention: causal self-attention over packed variable-length sequences (cu_seqlens), GQA, for the target
 * forward. Never materialises a (T, T) score matrix: one row of scores per query at a time. */
#ifndef DFLASH_KERNEL_ATTENTION_H
#define DFLASH_KERNEL_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

/* out (T, nh*hd) = softmax(q kᵀ * scale + causal mask within each sequence) v.
 * q (T, nh*hd), k and v (T, nkv*hd); query head h uses kv head h / (nh/nkv). cu_seqlens has nseq+1 entries,
 * cu_seqlens[nseq] = T. */
void attention_causal_forward_cpu(float *out, const float *q, const float *k, const float *v,
                                  const int32_t *cu_seqlens, int nseq, int nh, int nkv, int hd, float scale);

/* One query head qh (hd) against keys/values kh, vh (nk rows of stride ldkv): oh (hd) = softmax(qh·kᵀ * scale) v;
 * p is a scratch row of nk scores. The row every CPU attention reference computes. */
void attention_row_cpu(float *oh, const float *qh, const float *kh, const float *vh, int nk, size_t ldkv, int hd,
                       float scale, float *p);

/* The attention variants of gpt-oss (transformers' modeling_gpt_oss.py eager_attention_forward): a sliding window
 * and a learned sink logit per head. */
typedef struct attention_opts {
    int window;                          /* > 0: query t sees keys t-window+1 .. t only (transformers' sliding
                                          * window: kv > q - window); 0: every earlier key */
    const float *sinks;                  /* (nh) or NULL: head h's softmax has one more logit, sinks[h], in its
                                          * denominator (weighting no value) */
} attention_opts;

/* As attention_row_cpu, with the sink logit `sink` in the softmax (-INFINITY: none). */
void attention_row_sink_cpu(float *oh, const float *qh, const float *kh, const float *vh, int nk, size_t ldkv, int hd,
                            float scale, float sink, float *p);
/* As attention_causal_forward_cpu, with o's window and sinks (o NULL: none). */
void attention_causal_opts_forward_cpu(float *out, const float *q, const float *k, const float *v,
                                       const int32_t *cu_seqlens, int nseq, int nh, int nkv, int hd, float scale,
                                       const attention_opts *o);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA, bf16 in/out, fp32 softmax and accumulation (flash-style, tensor cores for head_dim 16/32/64/128 with
 * 16-byte aligned rows; a scalar path otherwise). Row strides in elements: q (T, nh*hd; ldq), k/v (T, nkv*hd;
 * ldk/ldv), out (T, nh*hd; ldo). cu_seqlens is a device array; max_seqlen is the longest sequence (host value). */
void attention_causal_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k, int ldk,
                                   const uint16_t *v, int ldv, const int32_t *cu_seqlens, int nseq, int max_seqlen,
                                   int nh, int nkv, int hd, float scale, void *stream);
/* As attention_causal_forward_cuda, with attention_opts' window (> 0) and sinks (nh fp32 on the device, or NULL). */
void attention_causal_opts_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k, int ldk,
                                        const uint16_t *v, int ldv, const int32_t *cu_seqlens, int nseq,
                                        int max_seqlen, int nh, int nkv, int hd, float scale, int window,
                                        const float *sinks, void *stream);

/* The Q side of qk_norm_rope (qk_norm_rope.h) folded into the causal attention (issue 23): the Hopper kernel
 * normalises (per head RMSNorm with q_w, fp32) and rotates (rotate-half RoPE at the row's position) each Q tile in
 * shared memory after it lands, rounding to bf16 once, in qk_norm_rope_cuda's per-token kernel's arithmetic order:
 * the same bits as qk_norm_rope_cuda on q then the attention where qk_norm_rope_cuda takes q with that kernel
 * ((nh + nkv)·hd/8 <= 640 threads, 16-byte aligned, no cache append: Qwen3-8B's 32 + 8 heads of 128), within the
 * bf16 rounding of the rows otherwise (its per-row kernels take the sine by sincosf instead of __sincosf). One HBM
 * pass of q less. */
typedef struct attention_qfold {
    const uint16_t *q_w;     /* (hd) bf16 q_norm weight, or NULL: rotation only (Llama) */
    float eps;               /* the norm's epsilon */
    const int32_t *pos;      /* (T) device: each packed row's position */
    const double *inv_freq;  /* (hd/2) device: rope_inv_freq */
} attention_qfold;
/* The one rule: whether attention_causal_qfold_forward_cuda folds the Q side for these arguments: the environment
 * asks for it (DFLASH_ATTENTION_QFOLD=1, or =begin for the variant that folds each item's rows only when the item
 * begins, none ahead during the previous item's GEMMs, to measure against; read once; off by default: on the H200
 * it is correct (every row bitwise) but slower, the 8B target's attention 35.1 ms (=1) and 30.0 (=begin) against
 * 23.9 unfolded, bench/RESULTS.md 2026-12-05) and the call takes the Hopper kernel (the choice
 * attention_causal_opts_forward_cuda makes: attention_wgmma_chosen(hd), 16-byte aligned rows, no window or sinks).
 * When 1, the caller runs qk_norm_rope_cuda with q = NULL (nh = 0: k only) and passes the fold; when 0,
 * qk_norm_rope_cuda on q and k as before and no fold. */
int attention_qfold_applies(const uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k, int ldk,
                            const uint16_t *v, int ldv, int hd, int window, const float *sinks);
/* attention_causal_opts_forward_cuda on raw q (not yet normed and rotated) with the fold (attention_qfold_applies
 * must have said 1 for these arguments: a call it does not take exits with a message), or on q as given when fold
 * is NULL. k must be normed and rotated already. */
void attention_causal_qfold_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k,
                                         int ldk, const uint16_t *v, int ldv, const int32_t *cu_seqlens, int nseq,
                                         int max_seqlen, int nh, int nkv, int hd, float scale, int window,
                                         const float *sinks, const attention_qfold *fold, void *stream);

/* The kernels behind attention_causal_forward_cuda, chosen in attention.cu (attention_cuda_kernel): the Hopper one
 * (attention_sm90.cu: wgmma, TMA, warp-specialised) where attention_wgmma_supported(hd) (an sm_90 device, head_dim
 * 64 or 128, 16-byte aligned rows), else mma.sync (attention.cu; any head_dim). DFLASH_ATTENTION=mma_sync in the
 * environment forces the latter (to measure one against the other). Tests and benchmarks call them by name. */
enum attention_cuda_kernel { ATTENTION_CUDA_AUTO = 0, ATTENTION_CUDA_MMA_SYNC, ATTENTION_CUDA_WGMMA };
void attention_causal_forward_cuda_with(enum attention_cuda_kernel kernel, uint16_t *out, int ldo, const uint16_t *q,
                                        int ldq, const uint16_t *k, int ldk, const uint16_t *v, int ldv,
                                        const int32_t *cu_seqlens, int nseq, int max_seqlen, int nh, int nkv, int hd,
                                        float scale, void *stream);
int attention_wgmma_supported(int hd);
/* Whether the Hopper (wgmma) attention kernels run for head_dim hd: attention_wgmma_supported(hd) and
 * DFLASH_ATTENTION is not mma_sync. The one rule the causal attention and the DFlash attention
 * (dflash_attention.cu's wgmma path at head_dim 128) choose their kernels by. */
int attention_wgmma_chosen(int hd);
/* The Hopper kernel itself (hd 64 or 128, on a device where attention_wgmma_supported). tma 1 stages the Q, K and V
 * tiles by the bulk tensor copy (a sequence's last, partial tile with the next sequence's first rows, which enter no
 * stored result: their keys' p is exactly 0; only a tile past the end of the packed rows by cp.async), 0 every tile
 * by cp.async with the rows past the sequence zero (also what happens when the driver cannot make a tensor map); both
 * give the same bits while the K/V rows are finite. DFLASH_ATTENTION_PINGPONG=0 in the environment (read once) has
 * its two consumer warpgroups issue their wgmmas without taking turns, to measure the ping-pong. */
void attention_wgmma_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k, int ldk,
                                  const uint16_t *v, int ldv, const int32_t *cu_seqlens, int nseq, int max_seqlen,
                                  int nh, int nkv, int hd, float scale, int tma, void *stream);
/* The Hopper kernel with the Q side of qk_norm_rope folded in (fold non-NULL; attention_qfold): q raw, k normed and
 * rotated; fold NULL: attention_wgmma_forward_cuda. The tests' and benchmarks' way to the fold by name (whatever
 * DFLASH_ATTENTION_QFOLD says, except that =begin picks that variant). */
void attention_wgmma_qfold_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k, int ldk,
                                        const uint16_t *v, int ldv, const int32_t *cu_seqlens, int nseq,
                                        int max_seqlen, int nh, int nkv, int hd, float scale, int tma,
                                        const attention_qfold *fold, void *stream);
#ifdef __cplusplus
}
#endif

#endif
