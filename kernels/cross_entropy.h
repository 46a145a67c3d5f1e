/* cross_entropy: the drafter loss head. For a chunk of n rows of final hidden states, logits = h · lm_headᵀ over
 * the whole vocabulary (in a caller-provided (n, V) workspace, so only one chunk's logits exist at a time), the
 * per-row cross-entropy against a label, the argmax, and optionally the gradient with respect to h for the loss
 * Σ_rows weight·CE · loss_scale. lm_head is frozen: no gradient for it. Rows with weight 0 are skipped (CE 0). */
#ifndef DFLASH_KERNEL_CROSS_ENTROPY_H
#define DFLASH_KERNEL_CROSS_ENTROPY_H

#include <stddef.h>
#include <stdint.h>

/* h (n, H); lm_head (V, H); labels, weights (n); outputs: ce (n) unweighted CE (0 where weight == 0), argmax (n)
 * (may be NULL), dh (n, H) overwritten with ∂(Σ weight·CE·loss_scale)/∂h (NULL = no backward);
 * logits_ws (n*V floats) scratch. */
void cross_entropy_chunk_cpu(float *ce, int32_t *argmax, float *dh, const float *h, int n, int H,
                             const float *lm_head, int V, const int32_t *labels, const float *weights,
                             float loss_scale, float *logits_ws);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA (cuBLASLt + one row kernel), bf16 operands, fp32 logits. Rows go in chunks of C = min(max_rows, chunk), the
 * first chunk taking the remainder:
 * logits (C, V) fp32 = h·lm_headᵀ; one cluster of up to 8 blocks per row reads the row once into shared memory,
 * gives max, log-sum-exp, argmax and CE, then (backward) overwrites the logits in place with the bf16 row
 * (softmax - onehot)·w·loss_scale, and dh = G · lm_head. A chunk's row kernel and dh GEMM run on a second stream of
 * the context beside the next chunk's logits GEMM (two logits buffers). Workspace: 2·C·round_up(V, 64)·4 bytes
 * (1.24 GB at C 1024, V 151936) + 3·C·H bf16 + 2·32 MiB for cuBLASLt, all allocated by _create. Deterministic: no
 * atomics, fixed-order reductions, GEMM algorithms chosen from the heuristic's answer (never by timing), cached per
 * shape. One context per stream; no host synchronisation; errors exit through CHECK_*. */
typedef struct cross_entropy_cuda_ctx cross_entropy_cuda_ctx;
/* Context for hidden size H and vocabulary V (H % 8 == 0, V at most 8 blocks' shared memory: ~400K); rows per
 * chunk min(max_rows, chunk_rows), chunk_rows 0 means 1024; any n works (in ceil(n / chunk) chunks). */
cross_entropy_cuda_ctx *cross_entropy_cuda_create(int max_rows, int H, int V, int chunk_rows);
void cross_entropy_cuda_destroy(cross_entropy_cuda_ctx **ctx);
/* Device bytes the context holds. */
size_t cross_entropy_cuda_workspace_bytes(const cross_entropy_cuda_ctx *ctx);
/* What runs on the context's second stream: 0 nothing, 1 the row kernels, 2 (default) the row kernels and the dh
 * GEMMs (beside the next chunk's logits GEMM); the results are the same bits. */
void cross_entropy_cuda_set_overlap(cross_entropy_cuda_ctx *ctx, int level);
/* Diagnostics (timing tests): up to max_out (<= 8) of cuBLASLt's heuristic algorithms for one chunk GEMM of m rows
 * (which 0: the logits, from h (m, H; ldh); 1: dh, from the context's first logits buffer as G), each timed over
 * three calls after one warm-up (ms -1: not runnable); used marks the one the context runs. Returns how many. */
typedef struct cross_entropy_algo {
    int32_t id, splitk, used;
    uint32_t tile, reduction, stages;
    uint16_t cluster;
    float waves, ms;
} cross_entropy_algo;
int cross_entropy_cuda_survey(cross_entropy_cuda_ctx *ctx, int which, int m, const uint16_t *h, int ldh,
                              const uint16_t *lm_head, cross_entropy_algo *out, int max_out, void *stream);
/* All pointers on the device. h (n, H; ldh) and lm_head (V, H) bf16, 16-byte aligned, ldh % 8 == 0; labels,
 * weights (n); outputs: ce (n) unweighted CE (0 where weight == 0), argmax (n, lowest index on ties; may be NULL),
 * wce_sum (1 double: Σ weight·CE in a fixed order; may be NULL), dh (n, H; lddh, bf16, 16-byte aligned,
 * lddh % 8 == 0) = ∂(loss_scale·Σ weight·CE)/∂h, 0 on rows of weight 0 (NULL: forward only). A weighted row whose
 * label is outside [0, V) gets ce NaN. rows (device, nrows ascending distinct indices in [0, n)) lists the rows to
 * compute, e.g. those of non-zero weight; the others get ce 0, argmax -1 and dh 0 at no GEMM cost; rows NULL: all n
 * (nrows ignored). stream is a cudaStream_t. */
void cross_entropy_cuda(cross_entropy_cuda_ctx *ctx, float *ce, int32_t *argmax, double *wce_sum, uint16_t *dh,
                        int lddh, const uint16_t *h, int ldh, const uint16_t *lm_head, const int32_t *labels,
                        const float *weights, float loss_scale, int n, const int32_t *rows, int nrows,
                        void *stream);
#ifdef __cplusplus
}
#endif

#endif
