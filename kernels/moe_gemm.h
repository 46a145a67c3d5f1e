/* moe_gemm: the two grouped GEMMs of a sparse MoE block over rows grouped by expert (moe_group), every expert (and
 * the shared expert, as group E) in one launch each, the tile schedule read on the device:
 *   gate|up: act[r, j] = silu(x[tok(r)] · Wg[j]) · (x[tok(r)] · Wu[j])      j < I_g  (fp32 accumulation, bf16 act)
 *   down:    y[r, n]   = act[r, :I_g] · Wd[n]                             n < H
 * for every row r of group g, tok(r) = row_token[r]. Group g < E: Wg|Wu = w_gu + g·2·Im·H ((2 Im, H): Im gate rows
 * then Im up rows, transformers' gate_up_proj layout), Wd = w_down + g·H·Im ((H, Im)), I_g = Im; group E (the
 * shared expert, when w_s* are given): (2 Is, H) and (H, Is), I_g = Is. All weights bf16 and row-major (out, in).
 * H, Im, Is and the row strides are multiples of 8 (16-byte rows for cp.async). Deterministic: no atomics, one
 * fixed reduction order per output. */
#ifndef DFLASH_KERNEL_MOE_GEMM_H
#define DFLASH_KERNEL_MOE_GEMM_H

#include <stdint.h>

/* rows per tile of the CUDA kernels: moe_group's bm */
#define MOE_GEMM_BM 128

/* gpt-oss's experts (moe_gemm_*_opts): biases of the routed experts (fp32; the shared expert, group E, has none) and
 * its clamped SwiGLU in the gate|up epilogue (swiglu_clamped_forward_cpu: g = min(gate, limit), u = clamp(up, ±limit),
 * act = (u + 1) · g · sigmoid(alpha · g)). Zero-initialised: no bias, silu(gate) · up. */
typedef struct moe_gemm_opts {
    const float *bias;   /* gate|up: (E, 2 Im) in w_gu's row order (Im gate, Im up); down: (E, H); NULL: none */
    float alpha, limit;  /* limit > 0: the clamped SwiGLU (gate|up only) */
} moe_gemm_opts;

/* CPU references over the groups off (E + 2; group E is the shared expert, empty when off[E+1] == off[E]). */
void moe_gemm_gate_up_cpu(float *act, int ldact, const float *x, int ldx, const int32_t *row_token,
                          const int32_t *off, int E, int H, int Im, int Is, const float *w_gu, const float *ws_gu);
void moe_gemm_down_cpu(float *y, int ldy, const float *act, int ldact, const int32_t *off, int E, int H, int Im,
                       int Is, const float *w_down, const float *ws_down);
/* The same with o's options (o NULL: none). */
void moe_gemm_gate_up_opts_cpu(float *act, int ldact, const float *x, int ldx, const int32_t *row_token,
                               const int32_t *off, int E, int H, int Im, int Is, const float *w_gu, const float *ws_gu,
                               const moe_gemm_opts *o);
void moe_gemm_down_opts_cpu(float *y, int ldy, const float *act, int ldact, const int32_t *off, int E, int H, int Im,
                            int Is, const float *w_down, const float *ws_down, const moe_gemm_opts *o);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA over the tiles of moe_group_cuda (tiles, ntiles on the device; max_tiles the grid's bound,
 * moe_group_max_tiles with bm = MOE_GEMM_BM): bf16 in and out, fp32 accumulation on the tensor cores. ws_* may be
 * NULL when no tile has group E. stream is a cudaStream_t. */
void moe_gemm_gate_up_cuda(uint16_t *act, int ldact, const uint16_t *x, int ldx, const int32_t *row_token,
                           const int32_t *tiles, const int32_t *ntiles, int max_tiles, int E, int H, int Im, int Is,
                           const uint16_t *w_gu, const uint16_t *ws_gu, void *stream);
void moe_gemm_down_cuda(uint16_t *y, int ldy, const uint16_t *act, int ldact, const int32_t *tiles,
                        const int32_t *ntiles, int max_tiles, int E, int H, int Im, int Is, const uint16_t *w_down,
                        const uint16_t *ws_down, void *stream);
/* The same with o's options (o NULL: none; o->bias on the device). */
void moe_gemm_gate_up_opts_cuda(uint16_t *act, int ldact, const uint16_t *x, int ldx, const int32_t *row_token,
                                const int32_t *tiles, const int32_t *ntiles, int max_tiles, int E, int H, int Im,
                                int Is, const uint16_t *w_gu, const uint16_t *ws_gu, const moe_gemm_opts *o,
                                void *stream);
void moe_gemm_down_opts_cuda(uint16_t *y, int ldy, const uint16_t *act, int ldact, const int32_t *tiles,
                             const int32_t *ntiles, int max_tiles, int E, int H, int Im, int Is, const uint16_t *w_down,
                             const uint16_t *ws_down, const moe_gemm_opts *o, void *stream);
/* The output tile width of later launches: 128 (the default) or 256; for bench_moe's comparison and the tests. */
void moe_gemm_cuda_set_bn(int bn);
#ifdef __cplusplus
}
#endif

#endif
