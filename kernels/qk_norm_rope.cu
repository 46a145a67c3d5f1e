// qk_norm_rope: CUDA per-head RMSNorm + rotate-half RoPE, in place, bf16 with fp32 math. One warp per (token,
// head) row: lane l holds the pairs (i, i + hd/2) for i = l, l+32, ...; the sum of squares is a warp reduction.
// The angle pos·inv_freq is formed in double and reduced to [-π, π] before sincosf, so long positions keep the
// CPU reference's accuracy. When head_dim is 16..256 (a power of two) and the rows are 16-byte aligned, blocks that
// each do all heads of two tokens at a time run instead (described above qk_norm_rope_tok_kernel; the reduced angle
// goes through __sincosf there). The backward is described above its kernel.
#include <cuda_bf16.h>
#include <cstdint>

#include "colsum.h"
#include "cuda_check.h"
#include "pdl.cuh"
#include "qk_norm_rope.h"

#define QKR_MAX_PAIRS 8 /* hd/2 <= 256 */

/* The decoding cache the k rows (after norm and rotation) and the v rows go to (qk_norm_rope_append_cuda); kc NULL:
 * none. Row t's are written at (seq[t], pos[t]), rows of nkv*hd values, sequences seq_stride apart. */
struct qkr_cache {
    __nv_bfloat16 *kc, *vc;
    size_t seq_stride;
    const int32_t *seq;
    const __nv_bfloat16 *v;
    int ldv;
};

/* The warp rows after the n*(nh+nkv) q/k rows, when the cache is given: (token, v head) rows copied into vc.
 * Returns 1 when this warp's row is one of them (or past every row). */
static __device__ __forceinline__ int qkr_v_rows(const qkr_cache &ca, int n, int nh, int nkv, int hd,
                                                 const int32_t *pos)
{
    long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32 - (long long)n * (nh + nkv);
    if (!ca.kc || row < 0) return 0;
    if (row >= (long long)n * nkv) return 1;
    const int t = (int)(row / nkv), h = (int)(row - (long long)t * nkv);
    __nv_bfloat16 *dst = ca.vc + (size_t)ca.seq[t] * ca.seq_stride + ((size_t)pos[t] * nkv + h) * hd;
    const __nv_bfloat16 *src = ca.v + (size_t)t * ca.ldv + (size_t)h * hd;
    for (int i = threadIdx.x & 31; i < hd; i += 32) dst[i] = src[i];
    return 1;
}

/* Where row t's k head h (h >= nh: a k row) goes in the cache, or NULL (a q row, or no cache). */
static __device__ __forceinline__ __nv_bfloat16 *qkr_k_dst(const qkr_cache &ca, int t, int nh, int nkv, int hd,
                                                           const int32_t *pos)
{
    long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int h = (int)(row - (long long)t * (nh + nkv));
    if (!ca.kc || h < nh) return nullptr;
    return ca.kc + (size_t)ca.seq[t] * ca.seq_stride + ((size_t)pos[t] * nkv + (h - nh)) * hd;
}

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
                                           float eps, const int32_t *pos, const double *inv_freq, qkr_cache ca)
{
    pdl::launch_dependents(); // a programmatic dependent launch (pdl.cuh): the GEMV before it may still run
    pdl::wait();
    const int lane = threadIdx.x & 31;
    int t;
    __nv_bfloat16 *x;
    const __nv_bfloat16 *w;
    if (qkr_v_rows(ca, n, nh, nkv, hd, pos)) return;
    if (!qkr_row(q, ldq, k, ldk, n, nh, nkv, hd, q_w, k_w, &t, &x, &w)) return;
    __nv_bfloat16 *kd = qkr_k_dst(ca, t, nh, nkv, hd, pos);
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
        if (kd) kd[i] = x[i], kd[i + half] = x[i + half];
    }
}

// Same, two adjacent pairs per lane (4-byte loads and stores): lane l holds i = 2l, 2l+1 (+64 per step) and their
// partners at i + hd/2. Needs hd % 4 == 0, even strides and 4-byte aligned q/k.
static __global__ void qk_norm_rope_x2_kernel(__nv_bfloat16 *q, int ldq, __nv_bfloat16 *k, int ldk, int n, int nh,
                                              int nkv, int hd, const __nv_bfloat16 *q_w, const __nv_bfloat16 *k_w,
                                              float eps, const int32_t *pos, const double *inv_freq, qkr_cache ca)
{
    pdl::launch_dependents(); // a programmatic dependent launch (pdl.cuh): the GEMV before it may still run
    pdl::wait();
    const int lane = threadIdx.x & 31;
    int t;
    __nv_bfloat16 *x;
    const __nv_bfloat16 *w;
    if (qkr_v_rows(ca, n, nh, nkv, hd, pos)) return;
    if (!qkr_row(q, ldq, k, ldk, n, nh, nkv, hd, q_w, k_w, &t, &x, &w)) return;
    __nv_bfloat16 *kd = qkr_k_dst(ca, t, nh, nkv, hd, pos);
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
        const __nv_bfloat162 r1 = __floats2bfloat162_rn(o1[0], o1[1]), r2 = __floats2bfloat162_rn(o2[0], o2[1]);
        *reinterpret_cast<__nv_bfloat162 *>(x + i) = r1;
        *reinterpret_cast<__nv_bfloat162 *>(x + i + half) = r2;
        if (kd) *reinterpret_cast<__nv_bfloat162 *>(kd + i) = r1, *reinterpret_cast<__nv_bfloat162 *>(kd + i + half) = r2;
    }
}

// Groups of QKR_TOK_TOKENS tokens, 16-byte vectors: G = hd/8 lanes per (token, head) row, a block holds all nh + nkv
// rows of a group (one vector per thread per token). The blocks are persistent (two per SM) and walk the groups
// with a stride, loading the next group while they work on this one, so the loads of one group overlap the math and
// stores of the previous. Each group's hd/2 angles per token are formed once into shared memory (the per-row
// kernels above redo them for every head: at 40 heads that was most of their work), in one of two buffers by
// iteration parity (a block passes the next iteration's barrier only when every thread has read this one's). The
// sum of squares is a reduction over the row's G lanes and each value's rotate-half partner comes from the lane G/2
// away. Each lane writes only what it read. G is a power of two (hd 16..256); the caller checks alignment and
// (nh+nkv)·G <= QKR_TOK_THREADS.
#define QKR_TOK_TOKENS 2
#define QKR_TOK_THREADS 640 /* Qwen3's 32 + 8 heads of 128: two blocks per SM at <= 48 registers */
#define QKR_TOK_BLOCKS_PER_SM 2
template <int G>
static __global__ void __launch_bounds__(QKR_TOK_THREADS, QKR_TOK_BLOCKS_PER_SM)
    qk_norm_rope_tok_kernel(uint4 *q, int ldq8, uint4 *k, int ldk8, int n, int nh, int nkv, const uint4 *q_w,
                            const uint4 *k_w, float eps, const int32_t *pos, const double *inv_freq)
{
    constexpr int HD = 8 * G, HALF = HD / 2, TT = QKR_TOK_TOKENS;
    __shared__ float cs[2][TT][HALF], sn[2][TT][HALF];
    const int head = threadIdx.x / G, v = threadIdx.x % G, groups = (n + TT - 1) / TT;
    const bool on = head < nh + nkv;
    const uint4 *w = head < nh ? q_w : k_w;
    const int ld8 = head < nh ? ldq8 : ldk8; // this thread's vector of token t is x0[t * ld8]
    uint4 *const x0 = (head < nh ? q + (size_t)head * G : k + (size_t)(head - nh) * G) + v;
    uint4 wv = make_uint4(0, 0, 0, 0);
    if (on && w) wv = w[v];
    const __nv_bfloat162 *w2 = reinterpret_cast<const __nv_bfloat162 *>(&wv);
    const bool first = v < G / 2; // this lane holds x1 (i < hd/2), its partner x2 = x[i + hd/2]; else the reverse
    const int f0 = (first ? v : v - G / 2) * 8;
    const double two_pi = 6.283185307179586476925, inv_two_pi = 0.15915494309189533577;
    uint4 xv[TT];
#pragma unroll
    for (int tt = 0; tt < TT; tt++) {
        const int t = blockIdx.x * TT + tt;
        xv[tt] = on && t < n ? x0[(size_t)t * ld8] : make_uint4(0, 0, 0, 0);
    }
    for (int g = blockIdx.x, it = 0; g < groups; g += gridDim.x, it ^= 1) {
        const int t0 = g * TT, gn = g + gridDim.x;
        uint4 xn[TT];
#pragma unroll
        for (int tt = 0; tt < TT; tt++) {
            const int t = gn * TT + tt;
            xn[tt] = on && gn < groups && t < n ? x0[(size_t)t * ld8] : make_uint4(0, 0, 0, 0);
        }
        for (int e = threadIdx.x; e < TT * HALF; e += blockDim.x) {
            const int tt = e / HALF, f = e % HALF;
            if (t0 + tt >= n) continue;
            double ang = (double)pos[t0 + tt] * inv_freq[f];
            ang -= two_pi * rint(ang * inv_two_pi);
            __sincosf((float)ang, &sn[it][tt][f], &cs[it][tt][f]); // |ang| <= pi: abs error <= 2^-21.4
        }
        __syncthreads();
#pragma unroll
        for (int tt = 0; tt < TT; tt++) {
            const __nv_bfloat162 *x2 = reinterpret_cast<const __nv_bfloat162 *>(&xv[tt]);
            float a[8], b[8], ss = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float2 f = __bfloat1622float2(x2[j]);
                a[2 * j] = f.x, a[2 * j + 1] = f.y;
                ss += f.x * f.x + f.y * f.y;
            }
#pragma unroll
            for (int o = G / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            if (w) {
                const float rstd = rsqrtf(ss / (float)HD + eps);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float2 f = __bfloat1622float2(w2[j]);
                    a[2 * j] = f.x * (a[2 * j] * rstd), a[2 * j + 1] = f.y * (a[2 * j + 1] * rstd);
                }
            }
#pragma unroll
            for (int j = 0; j < 8; j++) b[j] = __shfl_xor_sync(0xffffffffu, a[j], G / 2);
            if (!on || t0 + tt >= n) continue;
            uint4 ov;
            __nv_bfloat162 *o2 = reinterpret_cast<__nv_bfloat162 *>(&ov);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float o[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int jj = 2 * j + e;
                    const float c = cs[it][tt][f0 + jj], s = sn[it][tt][f0 + jj];
                    o[e] = first ? a[jj] * c - b[jj] * s : a[jj] * c + b[jj] * s;
                }
                o2[j] = __floats2bfloat162_rn(o[0], o[1]);
            }
            x0[(size_t)(t0 + tt) * ld8] = ov;
        }
#pragma unroll
        for (int tt = 0; tt < TT; tt++) xv[tt] = xn[tt];
    }
}

template <int G>
static void qk_norm_rope_tok_launch(uint16_t *q, int ldq, uint16_t *k, int ldk, int n, int nh, int nkv,
                                    const uint16_t *q_w, const uint16_t *k_w, float eps, const int32_t *pos,
                                    const double *inv_freq, cudaStream_t st)
{
    static int sms = 0; /* the device's SM count, asked once (the process uses one device) */
    if (!sms) {
        int dev = 0;
        CHECK_CUDA(cudaGetDevice(&dev));
        CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    }
    const int threads = ((nh + nkv) * G + 31) / 32 * 32, groups = (n + QKR_TOK_TOKENS - 1) / QKR_TOK_TOKENS;
    const int grid = groups < QKR_TOK_BLOCKS_PER_SM * sms ? groups : QKR_TOK_BLOCKS_PER_SM * sms;
    qk_norm_rope_tok_kernel<G><<<grid, threads, 0, st>>>((uint4 *)q, ldq / 8, (uint4 *)k, ldk / 8, n, nh, nkv,
                                                         (const uint4 *)q_w, (const uint4 *)k_w, eps, pos, inv_freq);
}

/* Whether the per-token vector kernel takes the call; launched when it does. */
static bool qk_norm_rope_tok(uint16_t *q, int ldq, uint16_t *k, int ldk, int n, int nh, int nkv, int hd,
                             const uint16_t *q_w, const uint16_t *k_w, float eps, const int32_t *pos,
                             const double *inv_freq, cudaStream_t st)
{
    const int G = hd / 8;
    if (hd % 8 != 0 || G < 2 || G > 32 || (G & (G - 1)) != 0 || (nh + nkv) * G > QKR_TOK_THREADS) return false;
    if (ldq % 8 || ldk % 8 || (uintptr_t)q % 16 || (uintptr_t)k % 16 || (uintptr_t)q_w % 16 || (uintptr_t)k_w % 16)
        return false;
    switch (G) {
    case 2: qk_norm_rope_tok_launch<2>(q, ldq, k, ldk, n, nh, nkv, q_w, k_w, eps, pos, inv_freq, st); break;
    case 4: qk_norm_rope_tok_launch<4>(q, ldq, k, ldk, n, nh, nkv, q_w, k_w, eps, pos, inv_freq, st); break;
    case 8: qk_norm_rope_tok_launch<8>(q, ldq, k, ldk, n, nh, nkv, q_w, k_w, eps, pos, inv_freq, st); break;
    case 16: qk_norm_rope_tok_launch<16>(q, ldq, k, ldk, n, nh, nkv, q_w, k_w, eps, pos, inv_freq, st); break;
    default: qk_norm_rope_tok_launch<32>(q, ldq, k, ldk, n, nh, nkv, q_w, k_w, eps, pos, inv_freq, st); break;
    }
    CHECK_CUDA_LAUNCH();
    return true;
}


static void qkr_launch(uint16_t *q, int ldq, uint16_t *k, int ldk, int n, int nh, int nkv, int hd,
                       const uint16_t *q_w, const uint16_t *k_w, float eps, const int32_t *pos, const double *inv_freq,
                       const qkr_cache &ca, const char *who, void *stream)
{
    if (n <= 0) return;
    if (hd % 2 != 0 || hd / 2 > 32 * QKR_MAX_PAIRS) {
        fprintf(stderr, "%s: head_dim %d unsupported (even, at most %d)\n", who, hd, 64 * QKR_MAX_PAIRS);
        exit(1);
    }
    // q heads use q_w and k heads k_w; a NULL weight means no norm for that tensor (both NULL for Llama)
    if (!ca.kc && qk_norm_rope_tok(q, ldq, k, ldk, n, nh, nkv, hd, q_w, k_w, eps, pos, inv_freq, (cudaStream_t)stream))
        return;
    const int warps = 8;
    long long rows = (long long)n * (nh + nkv + (ca.kc ? nkv : 0));
    unsigned grid = (unsigned)((rows + warps - 1) / warps);
    const bool kc_ok = !ca.kc || ((uintptr_t)ca.kc % 4 == 0 && ca.seq_stride % 2 == 0); // 4-byte stores there too
    if (hd % 4 == 0 && ldq % 2 == 0 && ldk % 2 == 0 && (uintptr_t)q % 4 == 0 && (uintptr_t)k % 4 == 0 && kc_ok) {
        pdl::launch(qk_norm_rope_x2_kernel, dim3(grid), dim3(warps * 32), 0, (cudaStream_t)stream,
                    (__nv_bfloat16 *)q, ldq, (__nv_bfloat16 *)k, ldk, n, nh, nkv, hd, (const __nv_bfloat16 *)q_w,
                    (const __nv_bfloat16 *)k_w, eps, pos, inv_freq, ca);
        return;
    }
    pdl::launch(qk_norm_rope_kernel, dim3(grid), dim3(warps * 32), 0, (cudaStream_t)stream, (__nv_bfloat16 *)q, ldq,
                (__nv_bfloat16 *)k, ldk, n, nh, nkv, hd, (const __nv_bfloat16 *)q_w, (const __nv_bfloat16 *)k_w, eps,
                pos, inv_freq, ca);
}

extern "C" void qk_norm_rope_cuda(uint16_t *q, int ldq, uint16_t *k, int ldk, int n, int nh, int nkv, int hd,
                                  const uint16_t *q_w, const uint16_t *k_w, float eps, const int32_t *pos,
                                  const double *inv_freq, void *stream)
{
    const qkr_cache none = {nullptr, nullptr, 0, nullptr, nullptr, 0};
    qkr_launch(q, ldq, k, ldk, n, nh, nkv, hd, q_w, k_w, eps, pos, inv_freq, none, "qk_norm_rope_cuda", stream);
}

extern "C" void qk_norm_rope_append_cuda(uint16_t *q, int ldq, uint16_t *k, int ldk, const uint16_t *v, int ldv,
                                         int n, int nh, int nkv, int hd, const uint16_t *q_w, const uint16_t *k_w,
                                         float eps, const int32_t *pos, const double *inv_freq, uint16_t *kc,
                                         uint16_t *vc, size_t seq_stride, const int32_t *seq, void *stream)
{
    const qkr_cache ca = {(__nv_bfloat16 *)kc, (__nv_bfloat16 *)vc, seq_stride, seq, (const __nv_bfloat16 *)v, ldv};
    qkr_launch(q, ldq, k, ldk, n, nh, nkv, hd, q_w, k_w, eps, pos, inv_freq, ca, "qk_norm_rope_append_cuda", stream);
}

// Partial rotary (hybrid targets): one warp per (token, head) row. The normalised row goes to the warp's slice of
// shared memory (hd floats), then each lane writes its elements: i < rd/2 pairs with i + rd/2 (x1·c − x2·s), the
// partner half with i − rd/2 (x2·c + x1·s), and i >= rd is only normalised. Each lane writes only what it read.
#define QKR_PARTIAL_WARPS 8
static __global__ void qk_norm_rope_partial_kernel(__nv_bfloat16 *q, int ldq, __nv_bfloat16 *k, int ldk, int n,
                                                   int nh, int nkv, int hd, int rd, const __nv_bfloat16 *q_w,
                                                   const __nv_bfloat16 *k_w, float eps, const int32_t *pos,
                                                   const double *inv_freq)
{
    extern __shared__ float qkr_sh[];
    const int lane = threadIdx.x & 31;
    float *xs = qkr_sh + (size_t)(threadIdx.x / 32) * hd;
    int t;
    __nv_bfloat16 *x;
    const __nv_bfloat16 *w;
    if (!qkr_row(q, ldq, k, ldk, n, nh, nkv, hd, q_w, k_w, &t, &x, &w)) return;
    float ss = 0.0f;
    for (int i = lane; i < hd; i += 32) {
        float v = __bfloat162float(x[i]);
        xs[i] = v;
        ss += v * v;
    }
    const float rstd = w ? qkr_rstd(ss, hd, eps) : 1.0f;
    for (int i = lane; i < hd; i += 32)
        if (w) xs[i] = __bfloat162float(w[i]) * (xs[i] * rstd);
    __syncwarp();
    const double two_pi = 6.283185307179586476925, inv_two_pi = 0.15915494309189533577, p = (double)pos[t];
    const int half = rd / 2;
    for (int i = lane; i < hd; i += 32) {
        float o = xs[i];
        if (i < rd) {
            const int f = i < half ? i : i - half;
            double ang = p * inv_freq[f];
            ang -= two_pi * rint(ang * inv_two_pi);
            float s, c;
            sincosf((float)ang, &s, &c);
            o = i < half ? xs[i] * c - xs[i + half] * s : xs[i] * c + xs[i - half] * s;
        }
        x[i] = __float2bfloat16_rn(o);
    }
}

extern "C" void qk_norm_rope_partial_cuda(uint16_t *q, int ldq, uint16_t *k, int ldk, int n, int nh, int nkv, int hd,
                                          int rd, const uint16_t *q_w, const uint16_t *k_w, float eps,
                                          const int32_t *pos, const double *inv_freq, void *stream)
{
    if (n <= 0) return;
    if (hd % 2 != 0 || hd > 64 * QKR_MAX_PAIRS || rd <= 0 || rd % 2 != 0 || rd > hd) {
        fprintf(stderr, "qk_norm_rope_partial_cuda: head_dim %d / rotary dim %d unsupported (even, rd <= hd <= %d)\n",
                hd, rd, 64 * QKR_MAX_PAIRS);
        exit(1);
    }
    long long rows = (long long)n * (nh + nkv);
    unsigned grid = (unsigned)((rows + QKR_PARTIAL_WARPS - 1) / QKR_PARTIAL_WARPS);
    qk_norm_rope_partial_kernel<<<grid, QKR_PARTIAL_WARPS * 32, sizeof(float) * (size_t)QKR_PARTIAL_WARPS * hd,
                                  (cudaStream_t)stream>>>(
        (__nv_bfloat16 *)q, ldq, (__nv_bfloat16 *)k, ldk, n, nh, nkv, hd, rd, (const __nv_bfloat16 *)q_w,
        (const __nv_bfloat16 *)k_w, eps, pos, inv_freq);
    CHECK_CUDA_LAUNCH();
}

// ---- backward ----
// One warp per chunk of consecutive (token, head) rows of q or of k (q chunks first); the chunking depends on the
// shape only. Lane l holds elements i = VEC·l + e (+ 32·VEC per step) and their partners at i + hd/2. Per row: the
// inverse rotation of the output gradient, then the rmsnorm backward against the saved pre-norm row; the warp's
// share of the weight gradient stays in registers and goes to its own workspace row, summed afterwards in a fixed
// order (no atomics). The next row is loaded before this row's reductions so that the loads overlap them.

#define QKR_BWD_MAX_CHUNKS 2048 /* per tensor: warps of the larger of q and k */

static int qkr_bwd_rows_per_chunk(long long rows_q, long long rows_k)
{
    long long mx = rows_q > rows_k ? rows_q : rows_k;
    long long chunks = mx < QKR_BWD_MAX_CHUNKS ? mx : QKR_BWD_MAX_CHUNKS;
    return chunks > 0 ? (int)((mx + chunks - 1) / chunks) : 1;
}

template <int VEC> struct qkr_raw;
template <> struct qkr_raw<1> {
    typedef __nv_bfloat16 type;
    static __device__ __forceinline__ void unpack(type v, float *f) { f[0] = __bfloat162float(v); }
    static __device__ __forceinline__ type pack(const float *f) { return __float2bfloat16_rn(f[0]); }
};
template <> struct qkr_raw<2> {
    typedef __nv_bfloat162 type;
    static __device__ __forceinline__ void unpack(type v, float *f)
    {
        float2 t = __bfloat1622float2(v);
        f[0] = t.x, f[1] = t.y;
    }
    static __device__ __forceinline__ type pack(const float *f) { return __floats2bfloat162_rn(f[0], f[1]); }
};

template <int VEC, int NJ>
static __global__ void qk_norm_rope_backward_kernel(__nv_bfloat16 *dq, int lddq, __nv_bfloat16 *dk, int lddk,
                                                    const __nv_bfloat16 *q, int ldq, const __nv_bfloat16 *k, int ldk,
                                                    int nh, int nkv, int hd, const __nv_bfloat16 *q_w,
                                                    const __nv_bfloat16 *k_w, float eps, const int32_t *pos,
                                                    const double *inv_freq, long long rows_q, long long rows_k,
                                                    int rpc, int chunks_q, int chunks_k, float *part_q, float *part_k)
{
    typedef qkr_raw<VEC> R;
    typedef typename R::type raw;
    const double two_pi = 6.283185307179586476925, inv_two_pi = 0.15915494309189533577;
    const int lane = threadIdx.x & 31;
    const int gw = (int)(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32);
    if (gw >= chunks_q + chunks_k) return;
    const bool isq = gw < chunks_q;
    const int chunk = isq ? gw : gw - chunks_q, heads = isq ? nh : nkv;
    __nv_bfloat16 *d = isq ? dq : dk;
    const __nv_bfloat16 *x = isq ? q : k, *w = isq ? q_w : k_w;
    const int ldd = isq ? lddq : lddk, ldx = isq ? ldq : ldk;
    float *part = isq ? part_q : part_k;
    const long long rows = isq ? rows_q : rows_k, r0 = (long long)chunk * rpc;
    const long long r1 = r0 + rpc < rows ? r0 + rpc : rows;
    const int half = hd / 2;

    float wa[NJ][VEC], wb[NJ][VEC], acc_a[NJ][VEC], acc_b[NJ][VEC];
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const int i = VEC * lane + 32 * VEC * j;
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            acc_a[j][e] = acc_b[j][e] = 0.0f;
            wa[j][e] = w && i < half ? __bfloat162float(w[i + e]) : 0.0f;
            wb[j][e] = w && i < half ? __bfloat162float(w[i + half + e]) : 0.0f;
        }
    }
    raw nda[NJ], ndb[NJ], nxa[NJ], nxb[NJ];
    int npos = 0;
    auto load = [&](long long r) {
        const int t = (int)(r / heads), h = (int)(r - (long long)t * heads);
        const __nv_bfloat16 *dr = d + (size_t)t * ldd + (size_t)h * hd, *xr = x + (size_t)t * ldx + (size_t)h * hd;
        npos = pos[t];
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int i = VEC * lane + 32 * VEC * j;
            if (i < half) {
                nda[j] = *reinterpret_cast<const raw *>(dr + i), ndb[j] = *reinterpret_cast<const raw *>(dr + i + half);
                nxa[j] = *reinterpret_cast<const raw *>(xr + i), nxb[j] = *reinterpret_cast<const raw *>(xr + i + half);
            }
        }
    };
    if (r0 < r1) load(r0);
    for (long long r = r0; r < r1; r++) {
        float ga[NJ][VEC], gb[NJ][VEC], xa[NJ][VEC], xb[NJ][VEC];
        const double p = (double)npos;
        float ss = 0.0f, sd = 0.0f;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int i = VEC * lane + 32 * VEC * j;
            float da[VEC], db[VEC];
            R::unpack(nda[j], da), R::unpack(ndb[j], db), R::unpack(nxa[j], xa[j]), R::unpack(nxb[j], xb[j]);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                if (i >= half) { // past the row: contributes nothing
                    ga[j][e] = gb[j][e] = xa[j][e] = xb[j][e] = 0.0f;
                    continue;
                }
                // the transposed rotation (the forward's sin negated), angle reduced in double as the forward does
                double ang = p * inv_freq[i + e];
                ang -= two_pi * rint(ang * inv_two_pi);
                float s, c;
                sincosf((float)ang, &s, &c);
                ga[j][e] = da[e] * c + db[e] * s;
                gb[j][e] = db[e] * c - da[e] * s;
                ss += xa[j][e] * xa[j][e] + xb[j][e] * xb[j][e];
                sd += ga[j][e] * wa[j][e] * xa[j][e] + gb[j][e] * wb[j][e] * xb[j][e];
            }
        }
        const long long rr = r;
        const int t = (int)(rr / heads), h = (int)(rr - (long long)t * heads);
        __nv_bfloat16 *dr = d + (size_t)t * ldd + (size_t)h * hd;
        if (r + 1 < r1) load(r + 1);
        float rstd = 1.0f, cm = 0.0f;
        if (w) {
            for (int o = 16; o > 0; o >>= 1) {
                ss += __shfl_xor_sync(0xffffffffu, ss, o);
                sd += __shfl_xor_sync(0xffffffffu, sd, o);
            }
            rstd = rsqrtf(ss / (float)hd + eps);
            cm = sd * rstd / (float)hd;
        }
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int i = VEC * lane + 32 * VEC * j;
            if (i >= half) continue;
            float oa[VEC], ob[VEC];
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                if (w) {
                    float xha = xa[j][e] * rstd, xhb = xb[j][e] * rstd;
                    oa[e] = rstd * (ga[j][e] * wa[j][e] - xha * cm);
                    ob[e] = rstd * (gb[j][e] * wb[j][e] - xhb * cm);
                    acc_a[j][e] += ga[j][e] * xha;
                    acc_b[j][e] += gb[j][e] * xhb;
                } else {
                    oa[e] = ga[j][e], ob[e] = gb[j][e];
                }
            }
            *reinterpret_cast<raw *>(dr + i) = R::pack(oa);
            *reinterpret_cast<raw *>(dr + i + half) = R::pack(ob);
        }
    }
    if (!part || !w) return;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const int i = VEC * lane + 32 * VEC * j;
        if (i >= half) continue;
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            part[(size_t)chunk * hd + i + e] = acc_a[j][e];
            part[(size_t)chunk * hd + half + i + e] = acc_b[j][e];
        }
    }
}


extern "C" size_t qk_norm_rope_backward_cuda_workspace(int n, int nh, int nkv, int hd)
{
    // an upper bound that also covers a call with dq or dk NULL (its heads then do not count)
    long long rq = (long long)n * nh, rk = (long long)n * nkv;
    long long cq = rq < QKR_BWD_MAX_CHUNKS ? rq : QKR_BWD_MAX_CHUNKS, ck = rk < QKR_BWD_MAX_CHUNKS ? rk : QKR_BWD_MAX_CHUNKS;
    return (size_t)(cq + ck) * (size_t)(hd > 0 ? hd : 0) * sizeof(float);
}

template <int VEC, int NJ>
static void qkr_bwd_launch(unsigned grid, int threads, cudaStream_t st, uint16_t *dq, int lddq, uint16_t *dk, int lddk,
                           const uint16_t *q, int ldq, const uint16_t *k, int ldk, int nh, int nkv, int hd,
                           const uint16_t *q_w, const uint16_t *k_w, float eps, const int32_t *pos,
                           const double *inv_freq, long long rq, long long rk, int rpc, int cq, int ck, float *pq,
                           float *pk)
{
    qk_norm_rope_backward_kernel<VEC, NJ><<<grid, threads, 0, st>>>(
        (__nv_bfloat16 *)dq, lddq, (__nv_bfloat16 *)dk, lddk, (const __nv_bfloat16 *)q, ldq,
        (const __nv_bfloat16 *)k, ldk, nh, nkv, hd, (const __nv_bfloat16 *)q_w, (const __nv_bfloat16 *)k_w, eps, pos,
        inv_freq, rq, rk, rpc, cq, ck, pq, pk);
}

extern "C" void qk_norm_rope_backward_cuda(uint16_t *dq, int lddq, uint16_t *dk, int lddk, const uint16_t *q,
                                           int ldq, const uint16_t *k, int ldk, int n, int nh, int nkv, int hd,
                                           const uint16_t *q_w, const uint16_t *k_w, float *dq_w, float *dk_w,
                                           float eps, const int32_t *pos, const double *inv_freq, float *workspace,
                                           void *stream)
{
    if (!dq) nh = 0;
    if (!dk) nkv = 0;
    if (n <= 0 || nh + nkv <= 0) return;
    if (hd % 2 != 0 || hd / 2 > 32 * QKR_MAX_PAIRS) {
        fprintf(stderr, "qk_norm_rope_backward_cuda: head_dim %d unsupported (even, at most %d)\n", hd,
                64 * QKR_MAX_PAIRS);
        exit(1);
    }
    const bool want_q = nh > 0 && q_w && dq_w, want_k = nkv > 0 && k_w && dk_w;
    if ((want_q || want_k) && !workspace) {
        fprintf(stderr, "qk_norm_rope_backward_cuda: weight gradients need qk_norm_rope_backward_cuda_workspace()\n");
        exit(1);
    }
    cudaStream_t st = (cudaStream_t)stream;
    const long long rq = (long long)n * nh, rk = (long long)n * nkv;
    const int rpc = qkr_bwd_rows_per_chunk(rq, rk);
    const int cq = (int)((rq + rpc - 1) / rpc), ck = (int)((rk + rpc - 1) / rpc);
    float *pq = want_q ? workspace : NULL, *pk = want_k ? workspace + (size_t)cq * hd : NULL;
    const int warps = 8, threads = warps * 32;
    const unsigned grid = (unsigned)((cq + ck + warps - 1) / warps);
    const int half = hd / 2;
    const bool x2 = hd % 4 == 0 && (!nh || (lddq % 2 == 0 && ldq % 2 == 0 && (uintptr_t)dq % 4 == 0 &&
                                            (uintptr_t)q % 4 == 0)) &&
                    (!nkv || (lddk % 2 == 0 && ldk % 2 == 0 && (uintptr_t)dk % 4 == 0 && (uintptr_t)k % 4 == 0));
#define QKR_BWD_ARGS grid, threads, st, dq, lddq, dk, lddk, q, ldq, k, ldk, nh, nkv, hd, q_w, k_w, eps, pos, inv_freq, \
                     rq, rk, rpc, cq, ck, pq, pk
    if (x2) {
        int nj = (half + 63) / 64;
        if (nj <= 1) qkr_bwd_launch<2, 1>(QKR_BWD_ARGS);
        else if (nj <= 2) qkr_bwd_launch<2, 2>(QKR_BWD_ARGS);
        else qkr_bwd_launch<2, 4>(QKR_BWD_ARGS);
    } else {
        int nj = (half + 31) / 32;
        if (nj <= 1) qkr_bwd_launch<1, 1>(QKR_BWD_ARGS);
        else if (nj <= 2) qkr_bwd_launch<1, 2>(QKR_BWD_ARGS);
        else if (nj <= 4) qkr_bwd_launch<1, 4>(QKR_BWD_ARGS);
        else qkr_bwd_launch<1, 8>(QKR_BWD_ARGS);
    }
#undef QKR_BWD_ARGS
    CHECK_CUDA_LAUNCH();
    if (want_q) {
        colsum_add_cuda(dq_w, pq, cq, hd, st);
        CHECK_CUDA_LAUNCH();
    }
    if (want_k) {
        colsum_add_cuda(dk_w, pk, ck, hd, st);
        CHECK_CUDA_LAUNCH();
    }
}
