/* gated_delta_prep: the per-token inputs of the gated delta rule from Gated DeltaNet's projections (Qwen3.5 /
 * Qwen3-Next, transformers' torch path): q and k (hk heads of dk each, side by side in one row) l2-normalised in
 * place, x / sqrt(Σx² + 1e-6), q then scaled by dk^-½; the write strength beta = sigmoid(b) and the log-decay
 * g = −exp(A_log) · softplus(a + dt_bias) per value head (softplus with torch's threshold 20). fp32 math. */
#ifndef DFLASH_KERNEL_GATED_DELTA_PREP_H
#define DFLASH_KERNEL_GATED_DELTA_PREP_H

#include <stdint.h>

/* qk (T, ldqk): q heads in columns [0, hk*dk), k heads in [hk*dk, 2*hk*dk), rewritten in place. b (T; ldb) and
 * a (T; lda) hold hv values per row; a_log, dt_bias (hv). beta and g (T, hv; ldo) are written. */
void gated_delta_prep_cpu(float *qk, int ldqk, int T, int hk, int dk, float *beta, float *g, int ldo,
                          const float *b, int ldb, const float *a, int lda, const float *a_log, const float *dt_bias,
                          int hv);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA: qk, b, a bf16 (b and a may be columns of the projection output); a_log, dt_bias, beta, g fp32 device
 * arrays. stream is a cudaStream_t. */
void gated_delta_prep_cuda(uint16_t *qk, int ldqk, int T, int hk, int dk, float *beta, float *g, int ldo,
                           const uint16_t *b, int ldb, const uint16_t *a, int lda, const float *a_log,
                           const float *dt_bias, int hv, void *stream);
#ifdef __cplusplus
}
#endif

#endif
