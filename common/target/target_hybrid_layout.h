/* target_hybrid_layout: the host-side index logic of the CUDA hybrid target (target_hybrid_cuda.c), in plain C so
 * that unit tests check it without a GPU: where each checkpoint row lands in the fused projection weights. No
 * allocation, no state. */
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

#endif
