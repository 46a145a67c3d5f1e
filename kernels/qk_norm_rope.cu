// qk_norm_rope: CUDA per-head RMSNorm + rotate-half RoPE, in place, bf16 with fp32 math. One warp per (token,
// head) row: lane l holds the pairs (i, i + hd/2) for i = l, l+32, ...; the sum of squares is a warp reduction.
// The angle pos·inv_freq is formed in double and reduced to [-π, π] before sincosf, so long positions keep the
// CPU reference's accuracy.
#include <cuda_bf16.h>
#include <cstdint>

#include "cuda_check.h"
#include "qk_norm_rope.h"

#define QKR_MAX_PAIRS 8 /* hd/2 <= 256 */

/* The (token, head) row of this warp: q heads first, then k heads, each with its own norm weight. 0 past the end. */
static __device__ __forceinline__ int qkr_row(__nv_bfloat16 *q, int ldq, __nv_bfloat16 *k, int ldk, int n, int nh,
                                              int nkv, int hd, const __nv_bfloat16 *q_w, const __nv_bfloat16 *k_w,
                                              int *t, __nv_bfloat16 **x, const __nv_bfloat16 **w)
{
    long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int heads = nh + nkv;
    if (row >= (long long)n * heads) return 0;
    *t = (int)(row / heads);
    int h = (int)(row - (long long)*t * heads);
    if (h < nh) {
        *x = q + (size_t)*t * ldq + (size_t)h * hd, *w = q_w;
    } else {
        *x = k + (size_t)*t * ldk + (size_t)(h - nh) * hd, *w = k_w;
    }
    return 1;
}

/* 1/rms of the row from this lane's partial sum of squares (warp reduction). */
static __device__ __forceinline__ float qkr_rstd(float ss, int hd, float eps)
{
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    return rsqrtf(ss / (float)hd + eps);
}

/* Norm (when w) and rotate the pair (x1 at i, x2 at i + half) by pos * inv_freq[i]; the angle is formed in double
 * and reduced to [-pi, pi] before sincosf. */
static __device__ __forceinline__ void qkr_rotate(float x1, float x2, const __nv_bfloat16 *w, int i, int half,
                                                  float rstd, double p, const double *inv_freq, float *o1, float *o2)
{
    const double two_pi = 6.283185307179586476925, inv_two_pi = 0.15915494309189533577;
    if (w) {
        x1 = __bfloat162float(w[i]) * (x1 * rstd);
        x2 = __bfloat162float(w[i + half]) * (x2 * rstd);
    }
    double ang = p * inv_freq[i];
    ang -= two_pi * rint(ang * inv_two_pi);
    float s, c;
    sincosf((float)ang, &s, &c);
    *o1 = x1 * c - x2 * s;
    *o2 = x2 * c + x1 * s;
}

static __global__ void qk_norm_rope_kernel(__nv_bfloat16 *q, int ldq, __nv_bfloat16 *k, int ldk, int n, int nh,
                                           int nkv, int hd, const __nv_bfloat16 *q_w, const __nv_bfloat16 *k_w,
                                           float eps, const int32_t *pos, const double *inv_freq)
{
    const int lane = threadIdx.x & 31;
    int t;
    __nv_bfloat16 *x;
    const __nv_bfloat16 *w;
    if (!qkr_row(q, ldq, k, ldk, n, nh, nkv, hd, q_w, k_w, &t, &x, &w)) return;
    const int half = hd / 2;
    float a[QKR_MAX_PAIRS], b[QKR_MAX_PAIRS];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < QKR_MAX_PAIRS; j++) {
        int i = lane + 32 * j;
        a[j] = b[j] = 0.0f;
        if (i < half) {
            a[j] = __bfloat162float(x[i]), b[j] = __bfloat162float(x[i + half]);
            ss += a[j] * a[j] + b[j] * b[j];
        }
    }
    const float rstd = w ? qkr_rstd(ss, hd, eps) : 1.0f;
    const double p = (double)pos[t];
#pragma unroll
    for (int j = 0; j < QKR_MAX_PAIRS; j++) {
        int i = lane + 32 * j;
        if (i >= half) continue;
        float o1, o2;
        qkr_rotate(a[j], b[j], w, i, half, rstd, p, inv_freq, &o1, &o2);
        x[i] = __float2bfloat16_rn(o1);
        x[i + half] = __float2bfloat16_rn(o2);
    }
}

// Same, two adjacent pairs per lane (4-byte loads and stores): lane l holds i = 2l, 2l+1 (+64 per step) and their
// partners at i + hd/2. Needs hd % 4 == 0, even strides and 4-byte aligned q/k.
static __global__ void qk_norm_rope_x2_kernel(__nv_bfloat16 *q, int ldq, __nv_bfloat16 *k, int ldk, int n, int nh,
                                              int nkv, int hd, const __nv_bfloat16 *q_w, const __nv_bfloat16 *k_w,
                                              float eps, const int32_t *pos, const double *inv_freq)
{
    const int lane = threadIdx.x & 31;
    int t;
    __nv_bfloat16 *x;
    const __nv_bfloat16 *w;
    if (!qkr_row(q, ldq, k, ldk, n, nh, nkv, hd, q_w, k_w, &t, &x, &w)) return;
    const int half = hd / 2;
    float2 a[QKR_MAX_PAIRS / 2], b[QKR_MAX_PAIRS / 2];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < QKR_MAX_PAIRS / 2; j++) {
        int i = 2 * lane + 64 * j;
        a[j] = b[j] = make_float2(0.0f, 0.0f);
        if (i < half) {
            a[j] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(x + i));
            b[j] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(x + i + half));
            ss += a[j].x * a[j].x + a[j].y * a[j].y + b[j].x * b[j].x + b[j].y * b[j].y;
        }
    }
    const float rstd = w ? qkr_rstd(ss, hd, eps) : 1.0f;
    const double p = (double)pos[t];
#pragma unroll
    for (int j = 0; j < QKR_MAX_PAIRS / 2; j++) {
        int i = 2 * lane + 64 * j;
        if (i >= half) continue;
        float o1[2], o2[2];
        qkr_rotate(a[j].x, b[j].x, w, i, half, rstd, p, inv_freq, &o1[0], &o2[0]);
        qkr_rotate(a[j].y, b[j].y, w, i + 1, half, rstd, p, inv_freq, &o1[1], &o2[1]);
        *reinterpret_cast<__nv_bfloat162 *>(x + i) = __floats2bfloat162_rn(o1[0], o1[1]);
        *reinterpret_cast<__nv_bfloat162 *>(x + i + half) = __floats2bfloat162_rn(o2[0], o2[1]);
    }
}

extern "C" void qk_norm_rope_cuda(uint16_t *q, int ldq, uint16_t *k, int ldk, int n, int nh, int nkv, int hd,
                                  const uint16_t *q_w, const uint16_t *k_w, float eps, const int32_t *pos,
                                  const double *inv_freq, void *stream)
{
    if (n <= 0) return;
    if (hd % 2 != 0 || hd / 2 > 32 * QKR_MAX_PAIRS) {
        fprintf(stderr, "qk_norm_rope_cuda: head_dim %d unsupported (even, at most %d)\n", hd, 64 * QKR_MAX_PAIRS);
        exit(1);
    }
    // q heads use q_w and k heads k_w; a NULL weight means no norm for that tensor (both NULL for Llama)
    const int warps = 8;
    long long rows = (long long)n * (nh + nkv);
    unsigned grid = (unsigned)((rows + warps - 1) / warps);
    if (hd % 4 == 0 && ldq % 2 == 0 && ldk % 2 == 0 && (uintptr_t)q % 4 == 0 && (uintptr_t)k % 4 == 0) {
        qk_norm_rope_x2_kernel<<<grid, warps * 32, 0, (cudaStream_t)stream>>>(
            (__nv_bfloat16 *)q, ldq, (__nv_bfloat16 *)k, ldk, n, nh, nkv, hd, (const __nv_bfloat16 *)q_w,
            (const __nv_bfloat16 *)k_w, eps, pos, inv_freq);
        CHECK_CUDA_LAUNCH();
        return;
    }
    qk_norm_rope_kernel<<<grid, warps * 32, 0, (cudaStream_t)stream>>>(
        (__nv_bfloat16 *)q, ldq, (__nv_bfloat16 *)k, ldk, n, nh, nkv, hd, (const __nv_bfloat16 *)q_w,
        (const __nv_bfloat16 *)k_w, eps, pos, inv_freq);
    CHECK_CUDA_LAUNCH();
}
