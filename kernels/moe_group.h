/* moe_group: the rows of a sparse MoE block grouped by expert, and the tile schedule of the grouped GEMMs that run
 * over them (moe_gemm), computed on the device so that nothing waits for the host. For T tokens with K picks each
 * (sel (T, K) expert ids in [0, E)) and, when shared_rows = T, a shared expert that sees every token as group E:
 *   off (E + 2):        group g's rows are [off[g], off[g+1]); the routed groups fill [0, T*K) with no padding, so
 *                       the shared group (when there is one) starts at row T*K; off[E+1] = T*K + shared_rows
 *   row_token (T*K + shared_rows): the token of each row; within a group, rows are in (token, pick) order (stable)
 *   slot_row (T*K):     the row of pick (t, j) at t*K + j
 *   tiles (3 * ntiles): (group, first row, end row) of every run of at most bm rows of one group, groups in order
 *   ntiles (1):         how many tiles (at most moe_group_max_tiles)
 * An id outside [0, E) (the router's answer to non-finite logits, whose token is non-finite already) is grouped
 * with expert 0, so that every index stays in bounds. Deterministic; no allocation beyond the caller's workspace. */
#ifndef DFLASH_KERNEL_MOE_GROUP_H
#define DFLASH_KERNEL_MOE_GROUP_H

#include <stddef.h>
#include <stdint.h>

/* Upper bound of ntiles for T*K picks of E experts, shared_rows shared rows and tiles of bm rows. */
int moe_group_max_tiles(int TK, int E, int shared_rows, int bm);
/* CPU reference: fills off, row_token, slot_row, tiles and returns ntiles. */
int moe_group_cpu(const int32_t *sel, int T, int K, int E, int shared_rows, int bm, int32_t *off, int32_t *row_token,
                  int32_t *slot_row, int32_t *tiles);

#ifdef __cplusplus
extern "C" {
#endif
/* Device workspace bytes of moe_group_cuda for at most TK picks of E experts. */
size_t moe_group_cuda_workspace(int TK, int E);
/* CUDA: the same on device arrays (ntiles a device int); three kernels, no host synchronisation. E <= 1023.
 * work: moe_group_cuda_workspace(T*K, E) bytes of device memory. stream is a cudaStream_t. */
void moe_group_cuda(const int32_t *sel, int T, int K, int E, int shared_rows, int bm, int32_t *off,
                    int32_t *row_token, int32_t *slot_row, int32_t *tiles, int32_t *ntiles, void *work, void *stream);
#ifdef __cplusplus
}
#endif

#endif
