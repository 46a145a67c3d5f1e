/* gated_delta_rule: the gated delta-rule linear attention of Gated DeltaNet (Qwen3.5 / Qwen3-Next linear-attention
 * layers) over packed variable-length sequences. Per value head h (q/k head h / (HV/HK)), with an fp32 state
 * S (Dk, Dv) that starts at zero at every sequence start:
 *   S ← exp(g_t) · S;  S ← S + k_t ⊗ (β_t · (v_t − Sᵀ k_t));  o_t = Sᵀ q_t.
 * q and k arrive already l2-normalised, q already scaled (Dk^-½): the caller's choice, as in transformers. */
#ifndef DFLASH_KERNEL_GATED_DELTA_RULE_H
#define DFLASH_KERNEL_GATED_DELTA_RULE_H

#include <stdint.h>

/* out (T, HV*Dv; ldo) from q, k (T, HK*Dk; ldq, ldk), v (T, HV*Dv; ldv), g and beta (T, HV; ldg, ldb: log-decay
 * g <= 0 and the write strength). cu_seqlens (nseq+1), cu_seqlens[nseq] = T. Token-by-token recurrence, fp32 state,
 * fp32 math. out must not overlap the inputs. */
void gated_delta_rule_forward_cpu(float *out, int ldo, const float *q, int ldq, const float *k, int ldk,
                                  const float *v, int ldv, const float *g, int ldg, const float *beta, int ldb,
                                  const int32_t *cu_seqlens, int nseq, int hk, int hv, int dk, int dv);
/* One sequence of T tokens continuing from state (hv, dk, dv), fp32, left holding the state after the last token
 * (decoding; zeros at a sequence start). Same layouts otherwise. */
void gated_delta_rule_forward_state_cpu(float *out, int ldo, const float *q, int ldq, const float *k, int ldk,
                                        const float *v, int ldv, const float *g, int ldg, const float *beta, int ldb,
                                        int T, int hk, int hv, int dk, int dv, float *state);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA, the chunked form (chunks of 64 tokens, fp32 state and math; bf16 q, k, v in and out, fp32 g and beta):
 * within a chunk the delta rule is a unit lower-triangular solve and every decay is exp of a non-positive
 * difference of in-chunk cumulative log-decays (never exp of a growing cumulative sum). Same layouts as the CPU
 * reference; cu_seqlens is a device array. dk <= 256. stream is a cudaStream_t. */
void gated_delta_rule_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k, int ldk,
                                   const uint16_t *v, int ldv, const float *g, int ldg, const float *beta, int ldb,
                                   const int32_t *cu_seqlens, int nseq, int hk, int hv, int dk, int dv,
                                   void *stream);
/* CUDA, decoding: the same over packed sequences that each continue from a carried state. state is an array of
 * slots of (hv, dk, dv) fp32 (gated_delta_rule_forward_state_cpu's layout); sequence s of the call starts from slot
 * state_in[s] (-1: a sequence start, zeros) and leaves the state after its last row in slot state_out[s] (device
 * arrays of nseq; a slot written is read by no sequence of the call). max_seqlen (host) bounds the rows of a
 * sequence: steps of a few rows run in chunks as short as that. */
void gated_delta_rule_forward_state_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k,
                                         int ldk, const uint16_t *v, int ldv, const float *g, int ldg,
                                         const float *beta, int ldb, const int32_t *cu_seqlens, int nseq,
                                         int max_seqlen, int hk, int hv, int dk, int dv, float *state,
                                         const int32_t *state_in, const int32_t *state_out, void *stream);
#ifdef __cplusplus
}
#endif

#endif
