/* test_logits_mask: the CPU reference of the --suppress mask (kernels/logits_mask.h): the listed ids of the first n
 * rows become -inf (an id listed twice too), nothing else changes, and the argmax then picks the best id left, as
 * target_logits_argmax does with the same ids suppressed (the CPU decoding's rule, which the GPU path must match). */
#include <math.h>
#include <stdint.h>

#include "argmax.h"
#include "logits_mask.h"
#include "target_decode.h"
#include "tests/test.h"

TEST(mask_sets_listed_ids_to_minus_inf_and_argmax_moves_to_the_best_left)
{
    enum { ROWS = 3, N = 2, V = 50, LD = 53 };
    float x[ROWS * LD], before[ROWS * LD];
    for (int i = 0; i < ROWS * LD; i++) x[i] = (float)((i * 37) % 101) / 10.0f;
    const int32_t ids[4] = {0, 49, 7, 7};
    for (int r = 0; r < ROWS; r++) x[r * LD + 7] = 100.0f, x[r * LD + 20 + r] = 50.0f;
    for (int i = 0; i < ROWS * LD; i++) before[i] = x[i];
    logits_mask_rows_cpu(x, LD, N, ids, 4);
    int changed = 0, wrong = 0;
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < LD; v++) {
            int masked = r < N && (v == 0 || v == 49 || v == 7);
            float got = x[r * LD + v];
            if (masked) wrong += !(isinf(got) && got < 0);
            else changed += got != before[r * LD + v];
        }
    EXPECT(wrong == 0);
    EXPECT(changed == 0);
    int32_t best[N];
    argmax_rows_cpu(best, x, LD, N, V);
    for (int r = 0; r < N; r++) {
        EXPECT(best[r] == 20 + r);
        EXPECT(best[r] == target_logits_argmax(before + r * LD, V, ids, 4));
    }
    int32_t unmasked;
    argmax_rows_cpu(&unmasked, x + N * LD, LD, 1, V); /* row N was not masked: the suppressed 7 still wins */
    EXPECT(unmasked == 7);
}

TEST_MAIN
