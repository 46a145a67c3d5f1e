/* test_nonfinite: the CPU reference of the non-finite check (kernels/nonfinite.h): a NaN, +inf or -inf sets the flag
 * of its group only (in any row, strided rows too, the padding past G*C ignored), the first one is found in row-major
 * order, and finite data (the largest float too) leaves every flag as it was. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "nonfinite.h"
#include "tests/test.h"

TEST(flags_the_groups_holding_nan_or_inf_and_finds_the_first)
{
    enum { N = 4, G = 3, C = 5, LD = G * C + 2 };
    float x[N * LD];
    for (int i = 0; i < N * LD; i++) x[i] = (float)(i % 7) - 3.0f;
    x[0] = 3.4028235e38f; /* the largest float is finite */
    uint32_t flags[G] = {0, 0, 0};
    EXPECT(nonfinite_groups_cpu(flags, x, LD, N, G, C) == -1);
    EXPECT(flags[0] == 0 && flags[1] == 0 && flags[2] == 0);
    x[1 * LD + G * C] = NAN; /* padding: not part of the tensor */
    EXPECT(nonfinite_groups_cpu(flags, x, LD, N, G, C) == -1);
    x[3 * LD + 2 * C + 4] = INFINITY;
    x[2 * LD + 0 * C + 1] = NAN;
    x[3 * LD + 0 * C + 0] = -INFINITY;
    EXPECT(nonfinite_groups_cpu(flags, x, LD, N, G, C) == 2 * G * C + 1);
    EXPECT(flags[0] == 1 && flags[1] == 0 && flags[2] == 1);
    EXPECT(nonfinite_groups_cpu(NULL, x, LD, N, G, C) == 2 * G * C + 1);
    uint32_t one = 0; /* one row of G groups: per-row flags of a (G, C) block */
    EXPECT(nonfinite_groups_cpu(&one, x + 3 * LD, LD, 1, 1, G * C) == 0);
    EXPECT(one == 1);
}

TEST_MAIN
