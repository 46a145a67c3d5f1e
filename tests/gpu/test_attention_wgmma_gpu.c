/* The Hopper causal attention kernel (kernels/attention_sm90.cu: wgmma, TMA) against the CPU reference
 * (attention_causal_forward_cpu) on packed variable-length batches: GQA groups of 1, 3 and 4, odd lengths, one-token
 * sequences, sequences shorter than one tile and several tiles long, head_dim 128 and 64. For each case: the error
 * against the reference (the tolerances of the mma.sync kernel's test: P is rounded to bf16 before P·V and the output
 * once), a second run bitwise identical to the first, and so are the cp.async staging (instead of TMA) and
 * attention_causal_forward_cuda (which chooses this kernel on this device). Prints "ok <case> ..." / "FAIL <case> ...";
 * exit status 0 only when every case passed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#define GPU_TEST_SEED 0x6a09e667f3bcc909ull
#include "gpu_test.h"
#include "attention.h"
#include "util.h"

typedef struct {
    const char *what;
    int lens[8], nseq, nh, nkv, hd;
    double amp; /* amplitude of q, k, v: larger makes the softmax peakier */
} attn_case;

static const attn_case kCases[] = {
    {"one sequence shorter than a tile", {37}, 1, 4, 1, 128, 2.0},
    {"Qwen3-8B heads (group 4), odd lengths, one-token sequences", {1, 130, 257, 1, 383, 64, 129}, 7, 32, 8, 128, 2.0},
    {"group 3, lengths across tile edges", {300, 1, 517, 128, 255, 2}, 6, 12, 4, 128, 2.0},
    {"group 4, two long sequences", {1500, 777}, 2, 8, 2, 128, 1.0},
    {"MHA, exactly five tiles", {640}, 1, 8, 8, 128, 1.0},
    {"peaked softmax (amplitude 8)", {250, 391}, 2, 8, 2, 128, 8.0},
    {"head_dim 64, group 3", {1, 200, 333}, 3, 6, 2, 64, 4.0},
    {"head_dim 64, group 4", {129, 1000, 3}, 3, 16, 4, 64, 2.0},
};

/* max |got - ref| / max |ref| over the (T, nh*hd) output (got bf16 with row stride ldo); NaN -> inf; the norm of the
 * error relative to the reference's in *norm_rel (as test_kernels_gpu's attention check measures it) */
static double err_vs_max(const uint16_t *got, int ldo, const float *ref, int T, int cols, double *norm_rel)
{
    double mx = 0, e = 0, se = 0, sr = 0;
    for (size_t i = 0; i < (size_t)T * cols; i++) mx = fmax(mx, fabs(ref[i]));
    for (int t = 0; t < T; t++)
        for (int i = 0; i < cols; i++) {
            double g = bf16_to_f32(got[(size_t)t * ldo + i]), w = ref[(size_t)t * cols + i];
            if (isnan(g)) return INFINITY;
            e = fmax(e, fabs(g - w));
            se += (g - w) * (g - w), sr += w * w;
        }
    *norm_rel = sr > 0 ? sqrt(se / sr) : sqrt(se);
    return mx > 0 ? e / mx : e;
}

/* the (token, head, column) of the largest error, to say where a wrong result is */
static void worst_at(const uint16_t *got, int ldo, const float *ref, int T, int nh, int hd, int *wt, int *wh, int *wc)
{
    double e = -1;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < nh * hd; i++) {
            double g = bf16_to_f32(got[(size_t)t * ldo + i]), d = isnan(g) ? INFINITY : fabs(g - ref[(size_t)t * nh * hd + i]);
            if (d > e) e = d, *wt = t, *wh = i / hd, *wc = i % hd;
        }
}

static void check_case(const attn_case *c)
{
    const int nseq = c->nseq, nh = c->nh, nkv = c->nkv, hd = c->hd;
    int32_t cu[9];
    int maxlen = 0;
    cu[0] = 0;
    for (int s = 0; s < nseq; s++) cu[s + 1] = cu[s] + c->lens[s], maxlen = c->lens[s] > maxlen ? c->lens[s] : maxlen;
    /* q|k|v packed in one (T, (nh + 2 nkv) hd) buffer as in the forward; out with its own stride */
    const int T = cu[nseq], ld = (nh + 2 * nkv) * hd, qd = nh * hd, kd = nkv * hd, ldo = qd + 8;
    const size_t nx = (size_t)T * ld, no = (size_t)T * ldo;
    float *x_f = xmalloc(nx * 4);
    uint16_t *x = rnd_bf16(nx, c->amp, x_f);
    float *q = xmalloc((size_t)T * qd * 4), *k = xmalloc((size_t)T * kd * 4), *v = xmalloc((size_t)T * kd * 4);
    for (int t = 0; t < T; t++) {
        memcpy(q + (size_t)t * qd, x_f + (size_t)t * ld, (size_t)qd * 4);
        memcpy(k + (size_t)t * kd, x_f + (size_t)t * ld + qd, (size_t)kd * 4);
        memcpy(v + (size_t)t * kd, x_f + (size_t)t * ld + qd + kd, (size_t)kd * 4);
    }
    float *ref = xmalloc((size_t)T * qd * 4), scale = 1.0f / sqrtf((float)hd);
    attention_causal_forward_cpu(ref, q, k, v, cu, nseq, nh, nkv, hd, scale);

    uint16_t *d_x = dev_upload(x, nx * 2);
    int32_t *d_cu = dev_upload(cu, sizeof(int32_t) * (size_t)(nseq + 1));
    enum { kRuns = 4 };
    /* 0, 1: TMA staging twice; 2: cp.async staging; 3: the automatic choice */
    static const char *const kSame[kRuns] = {"", "a second run", "cp.async staging", "attention_causal_forward_cuda"};
    uint16_t *d_o[kRuns], *o[kRuns];
    for (int r = 0; r < kRuns; r++) d_o[r] = dev_poisoned(no);
    for (int r = 0; r < kRuns; r++) {
        if (r < kRuns - 1)
            attention_wgmma_forward_cuda(d_o[r], ldo, d_x, ld, d_x + qd, ld, d_x + qd + kd, ld, d_cu, nseq, maxlen, nh,
                                         nkv, hd, scale, r < 2, stream);
        else
            attention_causal_forward_cuda(d_o[r], ldo, d_x, ld, d_x + qd, ld, d_x + qd + kd, ld, d_cu, nseq, maxlen,
                                          nh, nkv, hd, scale, stream);
        o[r] = dev_get(d_o[r], no * 2);
    }
    char name[256];
    snprintf(name, sizeof name, "attention_wgmma %s: T=%d nseq=%d nh=%d nkv=%d hd=%d maxlen=%d", c->what, T, nseq, nh,
             nkv, hd, maxlen);
    double nr = 0, e = err_vs_max(o[0], ldo, ref, T, qd, &nr);
    int ok = e <= 1e-2 && nr <= 5e-3;
    printf("%s %s max_err/max_ref=%.3g (tol 1e-2) norm_rel=%.3g (tol 5e-3)", ok ? "ok" : "FAIL", name, e, nr);
    if (!ok) {
        int wt = 0, wh = 0, wc = 0;
        worst_at(o[0], ldo, ref, T, nh, hd, &wt, &wh, &wc);
        printf(" worst at token %d head %d column %d: got %g want %g", wt, wh, wc,
               bf16_to_f32(o[0][(size_t)wt * ldo + (size_t)wh * hd + wc]), ref[(size_t)wt * qd + (size_t)wh * hd + wc]);
    }
    printf("\n");
    if (!ok) failures++;
    for (int r = 1; r < kRuns; r++) {
        size_t diff = 0;
        for (size_t i = 0; i < no; i++) diff += o[r][i] != o[0][i];
        printf("%s %s: %s bitwise identical to the first run (%zu of %zu values differ)\n", diff ? "FAIL" : "ok", name,
               kSame[r], diff, no);
        if (diff) failures++;
    }
    fflush(stdout);
    for (int r = 0; r < kRuns; r++) {
        CHECK_CUDA(cudaFree(d_o[r]));
        free(o[r]);
    }
    CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_cu));
    free(x_f), free(x), free(q), free(k), free(v), free(ref);
}

int main(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: test_attention_wgmma_gpu\nThe wgmma causal attention kernel against the CPU reference on random "
               "packed batches (an sm_90 GPU).\n");
        return 0;
    }
    CHECK_CUDA(cudaStreamCreate(&stream));
    if (!attention_wgmma_supported(128) || !attention_wgmma_supported(64)) {
        printf("FAIL attention_wgmma: this device does not run the sm_90a kernel (attention_wgmma_supported is 0)\n");
        return 1;
    }
    for (size_t i = 0; i < sizeof kCases / sizeof kCases[0]; i++) check_case(&kCases[i]);
    CHECK_CUDA(cudaStreamDestroy(stream));
    return failures ? 1 : 0;
}
