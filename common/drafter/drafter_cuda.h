/* drafter_cuda: the CUDA model backend (drafter.h) on one device. bf16 weights (the reducer's copy of step k, laid
 * out like the fp32 state) and activations, fp32 accumulation, fp32 gradients accumulated (+=) into the reducer's
 * buffer; the frozen embedding and lm_head (bf16) loaded once. Anchors and blocks are drawn on the host exactly as
 * drafter_cpu.c draws them and uploaded through pinned staging. Every workspace is allocated at create for
 * (max_tokens, max_seqs, tc->max_anchors): a step allocates no device memory. One stream owned by the backend; the
 * same inputs give bitwise-identical gradients (no atomics, cuBLASLt algorithms by heuristic). One backend per
 * thread. Errors: 0 / -errno with an errbuf; CUDA failures exit through CHECK_* (cuda_check.h). */
#ifndef DFLASH_DRAFTER_CUDA_H
#define DFLASH_DRAFTER_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "drafter.h"

/* The backend for the drafter tc->drafter with the frozen tables of the target checkpoint target_dir (bf16, f16 or
 * f32 on disk; bf16 on the device), on GPU `device` (made current for the calling thread; < 0: the current one).
 * batch->aux is device bf16 (ntok, K*H). */
int drafter_cuda_create(drafter_backend **out, const drafter_train_config *tc, const char *target_dir, int device,
                        int max_tokens, int max_seqs, errbuf *err);
/* The same with random frozen tables made on the device (rand_fill, uniform with std 0.02; benchmarks). */
int drafter_cuda_create_random(drafter_backend **out, const drafter_train_config *tc, uint64_t seed, int device,
                               int max_tokens, int max_seqs, errbuf *err);

/* The ops' forward_backward is drafter_cuda_enqueue + drafter_cuda_metrics + a wait for the stream: the gradients
 * are complete on return, whatever stream the caller reads them from (one host synchronisation per step). A caller
 * that works on drafter_cuda_stream (the reducer does) and syncs at commit calls the two itself instead. */
/* Enqueue the step on the backend's stream and return: the host arrays of the batch are consumed (copied to pinned
 * staging) before it returns; weights, grads and batch->aux must stay valid until the stream has finished. */
int drafter_cuda_enqueue(drafter_backend *b, const uint16_t *weights, float *grads, const drafter_batch *batch,
                         errbuf *err);
/* Inference (no loss, no backward, the training path untouched): the forward of the blocks blk (host arrays; labels
 * and weights unused) on T context rows aux (device bf16, (T, K*H)) with their positions (host, T), and the logits of
 * every block row into logits (device bf16, (N*B, V)). Enqueued on the backend's stream; the caller synchronises. */
int drafter_cuda_forward_logits(drafter_backend *b, const uint16_t *weights, const uint16_t *aux, int T,
                                const int32_t *positions, const drafter_blocks *blk, uint16_t *logits, errbuf *err);
/* Wait for the last enqueued step's metrics (copied back asynchronously into pinned memory) and fill *mt. */
void drafter_cuda_metrics(drafter_backend *b, drafter_metrics *mt);
/* Run one step at the largest shape (max_tokens in max_seqs sequences, the most blocks) against weights, into scratch
 * gradients, so that every kernel, cuBLASLt plan and module is ready before the worker says READY. */
int drafter_cuda_warm_up(drafter_backend *b, const uint16_t *weights, errbuf *err);
/* The backend's stream (a cudaStream_t): the caller may record an event after a step to sync at commit. */
void *drafter_cuda_stream(drafter_backend *b);
/* Device bytes the backend allocated (frozen tables, workspaces, cuBLASLt and loss-head workspaces). */
size_t drafter_cuda_device_bytes(const drafter_backend *b);

/* Kernel groups timed by the profiling mode. */
enum drafter_cuda_class { DRAFTER_CUDA_GEMM, DRAFTER_CUDA_ATTN_FWD, DRAFTER_CUDA_ATTN_BWD, DRAFTER_CUDA_CE,
                          DRAFTER_CUDA_OTHER, DRAFTER_CUDA_NCLASS };
/* Profiling: while on, a step records an event after every kernel group and waits for the device at its end; then
 * drafter_cuda_profile gives the last step's device milliseconds per class. */
void drafter_cuda_set_profiling(drafter_backend *b, int on);
void drafter_cuda_profile(const drafter_backend *b, double ms[DRAFTER_CUDA_NCLASS]);

#endif
