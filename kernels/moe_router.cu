// moe_router: CUDA, one warp per token. The warp writes the token's E probabilities to its slice of shared memory
// (max and sum by shuffle reductions), then picks the K largest by K warp-wide argmax reductions (ties to the
// lower expert id), marking each pick taken (-1, below every probability).
#include <cstdint>

#include "cuda_check.h"
#include "moe_router.h"

#define MOE_ROUTER_WARPS 4

static __global__ void moe_router_topk_kernel(int32_t *sel, float *selw, const float *logits, int ldl, int T, int E,
                                              int K, int norm)
{
    extern __shared__ float sp[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = blockIdx.x * MOE_ROUTER_WARPS + warp;
    if (t >= T) return; // the whole warp leaves together: no block-wide barrier below
    float *p = sp + (size_t)warp * E;
    const float *l = logits + (size_t)t * ldl;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) {
        float v = expf(l[e] - mx);
        p[e] = v;
        sum += v;
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    for (int e = lane; e < E; e += 32) p[e] /= sum;
    __syncwarp();
    float ksum = 0.0f; // every lane sees the same picks, so every lane sums them in the same order
    for (int j = 0; j < K; j++) {
        float bv = -2.0f;
        int bi = E;
        for (int e = lane; e < E; e += 32)
            if (p[e] > bv) bv = p[e], bi = e; // ascending e: the lowest id of this lane's maxima
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        ksum += bv;
        if (lane == 0) {
            sel[(size_t)t * K + j] = bi;
            selw[(size_t)t * K + j] = bv;
            if (bi < E) p[bi] = -1.0f; // bi == E only for non-finite logits (the host then refuses the ids)
        }
        __syncwarp();
    }
    if (norm && lane == 0)
        for (int j = 0; j < K; j++) selw[(size_t)t * K + j] /= ksum;
}

extern "C" void moe_router_topk_cuda(int32_t *sel, float *selw, const float *logits, int ldl, int T, int E, int K,
                                     int norm, void *stream)
{
    if (T <= 0) return;
    if (E <= 0 || E > 1024 || K <= 0 || K > E) {
        fprintf(stderr, "moe_router_topk_cuda: %d experts, top %d unsupported\n", E, K);
        exit(1);
    }
    const unsigned blocks = (unsigned)((T + MOE_ROUTER_WARPS - 1) / MOE_ROUTER_WARPS);
    moe_router_topk_kernel<<<blocks, MOE_ROUTER_WARPS * 32, sizeof(float) * (size_t)MOE_ROUTER_WARPS * E,
                             (cudaStream_t)stream>>>(sel, selw, logits, ldl, T, E, K, norm);
    CHECK_CUDA_LAUNCH();
}
