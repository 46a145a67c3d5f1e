/* target_hybrid_layout: row maps of the fused hybrid weights. */
#include "target_hybrid_layout.h"

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
