/* cross_entropy (CPU reference): logits by OpenBLAS sgemm into the caller's workspace, a max-subtracted
 * log-sum-exp per row accumulated in double, and (for the backward) the row gradient
 * (softmax - onehot) * weight * loss_scale written back over the logits, then dh = g · lm_head. */
#include "cross_entropy.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "progress.h"
#include "util.h"

#define CE_ROWS 32 /* rows of the logits per BLAS call */

void cross_entropy_chunk_cpu(float *ce, int32_t *argmax, float *dh, const float *h, int n, int H,
                             const float *lm_head, int V, const int32_t *labels, const float *weights,
                             float loss_scale, float *logits_ws)
{
    DF_ASSERT(n >= 0 && H > 0 && V > 0);
    if (n == 0) return;
    /* logits (n, V) = h (n, H) · lm_head (V, H)ᵀ, CE_ROWS rows a call: with a real vocabulary one call over the
     * chunk takes seconds, and each call is a sign of life for the worker's liveness thread (progress.h); rows are
     * independent, so the split changes no element's sum */
    for (int r = 0; r < n; r += CE_ROWS) {
        progress_bump();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n - r < CE_ROWS ? n - r : CE_ROWS, V, H, 1.0f,
                    h + (size_t)r * H, H, lm_head, H, 0.0f, logits_ws + (size_t)r * V, V);
    }

    for (int i = 0; i < n; i++) {
        progress_bump(); /* a row of a large vocabulary is long work: a sign of life each */
        float *row = logits_ws + (size_t)i * V;
        /* argmax over every row (lowest index on ties): the logits exist anyway, and metrics may want it */
        int am = 0;
        float mx = row[0];
        for (int k = 1; k < V; k++)
            if (row[k] > mx) { mx = row[k]; am = k; }
        if (argmax) argmax[i] = am;

        const float w = weights[i];
        if (w == 0.0f) {
            ce[i] = 0.0f;
            if (dh) memset(row, 0, sizeof(float) * (size_t)V);
            continue;
        }
        const int32_t lab = labels[i];
        DF_ASSERT(lab >= 0 && lab < V);
        double sum = 0.0;
        for (int k = 0; k < V; k++) sum += exp((double)row[k] - (double)mx);
        const double lse = (double)mx + log(sum);
        ce[i] = (float)(lse - (double)row[lab]);
        if (dh) {
            const double gs = (double)w * (double)loss_scale;
            const double plab = exp((double)row[lab] - lse);
            for (int k = 0; k < V; k++) row[k] = (float)(exp((double)row[k] - lse) * gs);
            row[lab] = (float)((plab - 1.0) * gs);
        }
    }
    for (int r = 0; dh && r < n; r += CE_ROWS) { /* dh (n, H) = g (n, V) · lm_head (V, H), in row blocks as above */
        progress_bump();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n - r < CE_ROWS ? n - r : CE_ROWS, H, V, 1.0f,
                    logits_ws + (size_t)r * V, V, lm_head, H, 0.0f, dh + (size_t)r * H, H);
    }
}
