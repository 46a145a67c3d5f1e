/* causal_conv1d: the causal depthwise conv1d + SiLU of Gated DeltaNet over packed variable-length sequences:
 *   y[t, ch] = silu(Σ_{j<K} w[ch, j] · x[t − (K−1) + j, ch])
 * where rows before the token's sequence start count as zero (the history restarts at every sequence start, as a
 * sequence run alone sees it). fp32 math; the CUDA version takes bf16 activations and weights. */
#ifndef DFLASH_KERNEL_CAUSAL_CONV1D_H
#define DFLASH_KERNEL_CAUSAL_CONV1D_H

#include <stdint.h>

/* y (T, C; ldy) from x (T, C; ldx) and w (C, K); cu_seqlens (nseq+1), cu_seqlens[nseq] = T. y must not overlap x. */
void causal_conv1d_silu_cpu(float *y, int ldy, const float *x, int ldx, const float *w, int C, int K,
                            const int32_t *cu_seqlens, int nseq);
/* One sequence of T new rows continuing from its history: state (K-1, C) holds the conv inputs of the K-1 rows before
 * x[0] (oldest first; zeros at a sequence start) and is left holding the last K-1 input rows (decoding). NULL state:
 * a sequence start, nothing kept. y must not overlap x or state. */
void causal_conv1d_silu_state_cpu(float *y, int ldy, const float *x, int ldx, const float *w, int C, int K, int T,
                                  float *state);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA, bf16 in/out, fp32 accumulation; cu_seqlens is a device array, T = cu_seqlens[nseq] given by the caller.
 * stream is a cudaStream_t. */
void causal_conv1d_silu_cuda(uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *w, int C, int K,
                             const int32_t *cu_seqlens, int nseq, int T, void *stream);
/* CUDA, decoding: the same over packed sequences that each continue from a carried history. hist is an array of
 * slots of (K-1, C) bf16 conv inputs (causal_conv1d_silu_state_cpu's layout); sequence s of the call reads slot
 * hist_in[s] (-1: a sequence start, zeros) and leaves the last K-1 input rows of [history; its rows] in slot
 * hist_out[s] (device arrays of nseq; a slot written is read by no sequence of the call). */
void causal_conv1d_silu_state_cuda(uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *w, int C, int K,
                                   const int32_t *cu_seqlens, int nseq, int T, uint16_t *hist,
                                   const int32_t *hist_in, const int32_t *hist_out, void *stream);
#ifdef __cplusplus
}
#endif

#endif
