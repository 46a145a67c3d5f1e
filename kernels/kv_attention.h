/* kv_attention: attention of new query rows against a KV cache, for decoding. A cache holds nseq sequences of
 * max_len rows each, row = nkv*hd values, sequence s at offset s*seq_stride (elements) of kc and vc. Query row t
 * belongs to sequence seq[t] at absolute position pos[t] and attends to that sequence's keys [0, pos[t]] (causal
 * across the cache and the new rows alike: append the new rows' keys and values first). GQA: query head h uses kv
 * head h / (nh/nkv). kv_cache_append writes the new rows' keys/values at (seq[t], pos[t]). */
#ifndef DFLASH_KERNEL_KV_ATTENTION_H
#define DFLASH_KERNEL_KV_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

/* k (T, nkv*hd; ldk), v (T; ldv) -> row pos[t] of sequence seq[t] in kc / vc (row length kd = nkv*hd). */
void kv_cache_append_cpu(float *kc, float *vc, size_t seq_stride, const float *k, int ldk, const float *v, int ldv,
                         const int32_t *seq, const int32_t *pos, int T, int kd);
/* out (T, nh*hd; ldo) = softmax(q kᵀ * scale) v over keys [0, pos[t]] of sequence seq[t]; q (T, nh*hd; ldq). */
void kv_attention_forward_cpu(float *out, int ldo, const float *q, int ldq, const float *kc, const float *vc,
                              size_t seq_stride, const int32_t *seq, const int32_t *pos, int T, int nh, int nkv, int hd,
                              float scale);
/* As kv_attention_forward_cpu, with attention.h's window (keys pos[t]-window+1 .. pos[t]) and sinks; o NULL: none. */
struct attention_opts;
void kv_attention_opts_forward_cpu(float *out, int ldo, const float *q, int ldq, const float *kc, const float *vc,
                                   size_t seq_stride, const int32_t *seq, const int32_t *pos, int T, int nh, int nkv,
                                   int hd, float scale, const struct attention_opts *o);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA, bf16 cache and rows, fp32 softmax and accumulation. seq/pos are device arrays; max_pos (host) bounds every
 * pos[t]. The attention splits the keys into chunks (flash-decoding: one CTA per chunk, kv head and query row, then
 * a combine: a kernel, or at batch 64 the last CTA of each row and kv head), so one query row still spreads over
 * the device; its fp32 partials and the combine's counters go to workspace (kv_attention_workspace_bytes), which must
 * be zero when new (cudaMemset once after cudaMalloc: every call leaves the counters zero again). hd <= 256,
 * nh/nkv <= 16; head_dim a multiple of 16 and groups of at most 8 (the Qwen3 and gpt-oss shapes) score and sum
 * the values on the tensor cores (the probabilities rounded to bf16), the others on FMA loops. stream is a
 * cudaStream_t. The bits of a row depend on its position, the shapes and the cache only (not on T or max_pos).
 * DFLASH_KV_OLD=1 in the environment: the FMA loops, a chunk a CTA and the combine kernel (the kernels before,
 * bench_decode's A/B). */
void kv_cache_append_cuda(uint16_t *kc, uint16_t *vc, size_t seq_stride, const uint16_t *k, int ldk,
                          const uint16_t *v, int ldv, const int32_t *seq, const int32_t *pos, int T, int kd,
                          void *stream);
size_t kv_attention_workspace_bytes(int T, int nh, int hd, int max_pos);
void kv_attention_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *kc,
                               const uint16_t *vc, size_t seq_stride, const int32_t *seq, const int32_t *pos,
                                   int T, int max_pos, int nh, int nkv, int hd, float scale, float *workspace,
                                   void *stream);
/* As kv_attention_forward_cuda, with attention.h's window (> 0) and sinks (nh fp32 on the device, or NULL). */
void kv_attention_opts_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *kc,
                                    const uint16_t *vc, size_t seq_stride, const int32_t *seq, const int32_t *pos,
                                    int T, int max_pos, int nh, int nkv, int hd, float scale, int window,
                                    const float *sinks, float *workspace, void *stream);
#ifdef __cplusplus
}
#endif

#endif
