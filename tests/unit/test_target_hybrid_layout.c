/* The host-side index logic of the CUDA hybrid target: fused-weight row maps (bijections onto the expected blocks,
 * hand-checked rows) and the CUDA MoE block's grouping rule (moe_group_cpu, against a brute-force regrouping). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe_group.h"
#include "target_hybrid_layout.h"
#include "tests/test.h"

/* map is a bijection of [0, n) */
static int is_perm(const int *map, int n)
{
    char *seen = calloc((size_t)n, 1);
    int ok = 1;
    for (int i = 0; i < n; i++) {
        if (map[i] < 0 || map[i] >= n || seen[map[i]]) ok = 0;
        else seen[map[i]] = 1;
    }
    free(seen);
    return ok;
}

TEST(q_gate_rows)
{
    const int nh = 3, hd = 4, n = 2 * nh * hd;
    int map[24];
    for (int r = 0; r < n; r++) map[r] = target_hybrid_q_gate_row(r, nh, hd);
    EXPECT(is_perm(map, n));
    EXPECT(map[0] == 0 && map[3] == 3);      /* head 0 q */
    EXPECT(map[4] == 12 && map[7] == 15);    /* head 0 gate -> gate block */
    EXPECT(map[8] == 4 && map[12] == 16);    /* head 1 q, head 1 gate */
    EXPECT(map[23] == 23);                   /* head 2 gate, last */
}

TEST(qkvz_ba_rows)
{
    const int hk = 2, hv = 4, dk = 3, dv = 2, rep = hv / hk, grp = 2 * dk + 2 * rep * dv;
    const int n = hk * grp, C = 2 * hk * dk + hv * dv;
    int map[64];
    for (int r = 0; r < n; r++) map[r] = target_hybrid_qkvz_row(r, hk, hv, dk, dv);
    EXPECT(is_perm(map, n));
    /* group 1 starts at row grp: q rows 3..5, k rows 9..11, v rows 12 + 4.., z rows C + 4.. */
    EXPECT(map[grp] == dk);
    EXPECT(map[grp + dk] == hk * dk + dk);
    EXPECT(map[grp + 2 * dk] == 2 * hk * dk + rep * dv);
    EXPECT(map[grp + 2 * dk + rep * dv] == C + rep * dv);
    EXPECT(map[n - 1] == C + hv * dv - 1);
    int mba[8];
    for (int r = 0; r < 2 * hv; r++) mba[r] = target_hybrid_ba_row(r, hk, hv);
    EXPECT(is_perm(mba, 2 * hv));
    EXPECT(mba[0] == 0 && mba[1] == 1 && mba[2] == 4 && mba[3] == 5 && mba[4] == 2 && mba[7] == 7);
}

/* T tokens, K distinct picks each among experts [0, E) except expert 5 */
static void random_picks(int32_t *sel, int T, int K, int E)
{
    uint64_t s = 12345;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            int e;
            do {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                e = (int)((s >> 33) % (uint64_t)(E - 1));
                if (e == 5) e = E - 1;
                int dup = 0;
                for (int i = 0; i < j; i++) dup |= sel[t * K + i] == e;
                if (!dup) break;
            } while (1);
            sel[t * K + j] = e;
        }
}

/* moe_group_cpu (the grouping rule of the CUDA MoE block, kernels/moe_group.c) against a brute force */
static void check_group(int shared, int bm)
{
    enum { T = 37, K = 3, E = 7 };
    int32_t sel[T * K], off[E + 2], row_token[T * K + T], slot_row[T * K], tiles[3 * 64];
    random_picks(sel, T, K, E);
    memset(row_token, 0xff, sizeof row_token);
    const int S = shared ? T : 0;
    int nt = moe_group_cpu(sel, T, K, E, S, bm, off, row_token, slot_row, tiles);
    REQUIRE(nt <= moe_group_max_tiles(T * K, E, S, bm) && nt <= 64);
    EXPECT(off[0] == 0 && off[5] == off[6] && off[E] == T * K && off[E + 1] == T * K + S); /* expert 5 empty */
    int r = 0;
    for (int e = 0; e < E; e++) { /* brute force: expert by expert, in token order */
        EXPECT(off[e] == r);
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (sel[t * K + j] == e) {
                    EXPECT(row_token[r] == t);
                    EXPECT(slot_row[t * K + j] == r);
                    r++;
                }
    }
    for (int t = 0; t < S; t++) EXPECT(row_token[T * K + t] == t);
    /* tiles: every group's rows in order, runs of at most bm, none empty */
    int g = 0, next = 0;
    for (int i = 0; i < nt; i++) {
        const int tg = tiles[3 * i], a = tiles[3 * i + 1], b = tiles[3 * i + 2];
        EXPECT(tg >= g && tg <= E && a == next && a >= off[tg] && b <= off[tg + 1] && b > a && b - a <= bm);
        EXPECT(b - a == bm || b == off[tg + 1]);
        g = tg, next = b;
    }
    EXPECT(next == T * K + S);
    sel[4] = E; /* an id outside [0, E) goes with expert 0 */
    nt = moe_group_cpu(sel, T, K, E, S, bm, off, row_token, slot_row, tiles);
    EXPECT(off[1] > 0 && row_token[slot_row[4]] == 1 && slot_row[4] < off[1]);
}

TEST(moe_group) { check_group(0, 128); check_group(0, 4); }

TEST(moe_group_shared) { check_group(1, 128); check_group(1, 5); }

TEST_MAIN
