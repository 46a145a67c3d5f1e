/* moe_group: CPU reference. */
#include "moe_group.h"

#include <stdlib.h>

#include "util.h"

int moe_group_max_tiles(int TK, int E, int shared_rows, int bm)
{
    /* Σ_g ceil(n_g / bm) <= Σ_g (n_g / bm + 1) over the E routed groups and the shared one */
    return (TK + bm - 1) / bm + E + (shared_rows > 0 ? (shared_rows + bm - 1) / bm + 1 : 0);
}

int moe_group_cpu(const int32_t *sel, int T, int K, int E, int shared_rows, int bm, int32_t *off, int32_t *row_token,
                  int32_t *slot_row, int32_t *tiles)
{
    DF_ASSERT(T >= 0 && K > 0 && E > 0 && bm > 0 && (shared_rows == 0 || shared_rows == T));
    const int TK = T * K;
    for (int g = 0; g <= E + 1; g++) off[g] = 0;
    for (int i = 0; i < TK; i++) {
        const int e = sel[i] >= 0 && sel[i] < E ? sel[i] : 0;
        off[e + 1]++;
    }
    for (int g = 0; g < E; g++) off[g + 1] += off[g];
    off[E + 1] = off[E] + shared_rows;
    int32_t *cursor = xmalloc(sizeof(int32_t) * (size_t)E);
    for (int e = 0; e < E; e++) cursor[e] = off[e];
    for (int i = 0; i < TK; i++) { /* in pick order: stable within each expert */
        const int e = sel[i] >= 0 && sel[i] < E ? sel[i] : 0, r = cursor[e]++;
        row_token[r] = i / K;
        slot_row[i] = r;
    }
    free(cursor);
    for (int t = 0; t < shared_rows; t++) row_token[TK + t] = t;
    int n = 0;
    for (int g = 0; g <= E; g++)
        for (int r = off[g]; r < off[g + 1]; r += bm) {
            tiles[3 * n] = g, tiles[3 * n + 1] = r, tiles[3 * n + 2] = r + bm < off[g + 1] ? r + bm : off[g + 1];
            n++;
        }
    return n;
}
