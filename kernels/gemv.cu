// gemv: y = x·wᵀ (+ beta·c) for m <= 16 rows of x on the tensor cores, reading w once at the memory's rate.
// A CTA of 8 warps owns 16 output columns (16 rows of w); warp q takes the k-chunks of 128 values q, q+8, ... Within
// a chunk, lane (g = lane/4, t = lane%4) loads 16 bytes of w's rows g and g+8 and of x's rows g (and g+8 when
// m > 8) at k offsets 8t + 32u (u = 0..3). The m16n8k16 MMA sums over its 16 k values in any order as long as A and
// B agree, so each 32-value slice is two MMAs with the lane's own 8 values as its k pairs: A = {w_g[0:2], w_g+8[0:2],
// w_g[2:4], w_g+8[2:4]}, B = {x_g[0:2], x_g[2:4]}, then the words 2 and 3. The 8 warps' accumulators meet in shared
// memory and are summed in warp order (deterministic), plus beta·c, rounded once to bf16.
#include <cuda_bf16.h>
#include <cstdint>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "env_switch.h"
#include "gemv.h"
#include "mma_sm80.cuh"
#include "pdl.cuh"
#include "swiglu_act.cuh"

namespace {

constexpr int kWarps = 8, kRows = 16, kU = 4, kChunk = 32 * kU;

__device__ __forceinline__ uint4 ld_stream(const __nv_bfloat16 *p) // w: read once a step, keep it out of L1
{
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

template <int NT> // n-tiles of 8 rows of x: m <= 8 * NT
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(__nv_bfloat16 *y, int ldy, const __nv_bfloat16 *c, int ldc, float beta, const __nv_bfloat16 *x,
                int ldx, const __nv_bfloat16 *w, int m, int n, int k)
{
    __shared__ float red[kWarps][kRows][8 * NT];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int n0 = blockIdx.x * kRows, r0 = n0 + g, r1 = n0 + g + 8;
    const __nv_bfloat16 *w0 = w + (size_t)(r0 < n ? r0 : 0) * k, *w1 = w + (size_t)(r1 < n ? r1 : 0) * k;
    const __nv_bfloat16 *xr[NT];
    bool xv[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) xv[j] = g + 8 * j < m, xr[j] = x + (size_t)(xv[j] ? g + 8 * j : 0) * ldx;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int kb = warp * kChunk; kb < k; kb += kWarps * kChunk) {
        uint4 a0[kU], a1[kU], b[NT][kU];
#pragma unroll
        for (int u = 0; u < kU; u++) { // every load of the chunk first: 4 KiB of w in flight per warp
            const int kk = kb + 32 * u + 8 * t;
            const bool ok = kk < k;
            a0[u] = ok && r0 < n ? ld_stream(w0 + kk) : zero;
            a1[u] = ok && r1 < n ? ld_stream(w1 + kk) : zero;
#pragma unroll
            for (int j = 0; j < NT; j++)
                b[j][u] = ok && xv[j] ? __ldg(reinterpret_cast<const uint4 *>(xr[j] + kk)) : zero;
        }
#pragma unroll
        for (int u = 0; u < kU; u++) {
            const uint32_t A0[4] = {a0[u].x, a1[u].x, a0[u].y, a1[u].y}, A1[4] = {a0[u].z, a1[u].z, a0[u].w, a1[u].w};
#pragma unroll
            for (int j = 0; j < NT; j++) {
                mma_sm80::mma_bf16(acc[j], A0, b[j][u].x, b[j][u].y);
                mma_sm80::mma_bf16(acc[j], A1, b[j][u].z, b[j][u].w);
            }
        }
    }
    // accumulator (row of w, row of x): c0, c1 = (g, 8j + 2t + {0,1}); c2, c3 = (g + 8, the same)
#pragma unroll
    for (int j = 0; j < NT; j++) {
        red[warp][g][8 * j + 2 * t] = acc[j][0], red[warp][g][8 * j + 2 * t + 1] = acc[j][1];
        red[warp][g + 8][8 * j + 2 * t] = acc[j][2], red[warp][g + 8][8 * j + 2 * t + 1] = acc[j][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kRows * 8 * NT; i += blockDim.x) {
        const int col = i % kRows, row = i / kRows, nn = n0 + col;
        if (nn >= n || row >= m) continue;
        float s = 0.0f;
#pragma unroll
        for (int q = 0; q < kWarps; q++) s += red[q][col][row];
        if (beta != 0.0f) s += beta * __bfloat162float(c[(size_t)row * ldc + nn]);
        y[(size_t)row * ldy + nn] = __float2bfloat16_rn(s);
    }
}

// The CUDA-core kernel for m <= 8 (GEMV_KERNEL_FMA): a warp owns kFmaR output columns (rows of w) and reads them
// in 512-byte contiguous pieces (lane l: the 16 bytes at 8l + 256i of each row), kFmaU pieces of each row loaded
// before any is used (kFmaR * kFmaU * 512 bytes of w in flight per warp: 4 KiB. 8 KiB for m <= 2 was tried: the
// batch-1 step as a graph measured 5.20 ms against 4.78 in the run before, the cuBLASLt step the same in both; it
// halves the CTAs a SM, and a warp has nothing in flight while it multiplies), multiplied with the same 16 bytes of each
// row of x (read through L1: every warp of the SM reads them) into kFmaR x m fp32 sums, then a warp reduction in a
// fixed order (deterministic). Whole rounds of kFmaU pieces run unchecked; the last partial round checks k.
//
// The k split (fma_split): a matrix of few rows (Qwen3-8B's q|k|v, o_proj, down_proj: 2048-3072 row pairs) gives a
// warp per row pair few CTAs, in partial waves (o_proj: 256 CTAs, 2 a SM where 4 fit). So the S = split warps of a
// group in a CTA share a row pair, warp s taking
// the rounds s, s + S, ... of k (and the last partial round when it is its turn), their sums meeting in shared
// memory and added in warp order (deterministic: S depends on the shape only). S = 1 is the kernel before the split,
// its bits.
constexpr int kFmaU = 4, kFmaR = 2, kFmaRound = 256 * kFmaU;
constexpr long kFmaWave = 132 * 4; // the CTAs an H200 holds at once (132 SMs, 4 CTAs of 54-61 registers a thread)

// NORM (gemv_rmsnorm_forward_cuda): x's rows are first RMS-normalised with the weight nw. The row's 1/rms is a
// scalar of the whole dot product, so the warp multiplies x by nw on the fly, sums x² beside the products (every warp
// reads all of x anyway) and scales its sums by 1/rms at the end: no pass of its own, no normalised copy of x.
template <int M, bool NORM>
__device__ __forceinline__ void fma_piece(float (&acc)[kFmaR][M], float (&ss)[M], const uint4 (&a)[kFmaR],
                                          const __nv_bfloat16 *x, int ldx, const __nv_bfloat16 *nw, int m, int kk)
{
    float2 nf[4];
    if (NORM) {
        const uint4 nb = __ldg(reinterpret_cast<const uint4 *>(nw + kk));
#pragma unroll
        for (int e = 0; e < 4; e++) nf[e] = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162 *>(&nb)[e]);
    }
#pragma unroll
    for (int j = 0; j < M; j++) {
        if (j >= m) break;
        const uint4 xb = __ldg(reinterpret_cast<const uint4 *>(x + (size_t)j * ldx + kk));
        const __nv_bfloat162 *xv = reinterpret_cast<const __nv_bfloat162 *>(&xb);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float2 xf = __bfloat1622float2(xv[e]);
            if (NORM) {
                ss[j] = fmaf(xf.x, xf.x, ss[j]), ss[j] = fmaf(xf.y, xf.y, ss[j]);
                xf.x *= nf[e].x, xf.y *= nf[e].y;
            }
#pragma unroll
            for (int r = 0; r < kFmaR; r++) {
                const float2 wf = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162 *>(&a[r])[e]);
                acc[r][j] = fmaf(wf.x, xf.x, acc[r][j]);
                acc[r][j] = fmaf(wf.y, xf.y, acc[r][j]);
            }
        }
    }
}

// SWIGLU (gemv_rmsnorm_swiglu_forward_cuda): w holds 2n rows, the gate's n then the up's n; a warp's row pair is
// (gate u, up u), and it writes one value, silu(gate) * up from the two sums rounded to bf16 first: the bits of the
// gate|up GEMV's output put through swiglu_forward_cuda (the same sums: a row's arithmetic does not depend on the row
// beside it, nor does the split, a function of the row pairs' count and k).
template <int M, bool NORM, bool SWIGLU>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_fma_kernel(__nv_bfloat16 *y, int ldy, const __nv_bfloat16 *c, int ldc, float beta, const __nv_bfloat16 *x,
                    int ldx, const __nv_bfloat16 *nw, float eps, const __nv_bfloat16 *w, int m, int n, int k,
                    int split)
{
    __shared__ float red[kWarps][kFmaR + 1][M]; // the split's sums (and sums of x²), summed in warp order
    pdl::launch_dependents(); // the CUDA-core kernel may run as a programmatic dependent launch (pdl.cuh)
    const int lane = threadIdx.x % 32, wi = threadIdx.x / 32, s = wi % split;
    const int unit = blockIdx.x * (kWarps / split) + wi / split; // the row pair
    const int n0 = SWIGLU ? unit : unit * kFmaR;
    const bool valid = n0 < n; // a whole group is valid or not; the invalid ones still meet the others' barrier
    if (!valid && split == 1) return;
    const __nv_bfloat16 *wr[kFmaR];
#pragma unroll
    for (int r = 0; r < kFmaR; r++) {
        const int row = !valid ? 0 : SWIGLU ? n0 + r * n : n0 + r < n ? n0 + r : n0;
        wr[r] = w + (size_t)row * k + 8 * lane;
    }
    float acc[kFmaR][M], ss[M];
#pragma unroll
    for (int j = 0; j < M; j++) {
        ss[j] = 0.0f;
#pragma unroll
        for (int r = 0; r < kFmaR; r++) acc[r][j] = 0.0f;
    }
    const int rounds = valid ? k / kFmaRound : 0, whole = rounds * kFmaRound, step = split * kFmaRound;
    uint4 a[kFmaU][kFmaR];
    if (s < rounds) // the first round before the wait
#pragma unroll
        for (int u = 0; u < kFmaU; u++)
#pragma unroll
            for (int r = 0; r < kFmaR; r++) a[u][r] = ld_stream(wr[r] + s * kFmaRound + 256 * u);
    pdl::wait(); // the first round of w is in flight; x, c and y belong to the kernels before
    for (int kb = s * kFmaRound; kb < whole; kb += step) {
        if (kb > s * kFmaRound)
#pragma unroll
            for (int u = 0; u < kFmaU; u++)
#pragma unroll
                for (int r = 0; r < kFmaR; r++) a[u][r] = ld_stream(wr[r] + kb + 256 * u);
#pragma unroll
        for (int u = 0; u < kFmaU; u++) fma_piece<M, NORM>(acc, ss, a[u], x, ldx, nw, m, kb + 256 * u + 8 * lane);
    }
    if (valid && s == rounds % split) // the last partial round (k is a multiple of 8)
        for (int kk = whole + 8 * lane; kk < k; kk += 256) {
            uint4 a[kFmaR];
#pragma unroll
            for (int r = 0; r < kFmaR; r++) a[r] = ld_stream(wr[r] + kk - 8 * lane);
            fma_piece<M, NORM>(acc, ss, a, x, ldx, nw, m, kk);
        }
#pragma unroll
    for (int j = 0; j < M; j++)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
            for (int r = 0; r < kFmaR; r++) acc[r][j] += __shfl_xor_sync(0xffffffffu, acc[r][j], o);
            if (NORM) ss[j] += __shfl_xor_sync(0xffffffffu, ss[j], o);
        }
    if (split > 1) {
        if (lane == 0)
#pragma unroll
            for (int j = 0; j < M; j++) {
#pragma unroll
                for (int r = 0; r < kFmaR; r++) red[wi][r][j] = acc[r][j];
                red[wi][kFmaR][j] = ss[j];
            }
        __syncthreads();
        if (s != 0 || !valid) return;
        for (int q = 1; q < split; q++)
#pragma unroll
            for (int j = 0; j < M; j++) {
#pragma unroll
                for (int r = 0; r < kFmaR; r++) acc[r][j] += red[wi + q][r][j];
                ss[j] += red[wi + q][kFmaR][j];
            }
    }
    if (lane != 0) return;
#pragma unroll
    for (int j = 0; j < M; j++) {
        if (j >= m) break;
        if (NORM) {
            const float rstd = rsqrtf(ss[j] / (float)k + eps);
#pragma unroll
            for (int r = 0; r < kFmaR; r++) acc[r][j] *= rstd;
        }
        if constexpr (SWIGLU) {
            const float g = __bfloat162float(__float2bfloat16_rn(acc[0][j]));
            const float u = __bfloat162float(__float2bfloat16_rn(acc[1][j]));
            y[(size_t)j * ldy + n0] = __float2bfloat16_rn(swiglu_act(g, u));
        } else {
#pragma unroll
            for (int r = 0; r < kFmaR; r++) {
                const int nn = n0 + r;
                if (nn >= n) break;
                float v = acc[r][j];
                if (beta != 0.0f) v += beta * __bfloat162float(c[(size_t)j * ldc + nn]);
                y[(size_t)j * ldy + nn] = __float2bfloat16_rn(v);
            }
        }
    }
}

// DFLASH_GEMV_SPLIT=1 in the environment (read once): every call without the k split and no SwiGLU fold, the
// kernels before them (bench_decode's A/B switch).
bool fma_old()
{
    static int old = -1;
    return env_switch(&old, "DFLASH_GEMV_SPLIT", "1");
}

// The k split of a call: the power of two up to kWarps (and at most k's rounds) that minimises the waves of CTAs
// times the rounds a warp reads, the smallest of equals. On the H200 at one row (bench_decode's sweep,
// bench/RESULTS.md) the fastest were 4 for q|k|v (1536 CTAs in 3 waves, a round a warp; 16.2 us against 16.8 unsplit),
// 2 for o_proj and down_proj (512 CTAs, one wave: 12.2 / 27.1 us against 13.4 / 31.1), the split changing little for
// gate|up and lm_head (1 here): this model picks those. A function of the shape only (the bits do not depend on the
// device).
int fma_split(int units, int k)
{
    const long rounds = (k + kFmaRound - 1) / kFmaRound;
    int best = 1;
    long best_cost = -1;
    for (int s = 1; s <= kWarps && s <= rounds; s *= 2) {
        const long ctas = ((long)units * s + kWarps - 1) / kWarps;
        const long cost = (ctas + kFmaWave - 1) / kFmaWave * ((rounds + s - 1) / s);
        if (best_cost < 0 || cost < best_cost) best = s, best_cost = cost;
    }
    return best;
}

template <bool NORM, bool SWIGLU>
void launch_fma(__nv_bfloat16 *y, int ldy, const __nv_bfloat16 *c, int ldc, float beta, const __nv_bfloat16 *x,
                int ldx, const __nv_bfloat16 *nw, float eps, const __nv_bfloat16 *w, int m, int n, int k, int split,
                cudaStream_t st)
{
    const int units = SWIGLU ? n : (n + kFmaR - 1) / kFmaR, per = kWarps / split;
    const unsigned grid = (unsigned)((units + per - 1) / per);
    auto go = [&](auto kernel) {
        pdl::launch(kernel, dim3(grid), dim3(kWarps * 32), 0, st, y, ldy, c, ldc, beta, x, ldx, nw, eps, w, m, n, k,
                    split);
    };
    if (m <= 1) go(gemv_fma_kernel<1, NORM, SWIGLU>);
    else if (m <= 2) go(gemv_fma_kernel<2, NORM, SWIGLU>);
    else if (m <= 3) go(gemv_fma_kernel<3, NORM, SWIGLU>);
    else if (m <= 4) go(gemv_fma_kernel<4, NORM, SWIGLU>);
    else go(gemv_fma_kernel<8, NORM, SWIGLU>);
    CHECK_CUDA_LAUNCH();
}

} // namespace

extern "C" int gemv_cuda_takes(const uint16_t *x, int ldx, const uint16_t *w, int m, int n, int k)
{
    return m >= 1 && m <= GEMV_MAX_M && n >= 1 && k >= 1 && k % 8 == 0 && ldx % 8 == 0 && (uintptr_t)x % 16 == 0 &&
           (uintptr_t)w % 16 == 0;
}

extern "C" void gemv_forward_cuda_with(int kernel, uint16_t *y, int ldy, const uint16_t *c, int ldc, float beta,
                                       const uint16_t *x, int ldx, const uint16_t *w, int m, int n, int k,
                                       void *stream)
{
    const int fma = kernel == GEMV_KERNEL_FMA || kernel == GEMV_KERNEL_FMA_UNSPLIT;
    if (!gemv_cuda_takes(x, ldx, w, m, n, k) || (fma && m > GEMV_FMA_MAX_M) || kernel < 0 ||
        kernel > GEMV_KERNEL_FMA_UNSPLIT) {
        fprintf(stderr, "gemv_forward_cuda: kernel %d, m=%d (1..%d) n=%d k=%d ldx=%d (multiples of 8), x %p w %p "
                "(16-byte aligned) not taken\n", kernel, m, GEMV_MAX_M, n, k, ldx, (const void *)x, (const void *)w);
        abort();
    }
    if (kernel == GEMV_KERNEL_AUTO)
        kernel = m > GEMV_FMA_AUTO_M ? GEMV_KERNEL_MMA : fma_old() ? GEMV_KERNEL_FMA_UNSPLIT : GEMV_KERNEL_FMA;
    cudaStream_t st = (cudaStream_t)stream;
    const __nv_bfloat16 *cc = beta != 0.0f ? (const __nv_bfloat16 *)c : nullptr;
    __nv_bfloat16 *yy = (__nv_bfloat16 *)y;
    const __nv_bfloat16 *xx = (const __nv_bfloat16 *)x, *ww = (const __nv_bfloat16 *)w;
    if (kernel == GEMV_KERNEL_FMA || kernel == GEMV_KERNEL_FMA_UNSPLIT) {
        const int split = kernel == GEMV_KERNEL_FMA ? fma_split((n + kFmaR - 1) / kFmaR, k) : 1;
        launch_fma<false, false>(yy, ldy, cc, ldc, beta, xx, ldx, nullptr, 0.0f, ww, m, n, k, split, st);
        return;
    }
    const unsigned grid = (unsigned)((n + kRows - 1) / kRows);
    if (m <= 8)
        gemv_kernel<1><<<grid, kWarps * 32, 0, st>>>(yy, ldy, cc, ldc, beta, xx, ldx, ww, m, n, k);
    else
        gemv_kernel<2><<<grid, kWarps * 32, 0, st>>>(yy, ldy, cc, ldc, beta, xx, ldx, ww, m, n, k);
    CHECK_CUDA_LAUNCH();
}

extern "C" void gemv_fma_split_forward_cuda(int split, uint16_t *y, int ldy, const uint16_t *c, int ldc, float beta,
                                            const uint16_t *x, int ldx, const uint16_t *w, int m, int n, int k,
                                            void *stream)
{
    if (!gemv_cuda_takes(x, ldx, w, m, n, k) || m > GEMV_FMA_MAX_M || split < 1 || split > kWarps ||
        (split & (split - 1))) {
        fprintf(stderr, "gemv_fma_split_forward_cuda: split %d (1, 2, 4, 8), m=%d (1..%d) n=%d k=%d not taken\n", split,
                m, GEMV_FMA_MAX_M, n, k);
        abort();
    }
    launch_fma<false, false>((__nv_bfloat16 *)y, ldy, beta != 0.0f ? (const __nv_bfloat16 *)c : nullptr, ldc, beta,
                             (const __nv_bfloat16 *)x, ldx, nullptr, 0.0f, (const __nv_bfloat16 *)w, m, n, k, split,
                             (cudaStream_t)stream);
}

extern "C" void gemv_forward_cuda(uint16_t *y, int ldy, const uint16_t *c, int ldc, float beta, const uint16_t *x,
                                  int ldx, const uint16_t *w, int m, int n, int k, void *stream)
{
    gemv_forward_cuda_with(GEMV_KERNEL_AUTO, y, ldy, c, ldc, beta, x, ldx, w, m, n, k, stream);
}

extern "C" int gemv_rmsnorm_cuda_takes(const uint16_t *x, int ldx, const uint16_t *norm_w, const uint16_t *w, int m,
                                       int n, int k)
{
    return m <= GEMV_FMA_MAX_M && gemv_cuda_takes(x, ldx, w, m, n, k) && (uintptr_t)norm_w % 16 == 0;
}

extern "C" void gemv_rmsnorm_forward_cuda(uint16_t *y, int ldy, const uint16_t *c, int ldc, float beta,
                                          const uint16_t *x, int ldx, const uint16_t *norm_w, float eps,
                                          const uint16_t *w, int m, int n, int k, void *stream)
{
    if (!gemv_rmsnorm_cuda_takes(x, ldx, norm_w, w, m, n, k)) {
        fprintf(stderr, "gemv_rmsnorm_forward_cuda: m=%d (1..%d) n=%d k=%d ldx=%d (multiples of 8), x %p norm %p w %p "
                "(16-byte aligned) not taken\n", m, GEMV_FMA_MAX_M, n, k, ldx, (const void *)x, (const void *)norm_w,
                (const void *)w);
        abort();
    }
    const int split = fma_old() ? 1 : fma_split((n + kFmaR - 1) / kFmaR, k);
    launch_fma<true, false>((__nv_bfloat16 *)y, ldy, beta != 0.0f ? (const __nv_bfloat16 *)c : nullptr, ldc, beta,
                            (const __nv_bfloat16 *)x, ldx, (const __nv_bfloat16 *)norm_w, eps,
                            (const __nv_bfloat16 *)w, m, n, k, split, (cudaStream_t)stream);
}

extern "C" int gemv_rmsnorm_swiglu_cuda_takes(const uint16_t *x, int ldx, const uint16_t *norm_w, const uint16_t *w_gu,
                                              int m, int n, int k, int ldy)
{
    return !fma_old() && gemv_rmsnorm_cuda_takes(x, ldx, norm_w, w_gu, m, 2 * n, k) && ldy >= n;
}

extern "C" void gemv_rmsnorm_swiglu_forward_cuda(uint16_t *y, int ldy, const uint16_t *x, int ldx,
                                                 const uint16_t *norm_w, float eps, const uint16_t *w_gu, int m,
                                                 int n, int k, void *stream)
{
    if (!gemv_rmsnorm_swiglu_cuda_takes(x, ldx, norm_w, w_gu, m, n, k, ldy)) {
        fprintf(stderr, "gemv_rmsnorm_swiglu_forward_cuda: m=%d (1..%d) n=%d k=%d ldx=%d (multiples of 8) ldy=%d, "
                "x %p norm %p w %p (16-byte aligned) not taken%s\n", m, GEMV_FMA_MAX_M, n, k, ldx, ldy,
                (const void *)x, (const void *)norm_w, (const void *)w_gu,
                fma_old() ? " (DFLASH_GEMV_SPLIT=1: the fold is off)" : "");
        abort();
    }
    // the split of the gate|up GEMV of 2n rows (n row pairs), so that the bits are those of the unfolded path
    launch_fma<true, true>((__nv_bfloat16 *)y, ldy, nullptr, 0, 0.0f, (const __nv_bfloat16 *)x, ldx,
                           (const __nv_bfloat16 *)norm_w, eps, (const __nv_bfloat16 *)w_gu, m, n, k, fma_split(n, k),
                           (cudaStream_t)stream);
}
