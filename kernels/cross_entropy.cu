// cross_entropy: CUDA loss head over a frozen lm_head. Per chunk of C rows:
//   1. logits (C, V; ld L) fp32 = h · lm_headᵀ                     (cuBLASLt, bf16 in, fp32 accumulate and out)
//   2. one block per row: online max / Σexp, argmax, CE; lse kept per row
//   3. (backward) the same row overwritten in place by bf16 G = (softmax - onehot)·w·loss_scale, ld 2L in bf16
//      elements: G's element k sits at byte 2k of a row whose fp32 element k sits at byte 4k, so writing a tile
//      only touches bytes already read (one barrier per tile between the reads and the writes)
//   4. (backward) dh (C, H) bf16 = G · lm_head                         (cuBLASLt, K = V)
// then Σ w·CE over all n rows by one block in a fixed order. fp32 logits because bf16 ones would cost ~2^-9·|x| in
// the label's logit, far above the CE accuracy wanted; the bf16 G is what the second GEMM needs anyway.
// Column-major view for cuBLASLt: row-major (r, c; ld) is column-major (c, r; ld).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cross_entropy.h"
#include "cuda_check.h"

namespace {

constexpr int kChunkRows = 1024;
constexpr int kRowThreads = 512;
constexpr size_t kLtWorkspace = (size_t)32 << 20;
constexpr int kMaxGemms = 32;
constexpr float kLog2e = 1.4426950408889634f;

enum { GEMM_LOGITS = 0, GEMM_DH = 1 };

struct gemm_key {
    int which, m, ld; // ld: ldh for GEMM_LOGITS, lddh for GEMM_DH
};

struct gemm_entry {
    gemm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};

} // namespace

struct cross_entropy_cuda_ctx {
    int H, V, chunk, ldl; // ldl: row stride of the fp32 logits (multiple of 64)
    float *logits;        // (chunk, ldl) fp32; the bf16 G overwrites it with row stride 2·ldl
    float *lse;           // (chunk)
    void *lt_ws;
    cublasLtHandle_t lt;
    int ngemms;
    gemm_entry gemms[kMaxGemms];
};

static void ce_fail(const char *what)
{
    fprintf(stderr, "cross_entropy_cuda: %s\n", what);
    fflush(stderr);
    exit(1);
}

extern "C" cross_entropy_cuda_ctx *cross_entropy_cuda_create(int max_rows, int H, int V, int chunk_rows)
{
    if (max_rows <= 0 || H <= 0 || V <= 0 || H % 8 || chunk_rows < 0)
        ce_fail("create needs max_rows > 0, V > 0, H > 0, H % 8 == 0 and chunk_rows >= 0");
    if (chunk_rows == 0) chunk_rows = kChunkRows;
    cross_entropy_cuda_ctx *c = (cross_entropy_cuda_ctx *)calloc(1, sizeof *c);
    if (!c) ce_fail("out of host memory");
    c->H = H, c->V = V;
    c->chunk = max_rows < chunk_rows ? max_rows : chunk_rows;
    c->ldl = (V + 63) / 64 * 64;
    CHECK_CUDA(cudaMalloc(&c->logits, (size_t)c->chunk * c->ldl * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&c->lse, (size_t)c->chunk * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&c->lt_ws, kLtWorkspace));
    CHECK_CUBLAS(cublasLtCreate(&c->lt));
    return c;
}

static void gemm_entry_free(gemm_entry *e)
{
    cublasLtMatrixLayoutDestroy(e->la);
    cublasLtMatrixLayoutDestroy(e->lb);
    cublasLtMatrixLayoutDestroy(e->lc);
    cublasLtMatmulDescDestroy(e->desc);
}

extern "C" void cross_entropy_cuda_destroy(cross_entropy_cuda_ctx **cp)
{
    cross_entropy_cuda_ctx *c = *cp;
    if (!c) return;
    for (int i = 0; i < c->ngemms; i++) gemm_entry_free(&c->gemms[i]);
    CHECK_CUBLAS(cublasLtDestroy(c->lt));
    CHECK_CUDA(cudaFree(c->logits));
    CHECK_CUDA(cudaFree(c->lse));
    CHECK_CUDA(cudaFree(c->lt_ws));
    free(c);
    *cp = NULL;
}

extern "C" size_t cross_entropy_cuda_workspace_bytes(const cross_entropy_cuda_ctx *c)
{
    return (size_t)c->chunk * c->ldl * sizeof(float) + (size_t)c->chunk * sizeof(float) + kLtWorkspace;
}

// GEMM_LOGITS: logitsᵀ (V, m; ldl) fp32 = lm_head (col-major (H, V); ld H)ᵀ · hᵀ (col-major (H, m); ld).
// GEMM_DH:     dhᵀ (H, m; ld) bf16 = lm_head (col-major (H, V); ld H) · Gᵀ (col-major (V, m); ld 2·ldl).
// Every operand is 16-byte aligned with ld % 8 == 0 (checked by the caller), so the alignment is no key.
static void gemm_entry_init(cross_entropy_cuda_ctx *c, gemm_entry *e, const gemm_key &key)
{
    e->key = key;
    const uint64_t H = (uint64_t)c->H, V = (uint64_t)c->V, m = (uint64_t)key.m;
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&e->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = key.which == GEMM_LOGITS ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->la, CUDA_R_16BF, H, V, (int64_t)H));
    if (key.which == GEMM_LOGITS) {
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->lb, CUDA_R_16BF, H, m, key.ld));
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->lc, CUDA_R_32F, V, m, c->ldl));
    } else {
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->lb, CUDA_R_16BF, V, m, 2 * (int64_t)c->ldl));
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->lc, CUDA_R_16BF, H, m, key.ld));
    }
    cublasLtMatmulPreference_t pref;
    CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = kLtWorkspace;
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    uint32_t al = 16;
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al));
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(c->lt, e->desc, e->la, e->lb, e->lc, e->lc, pref, 1, &res, &nres));
    cublasLtMatmulPreferenceDestroy(pref);
    if (nres < 1) {
        fprintf(stderr, "cross_entropy_cuda: cuBLASLt has no algorithm for %s m=%d H=%d V=%d ld=%d\n",
                key.which == GEMM_LOGITS ? "logits" : "dh", key.m, c->H, c->V, key.ld);
        exit(1);
    }
    e->algo = res.algo;
}

static void gemm_run(cross_entropy_cuda_ctx *c, int which, int m, int ld, const void *a, const void *b, void *d,
                     cudaStream_t stream)
{
    gemm_key key = {which, m, ld};
    gemm_entry *e = NULL, tmp;
    for (int i = 0; i < c->ngemms && !e; i++)
        if (!memcmp(&c->gemms[i].key, &key, sizeof key)) e = &c->gemms[i];
    int transient = 0;
    if (!e) {
        if (c->ngemms < kMaxGemms) e = &c->gemms[c->ngemms++];
        else e = &tmp, transient = 1;
        gemm_entry_init(c, e, key);
    }
    const float alpha = 1.0f, beta = 0.0f;
    CHECK_CUBLAS(cublasLtMatmul(c->lt, e->desc, &alpha, a, e->la, b, e->lb, &beta, d, e->lc, d, e->lc, &e->algo,
                                c->lt_ws, kLtWorkspace, stream));
    if (transient) gemm_entry_free(e);
}

// Running (max, Σ exp(x - max)) and (best value, lowest index) of one thread's slice.
struct row_stat {
    float m, s, bv;
    int bi;
};

static __device__ __forceinline__ void stat_merge(row_stat &a, const row_stat &b)
{
    const float M = fmaxf(a.m, b.m);
    if (M == -INFINITY) {
        a.s = 0.0f;
    } else {
        a.s = a.s * exp2f((a.m - M) * kLog2e) + b.s * exp2f((b.m - M) * kLog2e);
        a.m = M;
    }
    if (b.bv > a.bv || (b.bv == a.bv && b.bi < a.bi)) a.bv = b.bv, a.bi = b.bi;
}

// Four consecutive elements starting at index i (in increasing index order, so strict > keeps the lowest index).
static __device__ __forceinline__ void stat_add4(row_stat &t, float4 v, int i)
{
    const float m4 = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
    if (m4 > t.m) {
        t.s *= exp2f((t.m - m4) * kLog2e);
        t.m = m4;
    }
    t.s += exp2f((v.x - t.m) * kLog2e) + exp2f((v.y - t.m) * kLog2e) + exp2f((v.z - t.m) * kLog2e) +
           exp2f((v.w - t.m) * kLog2e);
    if (v.x > t.bv) t.bv = v.x, t.bi = i;
    if (v.y > t.bv) t.bv = v.y, t.bi = i + 1;
    if (v.z > t.bv) t.bv = v.z, t.bi = i + 2;
    if (v.w > t.bv) t.bv = v.w, t.bi = i + 3;
}

// Pass 1, one block of kRowThreads per row r of the chunk (global row r0 + r). Thread j takes vectors j, j + T,
// ...: a fixed assignment and a fixed reduction tree, so the result does not depend on timing.
static __global__ void __launch_bounds__(kRowThreads) ce_stats_kernel(
    float *ce, int32_t *argmax, float *lse_out, const float *logits, int ldl, int V, const int32_t *labels,
    const float *weights)
{
    const int r = blockIdx.x;
    const float *row = logits + (size_t)r * ldl;
    const float4 *row4 = reinterpret_cast<const float4 *>(row);
    const int V4 = V / 4;
    row_stat t = {-INFINITY, 0.0f, -INFINITY, 0x7fffffff};
    int i = threadIdx.x;
    for (; i + kRowThreads < V4; i += 2 * kRowThreads) { // two loads in flight per thread
        const float4 a = row4[i], b = row4[i + kRowThreads];
        stat_add4(t, a, 4 * i);
        stat_add4(t, b, 4 * (i + kRowThreads));
    }
    if (i < V4) stat_add4(t, row4[i], 4 * i);
    for (int k = 4 * V4 + threadIdx.x; k < V; k += kRowThreads) {
        const float x = row[k];
        row_stat one = {x, 1.0f, x, k};
        stat_merge(t, one);
    }
    for (int o = 16; o > 0; o >>= 1) {
        row_stat u;
        u.m = __shfl_xor_sync(0xffffffffu, t.m, o);
        u.s = __shfl_xor_sync(0xffffffffu, t.s, o);
        u.bv = __shfl_xor_sync(0xffffffffu, t.bv, o);
        u.bi = __shfl_xor_sync(0xffffffffu, t.bi, o);
        stat_merge(t, u);
    }
    __shared__ row_stat warp_stat[kRowThreads / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_stat[warp] = t;
    __syncthreads();
    if (warp != 0) return;
    t = lane < kRowThreads / 32 ? warp_stat[lane] : row_stat{-INFINITY, 0.0f, -INFINITY, 0x7fffffff};
    for (int o = 16; o > 0; o >>= 1) {
        row_stat u;
        u.m = __shfl_xor_sync(0xffffffffu, t.m, o);
        u.s = __shfl_xor_sync(0xffffffffu, t.s, o);
        u.bv = __shfl_xor_sync(0xffffffffu, t.bv, o);
        u.bi = __shfl_xor_sync(0xffffffffu, t.bi, o);
        stat_merge(t, u);
    }
    if (lane != 0) return;
    const float lse = t.m + logf(t.s);
    const float w = weights[r];
    const int lab = labels[r];
    float c = 0.0f;
    if (w != 0.0f) c = (lab >= 0 && lab < V) ? lse - row[lab] : NAN;
    ce[r] = c;
    if (argmax) argmax[r] = t.bi == 0x7fffffff ? 0 : t.bi;
    lse_out[r] = lse;
}

static __device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&p);
}

// Pass 2, one block per row: G[k] = bf16((exp(x_k - lse) - [k == label])·w·loss_scale) written over the row's own
// logits (bf16 row r at byte offset r·4·ldl). Every thread walks the same number of tiles (the barrier inside is
// uniform); the tile's reads all finish before its writes, which land at lower byte offsets than any unread data.
static __global__ void __launch_bounds__(kRowThreads) ce_grad_kernel(float *logits, int ldl, int V,
                                                                     const float *lse_in, const int32_t *labels,
                                                                     const float *weights, float loss_scale)
{
    const int r = blockIdx.x;
    float *row = logits + (size_t)r * ldl;
    const float4 *row4 = reinterpret_cast<const float4 *>(row);
    uint16_t *g = reinterpret_cast<uint16_t *>(row);
    uint2 *g4 = reinterpret_cast<uint2 *>(row);
    const float w = weights[r];
    const float gs = w * loss_scale;
    const int lab = labels[r];
    const float lse = lse_in[r];
    const int V4 = V / 4;
    for (int base = 0; base < V4; base += 2 * kRowThreads) {
        const int i0 = base + threadIdx.x, i1 = i0 + kRowThreads;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
        if (i0 < V4) a = row4[i0];
        if (i1 < V4) b = row4[i1];
        __syncthreads();
        if (w == 0.0f) {
            if (i0 < V4) g4[i0] = make_uint2(0u, 0u);
            if (i1 < V4) g4[i1] = make_uint2(0u, 0u);
            continue;
        }
        float pa[4] = {a.x, a.y, a.z, a.w}, pb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            pa[q] = (exp2f((pa[q] - lse) * kLog2e) - (4 * i0 + q == lab ? 1.0f : 0.0f)) * gs;
            pb[q] = (exp2f((pb[q] - lse) * kLog2e) - (4 * i1 + q == lab ? 1.0f : 0.0f)) * gs;
        }
        if (i0 < V4) g4[i0] = make_uint2(pack_bf16x2(pa[0], pa[1]), pack_bf16x2(pa[2], pa[3]));
        if (i1 < V4) g4[i1] = make_uint2(pack_bf16x2(pb[0], pb[1]), pack_bf16x2(pb[2], pb[3]));
    }
    if (4 * V4 < V) { // the last V % 4 elements
        const int k = 4 * V4 + threadIdx.x;
        float x = 0.0f;
        if (k < V) x = row[k];
        __syncthreads();
        if (k < V) {
            const float v = w == 0.0f ? 0.0f : (exp2f((x - lse) * kLog2e) - (k == lab ? 1.0f : 0.0f)) * gs;
            const __nv_bfloat16 bv = __float2bfloat16_rn(v);
            g[k] = *reinterpret_cast<const uint16_t *>(&bv);
        }
    }
}

// Σ weight·CE over n rows in double: thread j sums rows j, j + T, ...; then a fixed tree.
static __global__ void ce_sum_kernel(double *out, const float *ce, const float *weights, int n)
{
    __shared__ double part[256];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += 256) s += (double)weights[i] * (double)ce[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) part[threadIdx.x] += part[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = part[0];
}

extern "C" void cross_entropy_cuda(cross_entropy_cuda_ctx *c, float *ce, int32_t *argmax, double *wce_sum,
                                   uint16_t *dh, int lddh, const uint16_t *h, int ldh, const uint16_t *lm_head,
                                   const int32_t *labels, const float *weights, float loss_scale, int n,
                                   void *stream_)
{
    cudaStream_t stream = (cudaStream_t)stream_;
    if (n < 0) ce_fail("n < 0");
    if ((uintptr_t)h % 16 || (uintptr_t)lm_head % 16 || ldh % 8 || ldh < c->H)
        ce_fail("h and lm_head must be 16-byte aligned, ldh >= H and ldh % 8 == 0");
    if (dh && ((uintptr_t)dh % 16 || lddh % 8 || lddh < c->H))
        ce_fail("dh must be 16-byte aligned, lddh >= H and lddh % 8 == 0");
    for (int r0 = 0; r0 < n; r0 += c->chunk) {
        const int m = n - r0 < c->chunk ? n - r0 : c->chunk;
        gemm_run(c, GEMM_LOGITS, m, ldh, lm_head, h + (size_t)r0 * ldh, c->logits, stream);
        ce_stats_kernel<<<m, kRowThreads, 0, stream>>>(ce + r0, argmax ? argmax + r0 : NULL, c->lse, c->logits,
                                                       c->ldl, c->V, labels + r0, weights + r0);
        CHECK_CUDA_LAUNCH();
        if (!dh) continue;
        ce_grad_kernel<<<m, kRowThreads, 0, stream>>>(c->logits, c->ldl, c->V, c->lse, labels + r0, weights + r0,
                                                      loss_scale);
        CHECK_CUDA_LAUNCH();
        gemm_run(c, GEMM_DH, m, lddh, lm_head, c->logits, dh + (size_t)r0 * lddh, stream);
    }
    if (wce_sum) {
        ce_sum_kernel<<<1, 256, 0, stream>>>(wce_sum, ce, weights, n);
        CHECK_CUDA_LAUNCH();
    }
}
