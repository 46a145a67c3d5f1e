/* gated_delta_chunk: the gated delta rule of gated_delta_rule.h in the chunkwise WY/UT form on the tensor cores
 * (the form of flash-linear-attention's chunk kernel), forward only. Same contract, layouts and results as
 * gated_delta_rule_forward_cuda (the CPU reference is gated_delta_rule_forward_cpu): packed variable-length sequences
 * that each start from a zero state, GQA head mapping (value head h reads q/k head h / (hv/hk)), q and k already
 * l2-normalised (q scaled). Deterministic: no atomics, a fixed order of every sum. Stateless; errors exit(1). */
#ifndef DFLASH_KERNEL_GATED_DELTA_CHUNK_H
#define DFLASH_KERNEL_GATED_DELTA_CHUNK_H

#include <stdint.h>

/* precision of the tensor-core products (the state, the sums and the solve stay fp32 in both) */
enum gated_delta_chunk_mode {
    GATED_DELTA_CHUNK_EXACT = 0, /* fp32 operands (state, inverse, δ) split into bf16 hi + lo: ~fp32 products */
    GATED_DELTA_CHUNK_BF16 = 1,  /* fp32 operands rounded to bf16 once, as flash-linear-attention does */
};

#ifdef __cplusplus
extern "C" {
#endif
/* Drop-in for gated_delta_rule_forward_cuda (same arguments): out (T, hv*dv; ldo) bf16 from q, k (T, hk*dk) bf16,
 * v (T, hv*dv) bf16, g and beta (T, hv) fp32; cu_seqlens (nseq+1) a device array. Chunks of 64 tokens that never
 * cross a sequence; dk 128 or 256 on the tensor cores (any other dk <= 256 runs the old kernel); any dv.
 * Mode GATED_DELTA_CHUNK_EXACT. stream is a cudaStream_t. */
void gated_delta_chunk_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k, int ldk,
                                    const uint16_t *v, int ldv, const float *g, int ldg, const float *beta, int ldb,
                                    const int32_t *cu_seqlens, int nseq, int hk, int hv, int dk, int dv,
                                    void *stream);
/* The same with the precision chosen (enum gated_delta_chunk_mode). */
void gated_delta_chunk_forward_mode_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k,
                                         int ldk, const uint16_t *v, int ldv, const float *g, int ldg,
                                         const float *beta, int ldb, const int32_t *cu_seqlens, int nseq, int hk,
                                         int hv, int dk, int dv, int mode, void *stream);
/* Decoding: gated_delta_rule_forward_state_cuda's contract (sequences continuing from carried states in slots of
 * (hv, dk, dv) fp32: state_in[s], -1 a start; the state after the last row to state_out[s]; device arrays), on the
 * tensor cores in mode GATED_DELTA_CHUNK_EXACT when dk is 128 or 256 and some sequence has more than 16 rows
 * (max_seqlen, host: a prefill); shorter steps and other dk run gated_delta_rule_forward_state_cuda. */
void gated_delta_chunk_forward_state_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k,
                                          int ldk, const uint16_t *v, int ldv, const float *g, int ldg,
                                          const float *beta, int ldb, const int32_t *cu_seqlens, int nseq,
                                          int max_seqlen, int hk, int hv, int dk, int dv, float *state,
                                          const int32_t *state_in, const int32_t *state_out, void *stream);
#ifdef __cplusplus
}
#endif

#endif
