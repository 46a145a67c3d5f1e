/* bench_attention: the target's causal attention kernel alone, each implementation on the same data: the Qwen3-8B
 * shape (32 query heads, 8 kv heads, head_dim 128, q|k|v packed in one (T, 6144) buffer as the forward has them) over
 * the benchmark batch of ../shared/bench/README.md (16 sequences, 19218 tokens), then one 8192-token sequence, then
 * head_dim 64. Prints ms per call and TFLOP/s counted as bench_target counts attention (causal useful FLOPs:
 * 4 x heads x head_dim x sum(len^2 / 2)).
 * usage: bench_attention [--iters N] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "attention.h"
#include "cuda_check.h"
#include "rand_fill.h"

static const int kLengths[] = {773, 1876, 1186, 496, 1599, 909, 2012, 1322, 632, 1735, 1045, 355, 1458, 768, 1871, 1181};

/* one batch: every kernel that runs this head_dim here, iters calls each after two warm-up calls */
static void bench(const char *label, const int *lens, int nseq, int nh, int nkv, int hd, int iters, cudaStream_t st)
{
    int32_t cu[32];
    int maxlen = 0;
    double sumsq = 0;
    cu[0] = 0;
    for (int s = 0; s < nseq; s++) {
        cu[s + 1] = cu[s] + lens[s];
        if (lens[s] > maxlen) maxlen = lens[s];
        sumsq += (double)lens[s] * lens[s] / 2;
    }
    const int T = cu[nseq], ld = (nh + 2 * nkv) * hd, qd = nh * hd, kd = nkv * hd;
    uint16_t *x = NULL, *o = NULL;
    int32_t *d_cu = NULL;
    CHECK_CUDA(cudaMalloc((void **)&x, (size_t)T * ld * 2));
    CHECK_CUDA(cudaMalloc((void **)&o, (size_t)T * qd * 2));
    CHECK_CUDA(cudaMalloc((void **)&d_cu, sizeof cu));
    CHECK_CUDA(cudaMemcpy(d_cu, cu, sizeof(int32_t) * (size_t)(nseq + 1), cudaMemcpyHostToDevice));
    rand_fill_bf16_cuda(x, (size_t)T * ld, 1234, 2.0f, 0.0f, st);
    const double flop = 4.0 * nh * hd * sumsq;
    printf("%s: %d sequences, %d tokens, nh %d nkv %d hd %d\n", label, nseq, T, nh, nkv, hd);
    static const struct { const char *name; enum attention_cuda_kernel k; int tma; } kKernels[] = {
        {"mma.sync (attention.cu)", ATTENTION_CUDA_MMA_SYNC, 0},
        {"wgmma + TMA (attention_sm90.cu)", ATTENTION_CUDA_WGMMA, 1},
        {"wgmma, cp.async staging", ATTENTION_CUDA_WGMMA, 0},
    };
    cudaEvent_t t0, t1;
    CHECK_CUDA(cudaEventCreate(&t0));
    CHECK_CUDA(cudaEventCreate(&t1));
    for (size_t i = 0; i < sizeof kKernels / sizeof kKernels[0]; i++) {
        if (kKernels[i].k == ATTENTION_CUDA_WGMMA && !attention_wgmma_supported(hd)) continue;
        for (int it = -2; it < iters; it++) {
            if (it == 0) CHECK_CUDA(cudaEventRecord(t0, st));
            if (kKernels[i].k == ATTENTION_CUDA_WGMMA)
                attention_wgmma_forward_cuda(o, qd, x, ld, x + qd, ld, x + qd + kd, ld, d_cu, nseq, maxlen, nh, nkv,
                                             hd, 0.08838834764831845f, kKernels[i].tma, st);
            else
                attention_causal_forward_cuda_with(kKernels[i].k, o, qd, x, ld, x + qd, ld, x + qd + kd, ld, d_cu,
                                                   nseq, maxlen, nh, nkv, hd, 0.08838834764831845f, st);
        }
        CHECK_CUDA(cudaEventRecord(t1, st));
        CHECK_CUDA(cudaEventSynchronize(t1));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
        ms /= iters;
        printf("  %-38s %8.3f ms  %6.0f TFLOP/s causal useful\n", kKernels[i].name, ms, flop / (ms / 1e3) / 1e12);
    }
    CHECK_CUDA(cudaEventDestroy(t0));
    CHECK_CUDA(cudaEventDestroy(t1));
    CHECK_CUDA(cudaFree(x));
    CHECK_CUDA(cudaFree(o));
    CHECK_CUDA(cudaFree(d_cu));
}

int main(int argc, char **argv)
{
    int iters = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else {
            printf("usage: bench_attention [--iters N]\nThe target's causal attention kernels alone on the Qwen3-8B "
                   "shape, in TFLOP/s (causal useful FLOPs).\n");
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (iters < 1) iters = 1;
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreate(&st));
    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs; %d calls per kernel\n", prop.name, prop.multiProcessorCount, iters);
    const int nseq = (int)(sizeof kLengths / sizeof kLengths[0]), one[] = {8192};
    bench("Qwen3-8B benchmark batch", kLengths, nseq, 32, 8, 128, iters, st);
    bench("one long sequence", one, 1, 32, 8, 128, iters, st);
    bench("head_dim 64, benchmark batch", kLengths, nseq, 32, 8, 64, iters, st);
    CHECK_CUDA(cudaStreamDestroy(st));
    return 0;
}
