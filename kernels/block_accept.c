/* block_accept: CPU reference (the loop drafter_forward_backward runs for its metrics). */
#include "block_accept.h"

#include <string.h>

#include "util.h"

void block_accept_cpu(int64_t *slot_correct, int64_t *run_sum, const int32_t *argmax, const int32_t *labels,
                      const float *weights, int nblocks, int B)
{
    DF_ASSERT(B >= 1 && B <= DFLASH_MAX_BLOCK && nblocks >= 0);
    memset(slot_correct, 0, sizeof *slot_correct * (size_t)B);
    int64_t runs = 0;
    for (int j = 0; j < nblocks; j++) {
        int run = 0, running = 1;
        for (int k = 1; k < B; k++) {
            size_t q = (size_t)j * B + k;
            int correct = weights[q] != 0.0f && argmax[q] == labels[q];
            slot_correct[k] += correct;
            if (running && correct) run++;
            else running = 0;
        }
        runs += run;
    }
    *run_sum = runs;
}
