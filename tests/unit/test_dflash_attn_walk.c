/* dflash_attn_tile_union_next, the walk of the CUDA dq CTAs that sum two blocks' dQ: exhaustively over small ranges
 * (empty ones and ones whose start is past their end included), the walk from -1 is the ascending union of the two
 * ranges, each tile once, none outside them, and so each range's tiles in its own ascending order. */
#include "dflash_attention.h"
#include "tests/test.h"

TEST(tile_union_walks_the_union_ascending_once_each)
{
    enum { kMax = 9 };
    long walks = 0, bad = 0;
    for (int s0 = 0; s0 < kMax; s0++)
        for (int e0 = 0; e0 < kMax; e0++)
            for (int s1 = 0; s1 < kMax; s1++)
                for (int e1 = 0; e1 < kMax; e1++) {
                    int want[kMax], n = 0;
                    for (int t = 0; t < kMax; t++)
                        if ((s0 <= t && t < e0) || (s1 <= t && t < e1)) want[n++] = t;
                    int got = 0, t = -1, ok = 1;
                    while ((t = dflash_attn_tile_union_next(t, s0, e0, s1, e1)) != INT_MAX) {
                        if (got >= n || want[got] != t) {
                            ok = 0;
                            break;
                        }
                        got++;
                    }
                    ok = ok && got == n;
                    if (!ok && bad++ < 5)
                        fprintf(stderr, "ranges [%d,%d) [%d,%d): the walk differs from the union at step %d\n", s0, e0,
                                s1, e1, got);
                    walks++;
                }
    EXPECT(bad == 0);
    EXPECT(walks == (long)kMax * kMax * kMax * kMax);
}

TEST(tile_union_of_one_range_is_that_range)
{
    /* the second range empty (a pair's missing block past the last): the first block's walk alone */
    int t = -1, n = 0;
    while ((t = dflash_attn_tile_union_next(t, 3, 7, 0, 0)) != INT_MAX) EXPECT(t == 3 + n++);
    EXPECT(n == 4);
    EXPECT(dflash_attn_tile_union_next(-1, 5, 5, 2, 2) == INT_MAX);
}

TEST_MAIN
