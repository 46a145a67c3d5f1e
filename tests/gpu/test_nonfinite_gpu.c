/* nonfinite on the GPU against its CPU reference (what dflash-target-cuda runs on the taps it writes into a slot,
 * and dflash generate --backend cuda on its logits): one table of shapes, each with finite data first (no flag may
 * be set, the largest bf16 too) and then NaN, +inf and -inf planted in some groups of some rows (strided rows, the
 * padding past G*C poisoned and ignored, groups larger than a CTA's share). Prints "ok <case>" / "FAIL <case>";
 * exit status 0 only when every case passed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "gpu_test.h"
#include "nonfinite.h"
#include "util.h"

typedef struct nf_case {
    const char *what;
    int n, G, C, pad;
} nf_case;

static const nf_case cases[] = {
    {"taps of a slot: 5 taps of hidden 4096", 300, 5, 4096, 0},
    {"taps, row stride past the taps", 33, 3, 1000, 24},
    {"logits of a decode step: 64 rows as one row of 64 groups", 1, 64, 151936, 0},
    {"tiny: one element", 1, 1, 1, 0},
    {"odd sizes", 7, 13, 37, 5},
};

static void check(const nf_case *c)
{
    const int ld = c->G * c->C + c->pad;
    const size_t total = (size_t)c->n * ld;
    float *f = xmalloc(sizeof *f * total);
    uint16_t *h = rnd_bf16(total, 4.0, f);
    for (int r = 0; r < c->n; r++)
        for (int k = c->G * c->C; k < ld; k++) h[(size_t)r * ld + k] = 0x7fc0, f[(size_t)r * ld + k] = NAN;
    h[0] = 0x7f7f, f[0] = bf16_to_f32(0x7f7f); /* the largest finite bf16 */
    uint32_t *d_flags = dev_upload(NULL, sizeof(uint32_t) * (size_t)c->G);
    uint32_t *want = xcalloc((size_t)c->G, sizeof *want), *got = NULL;
    int ok = 1;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) { /* plant: NaN, +inf, -inf in every third group, in rows spread over the tensor */
            const uint16_t bad[3] = {0x7fc0, 0x7f80, 0xff80};
            for (int g = 0; g < c->G; g += 3) {
                int r = (g * 7) % c->n, k = (g * 131) % c->C;
                h[(size_t)r * ld + (size_t)g * c->C + k] = bad[g % 3];
                f[(size_t)r * ld + (size_t)g * c->C + k] = bf16_to_f32(bad[g % 3]);
            }
        }
        uint16_t *d = dev_upload(h, sizeof *h * total);
        CHECK_CUDA(cudaMemset(d_flags, 0, sizeof(uint32_t) * (size_t)c->G));
        memset(want, 0, sizeof *want * (size_t)c->G);
        nonfinite_groups_cpu(want, f, ld, c->n, c->G, c->C);
        nonfinite_groups_cuda(d_flags, d, ld, c->n, c->G, c->C, stream);
        got = dev_get(d_flags, sizeof(uint32_t) * (size_t)c->G);
        int any = 0;
        for (int g = 0; g < c->G; g++) any |= want[g];
        ok = ok && !memcmp(got, want, sizeof *want * (size_t)c->G) && any == pass;
        free(got);
        CHECK_CUDA(cudaFree(d));
    }
    printf("%s nonfinite %s (n=%d G=%d C=%d ld=%d): flags equal the CPU's, clean then planted\n", ok ? "ok" : "FAIL",
           c->what, c->n, c->G, c->C, ld);
    fflush(stdout);
    if (!ok) failures++;
    CHECK_CUDA(cudaFree(d_flags));
    free(f), free(h), free(want);
}

int main(void)
{
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaStreamCreate(&stream));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check(&cases[i]);
    CHECK_CUDA(cudaStreamDestroy(stream));
    printf("%s test_nonfinite_gpu: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}
