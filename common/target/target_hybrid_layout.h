/* target_hybrid_layout: the host-side index logic of the CUDA hybrid target (target_hybrid_cuda.c), in plain C so
 * that unit tests check it without a GPU: where each checkpoint row lands in the fused projection weights, and the
 * grouping of MoE (token, pick) rows by expert. No allocation, no state. */
#ifndef DFLASH_TARGET_HYBRID_LAYOUT_H
#define DFLASH_TARGET_HYBRID_LAYOUT_H

#include <stdint.h>

/* Gated attention: q_proj's row r (nh heads of [q (hd) | gate (hd)]) goes to row dst of the fused (2*nh*hd + ...)
 * weight whose output row is [q of every head (nh*hd) | gate of every head (nh*hd) | ...]. */
int target_hybrid_q_gate_row(int r, int nh, int hd);
/* Gated DeltaNet, Qwen3-Next's fused in_proj_qkvz: per q/k head group g of rep = hv/hk value heads, rows
 * [q (dk) | k (dk) | v (rep*dv) | z (rep*dv)]. Row r's destination in the fused weight whose output row is
 * [q (hk*dk) | k (hk*dk) | v (hv*dv) | z (hv*dv) | ...] (Qwen3.5's in_proj_qkv then in_proj_z). */
int target_hybrid_qkvz_row(int r, int hk, int hv, int dk, int dv);
/* Qwen3-Next's in_proj_ba: per group g, rows [b (rep) | a (rep)]; destination among [b (hv) | a (hv)]. */
int target_hybrid_ba_row(int r, int hk, int hv);

/* The CUDA forward pads each expert's rows to a multiple of this. */
#define TARGET_HYBRID_MOE_PAD 64

/* Group the T*K picks sel (T, K) of E experts by expert (stable: by token, then pick, within an expert), each
 * expert's block of rows padded to a multiple of pad (>= 1) so that the per-expert GEMMs see few distinct shapes
 * and aligned row offsets: offsets (E+1): expert e's rows are [offsets[e], offsets[e+1]), its picks first, then
 * padding rows; row_token (at most T*K + E*(pad-1) rows): the token of each row (0 for padding rows, which are
 * computed and never read); slot_row (T*K): the row of pick (t, j) at t*K + j. Returns the number of rows
 * (offsets[E]), or -1 when an id is outside [0, E). */
int target_hybrid_moe_group(const int32_t *sel, int T, int K, int E, int pad, int32_t *offsets, int32_t *row_token,
                            int32_t *slot_row);

#endif
