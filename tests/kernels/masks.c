/* The decoding guards: logits_mask (the --suppress mask: the listed ids of the first n rows become -inf, an id
 * listed twice too, nothing else changes; the argmax then picks the best id left, as target_logits_argmax does) and
 * nonfinite (a NaN, +inf or -inf sets the flag of its group only, in any row, strided rows too, the padding past
 * G*C ignored; the first one is found in row-major order; finite data, the largest value too, sets no flag).
 * CPU against the rule written here; CUDA against the CPU on the same bf16 values. aux: the suppressed ids. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "argmax.h"
#include "logits_mask.h"
#include "nonfinite.h"
#include "target_decode.h"
#include "tests/kernel_cases.h"
#include "tests/test.h"
#include "util.h"

/* the id each row's runner-up sits on (kept: not among the suppressed ids) */
static int runner_up(int V, int r) { return (V > 2000 ? 1000 : 20) + r; }

/* rows n V ld, aux = ids */
static void logits_mask_cpu_check(const kc_case *c)
{
    const int ROWS = c->p[0], N = c->p[1], V = c->p[2], LD = c->p[3], nids = c->naux;
    const int32_t *ids = c->aux;
    float *x = xmalloc(sizeof(float) * (size_t)ROWS * LD), *before = xmalloc(sizeof(float) * (size_t)ROWS * LD);
    for (int i = 0; i < ROWS * LD; i++) x[i] = (float)((i * 37) % 101) / 10.0f;
    for (int r = 0; r < ROWS; r++) {
        for (int j = 0; j < nids; j++) REQUIRE(ids[j] != runner_up(V, r));
        x[(size_t)r * LD + ids[r % nids]] = 100.0f, x[(size_t)r * LD + runner_up(V, r)] = 50.0f;
    }
    memcpy(before, x, sizeof(float) * (size_t)ROWS * LD);
    logits_mask_rows_cpu(x, LD, N, ids, nids);
    int changed = 0, wrong = 0;
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < LD; v++) {
            int masked = 0;
            for (int j = 0; j < nids; j++) masked |= r < N && v == ids[j];
            float got = x[(size_t)r * LD + v];
            if (masked) wrong += !(isinf(got) && got < 0);
            else changed += got != before[(size_t)r * LD + v];
        }
    EXPECT(wrong == 0);
    EXPECT(changed == 0);
    int32_t *best = xmalloc(sizeof(int32_t) * (size_t)N);
    argmax_rows_cpu(best, x, LD, N, V);
    for (int r = 0; r < N; r++) {
        EXPECT(best[r] == runner_up(V, r));
        EXPECT(best[r] == target_logits_argmax(before + (size_t)r * LD, V, ids, nids));
    }
    if (ROWS > N) {
        int32_t unmasked;
        argmax_rows_cpu(&unmasked, x + (size_t)N * LD, LD, 1, V); /* row N was not masked: the suppressed max wins */
        EXPECT(unmasked == ids[N % nids]);
    }
    free(x), free(before), free(best);
}

/* n G C pad */
static void nonfinite_cpu_check(const kc_case *c)
{
    const int N = c->p[0], G = c->p[1], C = c->p[2], LD = G * C + c->p[3];
    float *x = xmalloc(sizeof(float) * (size_t)N * LD);
    for (int i = 0; i < N * LD; i++) x[i] = (float)(i % 7) - 3.0f;
    x[0] = 3.4028235e38f; /* the largest float is finite */
    uint32_t *flags = xcalloc((size_t)G, sizeof *flags);
    EXPECT(nonfinite_groups_cpu(flags, x, LD, N, G, C) == -1);
    for (int g = 0; g < G; g++) EXPECT(flags[g] == 0);
    if (LD > G * C) {
        x[(size_t)(1 % N) * LD + G * C] = NAN; /* padding: not part of the tensor */
        EXPECT(nonfinite_groups_cpu(flags, x, LD, N, G, C) == -1);
    }
    /* NaN, +inf, -inf in every third group, in rows spread over the tensor (and a second one in group 0) */
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    long first = -1;
    for (int g = 0; g < G; g += 3) {
        int r = (g * 7) % N, k = (g * 131) % C;
        x[(size_t)r * LD + (size_t)g * C + k] = bad[g % 3];
        long at = (long)r * G * C + (long)g * C + k;
        if (first < 0 || at < first) first = at;
    }
    x[(size_t)(N - 1) * LD + (C - 1)] = -INFINITY;
    if (first < 0 || (long)(N - 1) * G * C + C - 1 < first) first = (long)(N - 1) * G * C + C - 1;
    EXPECT(nonfinite_groups_cpu(flags, x, LD, N, G, C) == first);
    for (int g = 0; g < G; g++) EXPECT(flags[g] == (g % 3 == 0));
    EXPECT(nonfinite_groups_cpu(NULL, x, LD, N, G, C) == first);
    const long r0 = first / ((long)G * C);
    uint32_t one = 0; /* one row of G groups: per-row flags of a (G, C) block */
    EXPECT(nonfinite_groups_cpu(&one, x + (size_t)r0 * LD, LD, 1, 1, G * C) == first - r0 * G * C);
    EXPECT(one == 1);
    free(x), free(flags);
}

#ifdef DFLASH_CUDA
/* logits_mask on the GPU against its CPU reference, then argmax_rows over the masked rows against the CPU's (what
 * `dflash generate --backend cuda --suppress` runs): rows whose maximum is a suppressed id (so the argmax must move
 * to the best id left), a suppressed id listed twice, ids at both ends of the vocabulary, rows not masked (n
 * smaller than the buffer). The masked values must be exactly -inf and every other value unchanged. */
static void logits_mask_cuda_check(const kc_case *c)
{
    const int rows = c->p[0], n = c->p[1], V = c->p[2], ld = c->p[3], nids = c->naux;
    const int32_t *ids = c->aux;
    float *f = xmalloc(sizeof *f * (size_t)rows * ld);
    uint16_t *h = rnd_bf16((size_t)rows * ld, 4.0, f);
    for (int r = 0; r < rows; r++) { /* the maximum on a suppressed id, the runner-up on a kept one */
        size_t o = (size_t)r * ld;
        h[o + (size_t)ids[r % nids]] = f32_to_bf16(9.0f), f[o + (size_t)ids[r % nids]] = 9.0f;
        h[o + (size_t)runner_up(V, r)] = f32_to_bf16(8.0f), f[o + (size_t)runner_up(V, r)] = 8.0f;
    }
    uint16_t *d = dev_upload(h, sizeof *h * (size_t)rows * ld);
    int32_t *d_ids = dev_upload(ids, sizeof(int32_t) * (size_t)nids), *d_out = dev_upload(NULL, sizeof(int32_t) * (size_t)rows);
    logits_mask_rows_cpu(f, ld, n, ids, nids);
    logits_mask_rows_cuda(d, ld, n, d_ids, nids, NULL);
    uint16_t *got = dev_get(d, sizeof *got * (size_t)rows * ld);
    size_t wrong = 0;
    for (size_t i = 0; i < (size_t)rows * ld; i++) {
        float g = bf16_to_f32(got[i]);
        wrong += isinf(f[i]) ? !(isinf(g) && g < 0) : got[i] != h[i];
    }
    printf("%s logits_mask %d of %d rows, %d ids, V=%d ld=%d: %zu values differ from the CPU's\n",
           wrong ? "FAIL" : "ok", n, rows, nids, V, ld, wrong);
    if (wrong) failures++;
    int32_t *ref = xmalloc(sizeof(int32_t) * (size_t)n);
    argmax_rows_cpu(ref, f, ld, n, V);
    argmax_rows_cuda(d_out, d, ld, n, V, NULL);
    int32_t *out = dev_get(d_out, sizeof(int32_t) * (size_t)n);
    int ok = !memcmp(out, ref, sizeof(int32_t) * (size_t)n);
    for (int r = 0; r < n; r++) ok = ok && ref[r] == runner_up(V, r);
    printf("%s argmax after the mask (the best id left): gpu %d .. cpu %d .. (want the runner-up of each row)\n",
           ok ? "ok" : "FAIL", out[0], ref[0]);
    if (!ok) failures++;
    CHECK_CUDA(cudaFree(d));
    CHECK_CUDA(cudaFree(d_ids));
    CHECK_CUDA(cudaFree(d_out));
    free(f), free(h), free(got), free(ref), free(out);
}

/* nonfinite on the GPU against its CPU reference: finite data first (no flag may be set, the largest bf16 too) and
 * then NaN, +inf and -inf planted in some groups of some rows (strided rows, the padding past G*C poisoned and
 * ignored, groups larger than a CTA's share). */
static void nonfinite_cuda_check(const kc_case *c)
{
    const int n = c->p[0], G = c->p[1], C = c->p[2], pad = c->p[3];
    const int ld = G * C + pad;
    const size_t total = (size_t)n * ld;
    float *f = xmalloc(sizeof *f * total);
    uint16_t *h = rnd_bf16(total, 4.0, f);
    for (int r = 0; r < n; r++)
        for (int k = G * C; k < ld; k++) h[(size_t)r * ld + k] = 0x7fc0, f[(size_t)r * ld + k] = NAN;
    h[0] = 0x7f7f, f[0] = bf16_to_f32(0x7f7f); /* the largest finite bf16 */
    uint32_t *d_flags = dev_upload(NULL, sizeof(uint32_t) * (size_t)G);
    uint32_t *want = xcalloc((size_t)G, sizeof *want), *got = NULL;
    int ok = 1;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) { /* plant: NaN, +inf, -inf in every third group, in rows spread over the tensor */
            const uint16_t bad[3] = {0x7fc0, 0x7f80, 0xff80};
            for (int g = 0; g < G; g += 3) {
                int r = (g * 7) % n, k = (g * 131) % C;
                h[(size_t)r * ld + (size_t)g * C + k] = bad[g % 3];
                f[(size_t)r * ld + (size_t)g * C + k] = bf16_to_f32(bad[g % 3]);
            }
        }
        uint16_t *d = dev_upload(h, sizeof *h * total);
        CHECK_CUDA(cudaMemset(d_flags, 0, sizeof(uint32_t) * (size_t)G));
        memset(want, 0, sizeof *want * (size_t)G);
        nonfinite_groups_cpu(want, f, ld, n, G, C);
        nonfinite_groups_cuda(d_flags, d, ld, n, G, C, stream);
        got = dev_get(d_flags, sizeof(uint32_t) * (size_t)G);
        int any = 0;
        for (int g = 0; g < G; g++) any |= want[g];
        ok = ok && !memcmp(got, want, sizeof *want * (size_t)G) && any == pass;
        free(got);
        CHECK_CUDA(cudaFree(d));
    }
    printf("%s nonfinite (n=%d G=%d C=%d ld=%d): flags equal the CPU's, clean then planted\n", ok ? "ok" : "FAIL", n,
           G, C, ld);
    fflush(stdout);
    if (!ok) failures++;
    CHECK_CUDA(cudaFree(d_flags));
    free(f), free(h), free(want);
}
#endif

const kc_op kc_logits_mask = {"logits_mask", "bf16 (argmax i32)", "rows n V ld", logits_mask_cpu_check,
                              KC_CUDA(logits_mask_cuda_check)};
const kc_op kc_nonfinite = {"nonfinite_groups", "bf16 (flags u32)", "n G C pad", nonfinite_cpu_check,
                            KC_CUDA(nonfinite_cuda_check)};
