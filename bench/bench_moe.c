/* bench_moe: one MoE layer of the Qwen3.5-35B-A3B shape (bench/qwen35_a3b.h: hidden 2048, 256 experts of width 512,
 * 8 routed + 1 gated shared expert of width 512) over the benchmark batch's 19218 tokens, kernel by kernel, random
 * bf16 weights and inputs made on the GPU: the router GEMM (cuBLASLt, fp32 logits), top-8, the grouping by expert,
 * the grouped gate|up and down GEMMs (both tile widths of moe_gemm) and the combine. Prints ms per layer and the
 * GEMMs' TFLOP/s (useful FLOPs of the routed and shared rows). usage: bench_moe [--tokens T] [--iters N] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "matmul.h"
#include "moe_combine.h"
#include "moe_gemm.h"
#include "moe_group.h"
#include "moe_router.h"
#include "qwen35_a3b.h"
#include "rand_fill.h"
#include "util.h"

static void *dalloc(size_t bytes)
{
    void *p = NULL;
    CHECK_CUDA(cudaMalloc(&p, bytes));
    return p;
}

int main(int argc, char **argv)
{
    int T = 19218, iters = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--tokens T] [--iters N]\n", argv[0]);
            return 2;
        }
    }
    if (T < 1 || iters < 1) {
        fprintf(stderr, "bench_moe: --tokens and --iters must be >= 1\n");
        return 2;
    }
    hf_config c;
    qwen35_a3b_config(&c, 40, 0);
    const int H = c.hidden_size, E = c.num_experts, K = c.num_experts_per_tok, Im = c.moe_intermediate_size;
    const int Is = c.shared_expert_intermediate_size, TK = T * K, R = TK + T, ldl = (E + 1 + 15) / 16 * 16;
    const int lda = Im > Is ? Im : Is, mt = moe_group_max_tiles(TK, E, T, MOE_GEMM_BM);
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreate(&st));
    matmul_cuda *mm = matmul_cuda_create(0);
    uint16_t *u = dalloc((size_t)T * H * 2), *x = dalloc((size_t)T * H * 2), *out = dalloc((size_t)T * H * 2);
    uint16_t *router = dalloc((size_t)ldl * H * 2), *egu = dalloc((size_t)E * 2 * Im * H * 2);
    uint16_t *edown = dalloc((size_t)E * H * Im * 2), *sgu = dalloc((size_t)2 * Is * H * 2);
    uint16_t *sdown = dalloc((size_t)H * Is * 2), *act = dalloc((size_t)R * lda * 2), *ys = dalloc((size_t)R * H * 2);
    float *logits = dalloc(sizeof(float) * (size_t)T * ldl), *selw = dalloc(sizeof(float) * (size_t)TK);
    int32_t *sel = dalloc(sizeof(int32_t) * (size_t)TK), *off = dalloc(sizeof(int32_t) * (size_t)(E + 2));
    int32_t *rt = dalloc(sizeof(int32_t) * (size_t)R), *sr = dalloc(sizeof(int32_t) * (size_t)TK);
    int32_t *tiles = dalloc(sizeof(int32_t) * 3 * (size_t)mt), *nt = dalloc(sizeof(int32_t));
    void *work = dalloc(moe_group_cuda_workspace(TK, E));
    rand_fill_bf16_cuda(u, (size_t)T * H, 1, 1.0f, 0.0f, st);
    rand_fill_bf16_cuda(x, (size_t)T * H, 2, 1.0f, 0.0f, st);
    CHECK_CUDA(cudaMemset(router, 0, (size_t)ldl * H * 2));
    rand_fill_bf16_cuda(router, (size_t)(E + 1) * H, 3, 0.02f, 0.0f, st);
    rand_fill_bf16_cuda(egu, (size_t)E * 2 * Im * H, 4, 0.02f, 0.0f, st);
    rand_fill_bf16_cuda(edown, (size_t)E * H * Im, 5, 0.02f, 0.0f, st);
    rand_fill_bf16_cuda(sgu, (size_t)2 * Is * H, 6, 0.02f, 0.0f, st);
    rand_fill_bf16_cuda(sdown, (size_t)H * Is, 7, 0.02f, 0.0f, st);
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
#define TIMED(ms, stmt)                                                                                                \
    do {                                                                                                               \
        stmt;                                                                                                          \
        CHECK_CUDA(cudaEventRecord(e0, st));                                                                           \
        for (int it_ = 0; it_ < iters; it_++) stmt;                                                                    \
        CHECK_CUDA(cudaEventRecord(e1, st));                                                                           \
        CHECK_CUDA(cudaEventSynchronize(e1));                                                                          \
        float f_ = 0;                                                                                                  \
        CHECK_CUDA(cudaEventElapsedTime(&f_, e0, e1));                                                                 \
        ms = f_ / iters;                                                                                               \
    } while (0)
    float t_router, t_router16, t_topk, t_group, t_gu[2], t_down[2], t_comb;
    TIMED(t_router, matmul_forward_f32_cuda(mm, logits, ldl, 0.0f, u, H, router, T, E + 1, H, st));
    /* the module's: the router rows padded with zero rows to a multiple of 16 columns */
    TIMED(t_router16, matmul_forward_f32_cuda(mm, logits, ldl, 0.0f, u, H, router, T, ldl, H, st));
    TIMED(t_topk, moe_router_topk_cuda(sel, selw, logits, ldl, T, E, K, 1, st));
    TIMED(t_group, moe_group_cuda(sel, T, K, E, T, MOE_GEMM_BM, off, rt, sr, tiles, nt, work, st));
    const int bns[2] = {128, 256};
    for (int v = 0; v < 2; v++) {
        moe_gemm_cuda_set_bn(bns[v]);
        TIMED(t_gu[v], moe_gemm_gate_up_cuda(act, lda, u, H, rt, tiles, nt, mt, E, H, Im, Is, egu, sgu, st));
        TIMED(t_down[v], moe_gemm_down_cuda(ys, H, act, lda, tiles, nt, mt, E, H, Im, Is, edown, sdown, st));
    }
    moe_gemm_cuda_set_bn(128);
    TIMED(t_comb, moe_combine_cuda(out, H, x, H, ys, H, sr, selw, T, K, H, ys + (size_t)TK * H, H, logits + E, ldl, st));
    int32_t h_nt = 0, *h_off = xmalloc(sizeof(int32_t) * (size_t)(E + 2));
    CHECK_CUDA(cudaMemcpy(&h_nt, nt, sizeof h_nt, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(h_off, off, sizeof(int32_t) * (size_t)(E + 2), cudaMemcpyDeviceToHost));
    int mx = 0, mn = TK;
    for (int e = 0; e < E; e++) {
        const int n = h_off[e + 1] - h_off[e];
        mx = n > mx ? n : mx, mn = n < mn ? n : mn;
    }
    const double f_gu = 2.0 * R * 2.0 * lda * H, f_down = 2.0 * R * (double)H * lda;
    printf("bench_moe: one Qwen3.5-35B-A3B MoE layer (H %d, %d experts of %d, top %d + shared %d), %d tokens = %d "
           "routed + %d shared rows; %d tiles of %d rows; rows per expert %d..%d\n",
           H, E, Im, K, Is, T, TK, T, h_nt, MOE_GEMM_BM, mn, mx);
    printf("router GEMM %.3f ms (%d columns; %.3f ms for %d), top-k %.3f ms, grouping %.3f ms, combine %.3f ms\n", t_router16, ldl, t_router, E + 1, t_topk, t_group, t_comb);
    for (int v = 0; v < 2; v++)
        printf("tile %dx%d: gate|up+SwiGLU %.3f ms (%.0f TFLOP/s), down %.3f ms (%.0f TFLOP/s)\n", MOE_GEMM_BM, bns[v],
               t_gu[v], f_gu / t_gu[v] / 1e9, t_down[v], f_down / t_down[v] / 1e9);
    int b = 0;
    for (int v = 1; v < 2; v++) b = t_gu[v] + t_down[v] < t_gu[b] + t_down[b] ? v : b;
    const double layer = t_router16 + t_topk + t_group + t_gu[b] + t_down[b] + t_comb;
    printf("MoE block per layer %.3f ms (tile 128x%d), x40 layers %.1f ms\n", layer, bns[b], 40 * layer);
    free(h_off);
    matmul_cuda_destroy(&mm);
    return 0;
}
