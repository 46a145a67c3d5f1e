// kv_attention: decoding attention against a bf16 KV cache (flash-decoding). Pass 1: a CTA per (key chunk of
// kChunk keys, kv head, query row) scores the chunk for the group's nh/nkv query heads (a warp per key, lanes over
// head_dim, warp sums), takes the chunk's max and exp-sum per head, and writes its unnormalised partial output
// (m, l, acc[hd]) in fp32; chunks past the row's position write l = 0. Pass 2: a CTA per (query head, row) rescales
// the partials by exp(m - M) and divides by the total. Each K/V row of a chunk is read once per group.
#include <cuda_bf16.h>
#include <cstdint>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kv_attention.h"
#include "cuda_check.h"

namespace {

constexpr int kChunk = 64, kThreads = 128, kMaxHd = 256, kMaxGroup = 16;

__global__ void append_kernel(__nv_bfloat16 *kc, __nv_bfloat16 *vc, size_t seq_stride, const __nv_bfloat16 *k,
                              int ldk, const __nv_bfloat16 *v, int ldv, const int32_t *seq, const int32_t *pos,
                              int kd)
{
    const int t = blockIdx.x;
    const size_t at = (size_t)seq[t] * seq_stride + (size_t)pos[t] * kd;
    for (int i = threadIdx.x; i < kd; i += blockDim.x) {
        kc[at + i] = k[(size_t)t * ldk + i];
        vc[at + i] = v[(size_t)t * ldv + i];
    }
}

__global__ void __launch_bounds__(kThreads)
    partial_kernel(float *ws_acc, float *ws_ml, const __nv_bfloat16 *q, int ldq, const __nv_bfloat16 *kc,
                   const __nv_bfloat16 *vc, size_t seq_stride, const int32_t *seq, const int32_t *pos, int nh,
                   int nkv, int hd, float scale, int nchunks)
{
    __shared__ float qs[kMaxGroup * kMaxHd];
    __shared__ float sc[kMaxGroup][kChunk];
    __shared__ float mx[kMaxGroup], sm[kMaxGroup];
    const int c = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z, group = nh / nkv;
    const int p = pos[t], j0 = c * kChunk, j1 = min(j0 + kChunk, p + 1);
    const size_t kd = (size_t)nkv * hd;
    float *ml = ws_ml + ((size_t)t * nh + (size_t)kvh * group) * nchunks * 2;
    if (j0 > p) { // past the causal end: an empty partial per head
        if (threadIdx.x < group) {
            ml[((size_t)threadIdx.x * nchunks + c) * 2] = -INFINITY;
            ml[((size_t)threadIdx.x * nchunks + c) * 2 + 1] = 0.0f;
        }
        return;
    }
    for (int i = threadIdx.x; i < group * hd; i += blockDim.x) {
        int g = i / hd, d = i - g * hd;
        qs[i] = __bfloat162float(q[(size_t)t * ldq + (size_t)(kvh * group + g) * hd + d]);
    }
    __syncthreads();
    const __nv_bfloat16 *ks = kc + (size_t)seq[t] * seq_stride + (size_t)kvh * hd;
    const __nv_bfloat16 *vs = vc + (size_t)seq[t] * seq_stride + (size_t)kvh * hd;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int j = j0 + warp; j < j1; j += kThreads / 32) {
        const __nv_bfloat16 *kj = ks + (size_t)j * kd;
        float kv[kMaxHd / 32];
#pragma unroll
        for (int e = 0; e < kMaxHd / 32; e++) kv[e] = lane + 32 * e < hd ? __bfloat162float(kj[lane + 32 * e]) : 0.0f;
        for (int g = 0; g < group; g++) {
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < kMaxHd / 32; e++)
                if (lane + 32 * e < hd) d += qs[g * hd + lane + 32 * e] * kv[e];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
            if (lane == 0) sc[g][j - j0] = d * scale;
        }
    }
    __syncthreads();
    if (threadIdx.x < group) { // the chunk's max and exp-sum per head (at most kChunk values)
        const int g = threadIdx.x;
        float m = -INFINITY, s = 0.0f;
        for (int j = 0; j < j1 - j0; j++) m = fmaxf(m, sc[g][j]);
        for (int j = 0; j < j1 - j0; j++) {
            float e = expf(sc[g][j] - m);
            sc[g][j] = e;
            s += e;
        }
        mx[g] = m, sm[g] = s;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < group * hd; i += blockDim.x) {
        int g = i / hd, d = i - g * hd;
        float a = 0.0f;
        for (int j = j0; j < j1; j++) a += sc[g][j - j0] * __bfloat162float(vs[(size_t)j * kd + d]);
        ws_acc[(((size_t)t * nh + (size_t)kvh * group + g) * nchunks + c) * hd + d] = a;
    }
    if (threadIdx.x < group) {
        ml[((size_t)threadIdx.x * nchunks + c) * 2] = mx[threadIdx.x];
        ml[((size_t)threadIdx.x * nchunks + c) * 2 + 1] = sm[threadIdx.x];
    }
}

__global__ void combine_kernel(__nv_bfloat16 *out, int ldo, const float *ws_acc, const float *ws_ml,
                               const int32_t *pos, int nh, int hd, int nchunks)
{
    const int h = blockIdx.x, t = blockIdx.y, d = threadIdx.x;
    const int used = pos[t] / kChunk + 1;
    const float *ml = ws_ml + ((size_t)t * nh + h) * nchunks * 2;
    float M = -INFINITY;
    for (int c = 0; c < used; c++) M = fmaxf(M, ml[2 * c]);
    float L = 0.0f, a = 0.0f;
    const float *acc = ws_acc + ((size_t)t * nh + h) * nchunks * hd;
    for (int c = 0; c < used; c++) {
        float w = expf(ml[2 * c] - M);
        L += ml[2 * c + 1] * w;
        if (d < hd) a += acc[(size_t)c * hd + d] * w;
    }
    if (d < hd) out[(size_t)t * ldo + (size_t)h * hd + d] = __float2bfloat16(a / L);
}

} // namespace

extern "C" void kv_cache_append_cuda(uint16_t *kc, uint16_t *vc, size_t seq_stride, const uint16_t *k, int ldk,
                                     const uint16_t *v, int ldv, const int32_t *seq, const int32_t *pos, int T,
                                     int kd, void *stream)
{
    if (T <= 0) return;
    append_kernel<<<T, 256, 0, (cudaStream_t)stream>>>((__nv_bfloat16 *)kc, (__nv_bfloat16 *)vc, seq_stride,
                                                       (const __nv_bfloat16 *)k, ldk, (const __nv_bfloat16 *)v, ldv,
                                                       seq, pos, kd);
    CHECK_CUDA_LAUNCH();
}

extern "C" size_t kv_attention_workspace_bytes(int T, int nh, int hd, int max_pos)
{
    size_t nchunks = (size_t)max_pos / kChunk + 1;
    return sizeof(float) * (size_t)T * (size_t)nh * nchunks * ((size_t)hd + 2);
}

extern "C" void kv_attention_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *kc,
                                              const uint16_t *vc, size_t seq_stride, const int32_t *seq,
                                              const int32_t *pos, int T, int max_pos, int nh, int nkv, int hd,
                                              float scale, float *workspace, void *stream)
{
    if (T <= 0) return;
    if (hd > kMaxHd || nh % nkv || nh / nkv > kMaxGroup) {
        fprintf(stderr, "kv_attention_forward_cuda: head_dim %d (max %d), heads %d / kv heads %d (group max %d)\n",
                hd, kMaxHd, nh, nkv, kMaxGroup);
        abort();
    }
    const int nchunks = max_pos / kChunk + 1;
    float *ws_acc = workspace, *ws_ml = workspace + (size_t)T * nh * nchunks * hd;
    cudaStream_t st = (cudaStream_t)stream;
    partial_kernel<<<dim3(nchunks, nkv, T), kThreads, 0, st>>>(ws_acc, ws_ml, (const __nv_bfloat16 *)q, ldq,
                                                               (const __nv_bfloat16 *)kc, (const __nv_bfloat16 *)vc,
                                                               seq_stride, seq, pos, nh, nkv, hd, scale, nchunks);
    CHECK_CUDA_LAUNCH();
    combine_kernel<<<dim3(nh, T), (hd + 31) / 32 * 32, 0, st>>>((__nv_bfloat16 *)out, ldo, ws_acc, ws_ml, pos, nh,
                                                                 hd, nchunks);
    CHECK_CUDA_LAUNCH();
}
