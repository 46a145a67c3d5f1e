/* bench_gdn: the gated delta rule alone, today's kernel (gated_delta_rule_forward_cuda) and the tensor-core chunked
 * one (gated_delta_chunk, exact and bf16 modes) in one run, on the benchmark batch (16 sequences, 19218 tokens) and
 * the Qwen3.5-9B linear-attention shape (bench/qwen35_9b.h: 16 q/k heads x 32 v heads of 128), inputs laid out as
 * the hybrid target's forward hands them over (q, k, v side by side in the conv output rows, random values through
 * gated_delta_prep: l2-normalised q and k, real gates). Prints ms per call (one layer), the 24 Gated DeltaNet layers
 * of the 32-layer target, and how far each new output is from the old kernel's (max |diff| / max |old|).
 * usage: bench_gdn [--iters N] [--layers L] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "gated_delta_chunk.h"
#include "gated_delta_prep.h"
#include "gated_delta_rule.h"
#include "hf_config.h"
#include "qwen35_9b.h"
#include "rand_fill.h"
#include "util.h"

static const int kLengths[] = {773, 1876, 1186, 496, 1599, 909, 2012, 1322, 632, 1735, 1045, 355, 1458, 768, 1871, 1181};

typedef void (*gdn_fn)(uint16_t *, int, const uint16_t *, int, const uint16_t *, int, const uint16_t *, int,
                       const float *, int, const float *, int, const int32_t *, int, int, int, int, int, void *);

static void chunk_bf16(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k, int ldk,
                       const uint16_t *v, int ldv, const float *g, int ldg, const float *beta, int ldb,
                       const int32_t *cu, int nseq, int hk, int hv, int dk, int dv, void *stream)
{
    gated_delta_chunk_forward_mode_cuda(out, ldo, q, ldq, k, ldk, v, ldv, g, ldg, beta, ldb, cu, nseq, hk, hv, dk, dv,
                                        GATED_DELTA_CHUNK_BF16, stream);
}

int main(int argc, char **argv)
{
    int iters = 10, layers = 32;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--iters N] [--layers L]\n", argv[0]);
            return 2;
        }
    }
    if (iters < 1 || layers < 1) {
        fprintf(stderr, "bench_gdn: --iters and --layers must be >= 1\n");
        return 2;
    }
    hf_config cfg;
    qwen35_9b_config(&cfg, layers, 0);
    int nlin = 0;
    for (int i = 0; i < layers; i++) nlin += cfg.layer_linear[i];
    const int HK = cfg.linear_num_k_heads, HV = cfg.linear_num_v_heads, Dk = cfg.linear_k_head_dim;
    const int Dv = cfg.linear_v_head_dim, C = 2 * HK * Dk + HV * Dv, VD = HV * Dv;
    const int nseq = (int)(sizeof kLengths / sizeof kLengths[0]);
    int32_t cu[17];
    cu[0] = 0;
    for (int s = 0; s < nseq; s++) cu[s + 1] = cu[s] + kLengths[s];
    const int T = cu[nseq];

    CHECK_CUDA(cudaSetDevice(0));
    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreate(&st));
    uint16_t *conv = NULL, *ab = NULL, *out[3] = {NULL, NULL, NULL};
    float *g = NULL, *beta = NULL, *a_log = NULL, *dt_bias = NULL;
    int32_t *d_cu = NULL;
    CHECK_CUDA(cudaMalloc((void **)&conv, (size_t)T * C * 2));
    CHECK_CUDA(cudaMalloc((void **)&ab, (size_t)T * 2 * HV * 2));
    for (int i = 0; i < 3; i++) CHECK_CUDA(cudaMalloc((void **)&out[i], (size_t)T * VD * 2));
    CHECK_CUDA(cudaMalloc((void **)&g, sizeof(float) * (size_t)T * HV));
    CHECK_CUDA(cudaMalloc((void **)&beta, sizeof(float) * (size_t)T * HV));
    CHECK_CUDA(cudaMalloc((void **)&a_log, sizeof(float) * (size_t)HV));
    CHECK_CUDA(cudaMalloc((void **)&dt_bias, sizeof(float) * (size_t)HV));
    CHECK_CUDA(cudaMalloc((void **)&d_cu, sizeof cu));
    CHECK_CUDA(cudaMemcpy(d_cu, cu, sizeof cu, cudaMemcpyHostToDevice));
    float alog[64], dtb[64];
    uint64_t r = 0x2545f4914f6cdd1dull;
    for (int h = 0; h < HV; h++) { /* as the hybrid target's random init */
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        alog[h] = logf(1.0f + 15.0f * (float)((r >> 40) & 0xffffff) / 16777216.0f);
        dtb[h] = 1.0f;
    }
    CHECK_CUDA(cudaMemcpy(a_log, alog, sizeof(float) * (size_t)HV, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dt_bias, dtb, sizeof(float) * (size_t)HV, cudaMemcpyHostToDevice));
    rand_fill_bf16_cuda(conv, (size_t)T * C, 11, 1.0f, 0.0f, st);
    rand_fill_bf16_cuda(ab, (size_t)T * 2 * HV, 12, 2.0f, 0.0f, st);
    gated_delta_prep_cuda(conv, C, T, HK, Dk, beta, g, HV, ab, 2 * HV, ab + HV, 2 * HV, a_log, dt_bias, HV, st);
    const uint16_t *q = conv, *k = conv + HK * Dk, *v = conv + 2 * HK * Dk;

    const char *names[3] = {"gated_delta_rule (today's kernel)", "gated_delta_chunk exact", "gated_delta_chunk bf16"};
    gdn_fn fns[3] = {gated_delta_rule_forward_cuda, gated_delta_chunk_forward_cuda, chunk_bf16};
    double ms[3];
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    for (int f = 0; f < 3; f++) {
        fns[f](out[f], VD, q, C, k, C, v, C, g, HV, beta, HV, d_cu, nseq, HK, HV, Dk, Dv, st); /* warm-up */
        CHECK_CUDA(cudaStreamSynchronize(st));
        CHECK_CUDA(cudaEventRecord(e0, st));
        for (int it = 0; it < iters; it++)
            fns[f](out[f], VD, q, C, k, C, v, C, g, HV, beta, HV, d_cu, nseq, HK, HV, Dk, Dv, st);
        CHECK_CUDA(cudaEventRecord(e1, st));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float t = 0;
        CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
        ms[f] = t / iters;
    }
    const size_t n = (size_t)T * VD;
    uint16_t *h[3];
    for (int f = 0; f < 3; f++) {
        h[f] = xmalloc(n * 2);
        CHECK_CUDA(cudaMemcpy(h[f], out[f], n * 2, cudaMemcpyDeviceToHost));
    }
    double mx = 0, d[3] = {0, 0, 0};
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double o = bf16_to_f32(h[0][i]);
        mx = fmax(mx, fabs(o));
        for (int f = 1; f < 3; f++) {
            const double x = bf16_to_f32(h[f][i]);
            if (!isfinite(x)) bad++;
            d[f] = fmax(d[f], fabs(x - o));
        }
    }
    printf("device: %s, %d SMs; batch: %d sequences, %d tokens; Qwen3.5-9B linear attention: %d q/k heads x %d v "
           "heads, dk %d, dv %d; %d of %d layers Gated DeltaNet; %d iters\n",
           prop.name, prop.multiProcessorCount, nseq, T, HK, HV, Dk, Dv, nlin, layers, iters);
    for (int f = 0; f < 3; f++) {
        printf("%-36s %8.3f ms/layer  %8.1f ms/step (%d layers)  %6.1fx", names[f], ms[f], ms[f] * nlin, nlin,
               ms[0] / ms[f]);
        if (f) printf("  max|diff vs today's| / max|today's| = %.3g", d[f] / fmax(mx, 1e-30));
        printf("\n");
    }
    printf("non-finite outputs: %zu\n", bad);
    for (int f = 0; f < 3; f++) {
        free(h[f]);
        CHECK_CUDA(cudaFree(out[f]));
    }
    CHECK_CUDA(cudaFree(conv)); CHECK_CUDA(cudaFree(ab)); CHECK_CUDA(cudaFree(g)); CHECK_CUDA(cudaFree(beta));
    CHECK_CUDA(cudaFree(a_log)); CHECK_CUDA(cudaFree(dt_bias)); CHECK_CUDA(cudaFree(d_cu));
    CHECK_CUDA(cudaEventDestroy(e0)); CHECK_CUDA(cudaEventDestroy(e1));
    CHECK_CUDA(cudaStreamDestroy(st));
    return bad ? 1 : 0;
}
