// adamw: CUDA optimizer over the flat fp32 state; the gradient is read as fp32(grad · grad_scale) in both passes, as
// the CPU reducer scales its summed gradient. grad_sq_sum_cuda: one pass over the gradient, each thread sums its
// fixed share in double, blocks reduce in a fixed tree into workspace partials, one block sums those in order (no
// atomics: the same bits every run). adamw_apply_cuda: one pass over w, m, v, grad; every thread reads the device
// Σg² itself, forms the clip coefficient and the NaN guard, and applies adamw_step_cpu's operations in its order with
// explicitly rounded intrinsics (no FMA contraction), so a step matches the CPU reference bit for bit given the same
// coefficient. The scalar factors (bias corrections, decay) are computed on the host exactly as the CPU does.
#include <cuda_bf16.h>
#include <cstdint>

#include "adamw.h"
#include "cuda_check.h"

#define GSQ_THREADS 256
#define GSQ_MAX_BLOCKS 1024

// Sum of a double over the block (blockDim.x a multiple of 32, at most 1024), valid in thread 0; fixed order.
static __device__ double gsq_block_sum(double v)
{
    __shared__ double warp_sums[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    if (warp != 0) return 0.0;
    v = lane < nwarps ? warp_sums[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <int VEC>
static __global__ void grad_sq_partial_kernel(double *part, const float *grad, size_t n, float scale)
{
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nthreads = (size_t)gridDim.x * blockDim.x;
    double acc = 0.0;
    if (VEC == 4) {
        const float4 *g4 = reinterpret_cast<const float4 *>(grad);
        const size_t n4 = n / 4;
        for (size_t i = tid; i < n4; i += nthreads) {
            float4 g = g4[i];
            float a = __fmul_rn(g.x, scale), b = __fmul_rn(g.y, scale), c = __fmul_rn(g.z, scale),
                  d = __fmul_rn(g.w, scale);
            acc += (double)a * a;
            acc += (double)b * b;
            acc += (double)c * c;
            acc += (double)d * d;
        }
        if (tid < n - n4 * 4) {
            float a = __fmul_rn(grad[n4 * 4 + tid], scale);
            acc += (double)a * a;
        }
    } else {
        for (size_t i = tid; i < n; i += nthreads) {
            float a = __fmul_rn(grad[i], scale);
            acc += (double)a * a;
        }
    }
    acc = gsq_block_sum(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

static __global__ void grad_sq_final_kernel(double *sq_sum, const double *part, int nparts)
{
    double v = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) v += part[i];
    v = gsq_block_sum(v);
    if (threadIdx.x == 0) *sq_sum = v;
}

static int gsq_blocks(size_t n)
{
    size_t b = (n + (size_t)GSQ_THREADS * 16 - 1) / ((size_t)GSQ_THREADS * 16);
    return b < 1 ? 1 : b > GSQ_MAX_BLOCKS ? GSQ_MAX_BLOCKS : (int)b;
}

extern "C" size_t grad_sq_sum_cuda_workspace(size_t n) { return (size_t)gsq_blocks(n) * sizeof(double); }

extern "C" void grad_sq_sum_cuda(double *sq_sum, const float *grad, size_t n, float grad_scale, void *workspace,
                                 void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    const int blocks = gsq_blocks(n);
    double *part = (double *)workspace;
    if ((uintptr_t)grad % 16 == 0)
        grad_sq_partial_kernel<4><<<blocks, GSQ_THREADS, 0, st>>>(part, grad, n, grad_scale);
    else
        grad_sq_partial_kernel<1><<<blocks, GSQ_THREADS, 0, st>>>(part, grad, n, grad_scale);
    CHECK_CUDA_LAUNCH();
    grad_sq_final_kernel<<<1, 1024, 0, st>>>(sq_sum, part, blocks);
    CHECK_CUDA_LAUNCH();
}

// The host-computed scalars of one step (adamw_step_cpu's, rounded to float where it rounds them).
struct adamw_consts {
    float step_size, bc2_sqrt, w1, w2, one_minus_w1, b2f, eps, keep, clip, grad_scale;
    int do_decay;
};

// Index of the range holding element i (sorted table), or -1.
static __device__ __forceinline__ int adamw_range_find(const adamw_range *r, int nr, size_t i)
{
    int lo = 0, hi = nr - 1, found = -1;
    while (lo <= hi) { // last range with offset <= i
        int mid = (lo + hi) >> 1;
        if (r[mid].offset <= i) found = mid, lo = mid + 1;
        else hi = mid - 1;
    }
    return found;
}

static __device__ __forceinline__ int adamw_decay_at(const adamw_range *r, int nr, int *cur, size_t i)
{
    while (*cur + 1 < nr && r[*cur + 1].offset <= i) ++*cur;
    return *cur >= 0 && i < r[*cur].offset + r[*cur].numel && r[*cur].decay;
}

// adamw_step_cpu for one element, op by op with round-to-nearest intrinsics (nvcc would contract a*b+c into FMAs).
static __device__ __forceinline__ void adamw_elem(const adamw_consts &c, float coef, int decay, float grad, float *w,
                                                  float *m, float *v)
{
    float x = *w;
    if (decay) x = __fmul_rn(x, c.keep);
    const float g = __fmul_rn(__fmul_rn(grad, c.grad_scale), coef);
    const float mi = fabsf(c.w1) < 0.5f ? __fadd_rn(*m, __fmul_rn(c.w1, __fsub_rn(g, *m)))
                                        : __fsub_rn(g, __fmul_rn(__fsub_rn(g, *m), c.one_minus_w1));
    const float vi = __fadd_rn(__fmul_rn(*v, c.b2f), __fmul_rn(__fmul_rn(c.w2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
    x = __fadd_rn(x, __fmul_rn(-c.step_size, __fdiv_rn(mi, denom)));
    *w = x, *m = mi, *v = vi;
}

template <int VEC>
static __global__ void adamw_apply_kernel(float *w_dst, float *m_dst, float *v_dst, __nv_bfloat16 *w_bf16,
                                          const float *w_src, const float *m_src, const float *v_src,
                                          const float *grad, size_t n, const adamw_range *ranges, int nranges,
                                          const double *sq_sum, const float *loss, adamw_consts c, int *skipped)
{
    // grad_clip_coef and the guard, in every thread from the same device values
    const double norm = sqrt(*sq_sum);
    const bool skip = !isfinite(norm) || (loss && !isfinite(*loss));
    float coef = 1.0f;
    if (c.clip > 0.0f) {
        double q = (double)c.clip / (norm + 1e-6);
        coef = q < 1.0 ? (float)q : 1.0f;
    }
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nthreads = (size_t)gridDim.x * blockDim.x;
    if (tid == 0 && skipped) *skipped = skip ? 1 : 0;
    const bool store_state = !skip || w_dst != w_src || m_dst != m_src || v_dst != v_src;
    const size_t nv = n / VEC;
    for (size_t i = tid; i < nv; i += nthreads) {
        float wv[VEC], mv[VEC], vv[VEC], gv[VEC];
        if (VEC == 4) {
            *reinterpret_cast<float4 *>(wv) = reinterpret_cast<const float4 *>(w_src)[i];
            *reinterpret_cast<float4 *>(mv) = reinterpret_cast<const float4 *>(m_src)[i];
            *reinterpret_cast<float4 *>(vv) = reinterpret_cast<const float4 *>(v_src)[i];
            if (!skip) *reinterpret_cast<float4 *>(gv) = reinterpret_cast<const float4 *>(grad)[i];
        } else {
            wv[0] = w_src[i], mv[0] = m_src[i], vv[0] = v_src[i];
            if (!skip) gv[0] = grad[i];
        }
        if (!skip) {
            int cur = c.do_decay ? adamw_range_find(ranges, nranges, i * VEC) : -1;
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                int dec = c.do_decay && adamw_decay_at(ranges, nranges, &cur, i * VEC + e);
                adamw_elem(c, coef, dec, gv[e], &wv[e], &mv[e], &vv[e]);
            }
        }
        if (store_state) {
            if (VEC == 4) {
                reinterpret_cast<float4 *>(w_dst)[i] = *reinterpret_cast<float4 *>(wv);
                reinterpret_cast<float4 *>(m_dst)[i] = *reinterpret_cast<float4 *>(mv);
                reinterpret_cast<float4 *>(v_dst)[i] = *reinterpret_cast<float4 *>(vv);
            } else {
                w_dst[i] = wv[0], m_dst[i] = mv[0], v_dst[i] = vv[0];
            }
        }
        if (VEC == 4) {
            __nv_bfloat162 b[2] = {__floats2bfloat162_rn(wv[0], wv[1]), __floats2bfloat162_rn(wv[2], wv[3])};
            reinterpret_cast<uint2 *>(w_bf16)[i] = *reinterpret_cast<uint2 *>(b);
        } else {
            w_bf16[i] = __float2bfloat16_rn(wv[0]);
        }
    }
    if (VEC > 1 && tid < n - nv * VEC) { // the last n % VEC elements, one per thread
        size_t i = nv * VEC + tid;
        float wv = w_src[i], mv = m_src[i], vv = v_src[i];
        if (!skip) {
            int cur = c.do_decay ? adamw_range_find(ranges, nranges, i) : -1;
            int dec = c.do_decay && adamw_decay_at(ranges, nranges, &cur, i);
            adamw_elem(c, coef, dec, grad[i], &wv, &mv, &vv);
        }
        if (store_state) w_dst[i] = wv, m_dst[i] = mv, v_dst[i] = vv;
        w_bf16[i] = __float2bfloat16_rn(wv);
    }
}

extern "C" void adamw_apply_cuda(float *w_dst, float *m_dst, float *v_dst, uint16_t *w_bf16, const float *w_src,
                                 const float *m_src, const float *v_src, const float *grad, float grad_scale,
                                 size_t n, const adamw_range *ranges, int nranges, const double *sq_sum,
                                 const float *loss, float clip, const adamw_params *p, long step, int *skipped,
                                 void *stream)
{
    if (step < 1) {
        fprintf(stderr, "adamw_apply_cuda: step %ld (1-based)\n", step);
        exit(1);
    }
    // the scalars exactly as adamw_step_cpu forms them
    const double lr = p->lr, b1 = p->beta1, b2 = p->beta2;
    const double bc1 = 1.0 - pow(b1, (double)step), bc2 = 1.0 - pow(b2, (double)step);
    adamw_consts c;
    c.step_size = (float)(lr / bc1);
    c.bc2_sqrt = (float)sqrt(bc2);
    c.w1 = (float)(1.0 - b1), c.w2 = (float)(1.0 - b2), c.b2f = p->beta2, c.eps = p->eps;
    c.one_minus_w1 = 1.0f - c.w1;
    c.keep = (float)(1.0 - lr * (double)p->weight_decay);
    c.do_decay = p->weight_decay != 0.0f && ranges && nranges > 0;
    c.clip = clip;
    c.grad_scale = grad_scale;
    if (n == 0) return;
    cudaStream_t st = (cudaStream_t)stream;
    const int threads = 256;
    const bool vec = ((uintptr_t)w_dst | (uintptr_t)m_dst | (uintptr_t)v_dst | (uintptr_t)w_src | (uintptr_t)m_src |
                      (uintptr_t)v_src | (uintptr_t)grad) % 16 == 0 &&
                     (uintptr_t)w_bf16 % 8 == 0;
    size_t items = vec ? n / 4 : n;
    size_t blocks = (items + threads - 1) / threads, cap = 132 * 16;
    unsigned grid = (unsigned)(blocks < 1 ? 1 : blocks < cap ? blocks : cap);
    if (vec)
        adamw_apply_kernel<4><<<grid, threads, 0, st>>>(w_dst, m_dst, v_dst, (__nv_bfloat16 *)w_bf16, w_src, m_src,
                                                        v_src, grad, n, ranges, nranges, sq_sum, loss, c, skipped);
    else
        adamw_apply_kernel<1><<<grid, threads, 0, st>>>(w_dst, m_dst, v_dst, (__nv_bfloat16 *)w_bf16, w_src, m_src,
                                                        v_src, grad, n, ranges, nranges, sq_sum, loss, c, skipped);
    CHECK_CUDA_LAUNCH();
}
