/* target_hybrid_layout: row maps of the fused hybrid weights and the MoE counting sort. */
#include "target_hybrid_layout.h"

#include <stdlib.h>

#include "util.h"

int target_hybrid_q_gate_row(int r, int nh, int hd)
{
    const int head = r / (2 * hd), w = r % (2 * hd);
    return w < hd ? head * hd + w : nh * hd + head * hd + (w - hd);
}

int target_hybrid_qkvz_row(int r, int hk, int hv, int dk, int dv)
{
    const int rep = hv / hk, grp = 2 * dk + 2 * rep * dv, g = r / grp, w = r % grp;
    const int C = 2 * hk * dk + hv * dv; /* q | k | v */
    if (w < dk) return g * dk + w;
    if (w < 2 * dk) return hk * dk + g * dk + (w - dk);
    if (w < 2 * dk + rep * dv) return 2 * hk * dk + g * rep * dv + (w - 2 * dk);
    return C + g * rep * dv + (w - 2 * dk - rep * dv);
}

int target_hybrid_ba_row(int r, int hk, int hv)
{
    const int rep = hv / hk, g = r / (2 * rep), w = r % (2 * rep);
    return w < rep ? g * rep + w : hv + g * rep + (w - rep);
}

int target_hybrid_moe_group(const int32_t *sel, int T, int K, int E, int pad, int32_t *offsets, int32_t *row_token,
                            int32_t *slot_row)
{
    const int n = T * K;
    if (E <= 0 || pad <= 0) return -1;
    for (int e = 0; e <= E; e++) offsets[e] = 0;
    for (int i = 0; i < n; i++) {
        if (sel[i] < 0 || sel[i] >= E) return -1;
        offsets[sel[i] + 1]++;
    }
    for (int e = 0; e < E; e++) offsets[e + 1] = offsets[e] + (offsets[e + 1] + pad - 1) / pad * pad;
    for (int r = 0; r < offsets[E]; r++) row_token[r] = 0;
    int32_t *cursor = xmalloc(sizeof(int32_t) * (size_t)E);
    for (int e = 0; e < E; e++) cursor[e] = offsets[e];
    for (int i = 0; i < n; i++) { /* in pick order: stable within each expert */
        const int r = cursor[sel[i]]++;
        row_token[r] = i / K;
        slot_row[i] = r;
    }
    free(cursor);
    return offsets[E];
}
