// cross_entropy: CUDA loss head over a frozen lm_head. Per chunk of C rows (optionally the rows a list names,
// gathered into a compact chunk first, so rows that carry no loss cost nothing):
//   1. logits (C, V; ld L) fp32 = h · lm_headᵀ                     (cuBLASLt, bf16 in, fp32 accumulate and out)
//   2. one thread-block cluster per row, each block holding a slice of the row in shared memory (read from HBM
//      once): max / Σexp / argmax per block, merged in block order through distributed shared memory into lse and
//      CE; then (backward) each block writes bf16 G = (softmax - onehot)·w·loss_scale over the row, in place at row
//      stride 2L in bf16 elements (G's element k sits at byte 2k of a row whose fp32 element k sits at byte 4k: the
//      writes land on bytes that every block of the cluster has read before the cluster barrier)
//   3. (backward) dh (C, H) bf16 = G · lm_head                         (cuBLASLt, K = V)
// Two logits buffers and a second stream (overlap level 2, the default): the logits GEMMs run in order on the
// caller's stream, the row kernel and dh GEMM of chunk i on the side stream beside the logits GEMM of chunk i + 1, so
// the pass bound by HBM overlaps work bound by the tensor cores, and the SMs one GEMM's last wave leaves idle (the dh
// GEMM of a chunk is one wave of 128 tiles on 132 SMs, of a half chunk 64) take the other's tiles. Level 1: only the
// row kernels on the side stream; 0: one stream. Events order the streams; the bits do not depend on the level.
// Then Σ w·CE over all n rows by one block in a fixed order. fp32 logits because bf16 ones would cost ~2^-9·|x| in
// the label's logit, far above the CE accuracy wanted; the bf16 G is what the second GEMM needs anyway.
// Column-major view for cuBLASLt: row-major (r, c; ld) is column-major (c, r; ld).
#include <cooperative_groups.h>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cross_entropy.h"
#include "matmul.h"
#include "cuda_check.h"

namespace cg = cooperative_groups;

namespace {

constexpr int kChunkRows = 1024;
constexpr int kRowThreads = 512;
constexpr size_t kLtWorkspace = (size_t)32 << 20;
constexpr int kMaxGemms = 32;
constexpr int kCandidates = 8;                      // heuristic answers asked for
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMaxCluster = 8;                      // the portable cluster size
constexpr size_t kSliceWanted = (size_t)80 << 10;   // a slice this small lets two blocks share an SM
constexpr size_t kSliceMax = (size_t)200 << 10;     // under the 227 KiB a block may have

enum { GEMM_LOGITS = 0, GEMM_DH = 1 };

struct gemm_key {
    int which, m, ld; // ld: of h (or the gathered chunk) for GEMM_LOGITS, of dh (or the compact chunk) for GEMM_DH
};

struct gemm_entry {
    gemm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};

} // namespace

struct cross_entropy_cuda_ctx {
    int H, V, chunk, ldl;  // ldl: row stride of the fp32 logits (multiple of 64)
    int cl, sv;            // blocks per row cluster, float4 vectors of the row per block
    int overlap;           // 0: one stream; 1: row kernels on the side stream; 2: row kernels and dh GEMMs
    float *logits[2];      // (chunk, ldl) fp32 each; the bf16 G overwrites it with row stride 2·ldl
    uint16_t *hc[2], *dhc; // (chunk, H) bf16: gathered rows of h, compact dh rows (row list only)
    void *lt_ws[2];        // cuBLASLt workspace of the caller's stream, of the side stream
    cublasLtHandle_t lt;
    cudaStream_t side;
    cudaEvent_t ev_gemm[2], ev_rows[2]; // per buffer: its logits GEMM done; its side-stream work done
    int ngemms;
    gemm_entry gemms[kMaxGemms];
};

static void ce_fail(const char *what)
{
    fprintf(stderr, "cross_entropy_cuda: %s\n", what);
    fflush(stderr);
    exit(1);
}

// Running (max, Σ exp(x - max)) and (best value, lowest index) of one thread's slice.
struct row_stat {
    float m, s, bv;
    int bi;
};

static __device__ __forceinline__ row_stat stat_empty() { return row_stat{-INFINITY, 0.0f, -INFINITY, 0x7fffffff}; }

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

static __device__ __forceinline__ row_stat stat_shfl(const row_stat &t, int o)
{
    row_stat u;
    u.m = __shfl_xor_sync(0xffffffffu, t.m, o);
    u.s = __shfl_xor_sync(0xffffffffu, t.s, o);
    u.bv = __shfl_xor_sync(0xffffffffu, t.bv, o);
    u.bi = __shfl_xor_sync(0xffffffffu, t.bi, o);
    return u;
}

// The block's merged stat, valid in thread 0: a fixed tree (warps by shuffles, then warp 0 over the warps).
static __device__ row_stat stat_block(row_stat t)
{
    __shared__ row_stat warp_stat[kRowThreads / 32];
    for (int o = 16; o > 0; o >>= 1) stat_merge(t, stat_shfl(t, o));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_stat[warp] = t;
    __syncthreads();
    t = stat_empty();
    if (warp == 0) {
        if (lane < kRowThreads / 32) t = warp_stat[lane];
        for (int o = 16; o > 0; o >>= 1) stat_merge(t, stat_shfl(t, o));
    }
    return t;
}

static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

static __device__ __forceinline__ void cp_async_wait_all()
{
    asm volatile("cp.async.commit_group;\ncp.async.wait_all;\n" ::: "memory");
}

static __device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&p);
}

// One cluster of cl blocks per row r of the chunk (global row q = rows[r], or r0 + r without a list); block b of
// the cluster owns float4 vectors [b·sv, (b+1)·sv) of the row, the last block also the V % 4 scalar tail. Each
// thread takes vectors j, j + T, ... of its block's slice: fixed assignments and fixed reduction trees, so the result
// does not depend on timing. ce (0 where weight == 0; NaN for a weighted row whose label is outside [0, V)) and
// argmax land at q; with write_g the row's G overwrites its logits.
static __global__ void __launch_bounds__(kRowThreads) ce_row_kernel(
    float *ce, int32_t *argmax, float *logits, int ldl, int V, int sv, const int32_t *labels, const float *weights,
    const int32_t *rows, int r0, float loss_scale, int write_g)
{
    extern __shared__ float4 slice[];
    __shared__ row_stat bstat;
    __shared__ float row_lse;
    cg::cluster_group cluster = cg::this_cluster();
    const int cl = (int)cluster.num_blocks(), b = (int)cluster.block_rank();
    const int r = blockIdx.x / cl, q = rows ? rows[r] : r0 + r;
    float *row = logits + (size_t)r * ldl;
    const int V4 = V / 4, v0 = b * sv, nv = max(min(v0 + sv, V4) - v0, 0);
    const float4 *src = reinterpret_cast<const float4 *>(row) + v0;
    for (int i = threadIdx.x; i < nv; i += kRowThreads) cp_async16(&slice[i], &src[i]);
    const float w = weights[q];
    const int lab = labels[q];
    const int kt = 4 * V4 + threadIdx.x;
    const bool tail = b == cl - 1 && kt < V;
    const float xt = tail ? row[kt] : 0.0f;
    // the label's logit now: after the cluster barrier other blocks overwrite the row
    const float xlab = (b == 0 && threadIdx.x == 0 && w != 0.0f && lab >= 0 && lab < V) ? row[lab] : 0.0f;
    cp_async_wait_all();
    __syncthreads();

    row_stat t = stat_empty();
    for (int i = threadIdx.x; i < nv; i += kRowThreads) stat_add4(t, slice[i], 4 * (v0 + i));
    if (tail) stat_merge(t, row_stat{xt, 1.0f, xt, kt});
    t = stat_block(t);
    if (threadIdx.x == 0) bstat = t;
    cluster.sync(); // every block's stat is published and every block has read its slice from HBM
    if (threadIdx.x == 0) {
        row_stat all = stat_empty();
        for (int j = 0; j < cl; j++) stat_merge(all, *cluster.map_shared_rank(&bstat, j));
        const float lse = all.m + logf(all.s);
        row_lse = lse;
        if (b == 0) {
            ce[q] = w == 0.0f ? 0.0f : (lab >= 0 && lab < V) ? lse - xlab : NAN;
            if (argmax) argmax[q] = all.bi == 0x7fffffff ? 0 : all.bi;
        }
    }
    cluster.sync(); // the remote reads are done before any block moves on (or exits)
    __syncthreads(); // row_lse (the cluster barrier orders it already; this says so)
    if (!write_g) return;
    const float lse = row_lse, gs = w * loss_scale;
    uint2 *g4 = reinterpret_cast<uint2 *>(row);
    for (int i = threadIdx.x; i < nv; i += kRowThreads) {
        if (w == 0.0f) {
            g4[v0 + i] = make_uint2(0u, 0u);
            continue;
        }
        const float4 x = slice[i];
        const int k = 4 * (v0 + i);
        float p[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int e = 0; e < 4; e++) p[e] = (exp2f((p[e] - lse) * kLog2e) - (k + e == lab ? 1.0f : 0.0f)) * gs;
        g4[v0 + i] = make_uint2(pack_bf16x2(p[0], p[1]), pack_bf16x2(p[2], p[3]));
    }
    if (tail) {
        const float v = w == 0.0f ? 0.0f : (exp2f((xt - lse) * kLog2e) - (kt == lab ? 1.0f : 0.0f)) * gs;
        const __nv_bfloat16 bv = __float2bfloat16_rn(v);
        reinterpret_cast<uint16_t *>(row)[kt] = *reinterpret_cast<const uint16_t *>(&bv);
    }
}

// Rows outside the list: ce 0, argmax -1, dh 0 (its H columns).
static __global__ void ce_clear_kernel(float *ce, int32_t *argmax, uint16_t *dh, int lddh, int H, int n)
{
    const int i = blockIdx.x;
    if (i >= n) return;
    if (threadIdx.x == 0) {
        ce[i] = 0.0f;
        if (argmax) argmax[i] = -1;
    }
    if (!dh) return;
    uint4 *d = reinterpret_cast<uint4 *>(dh + (size_t)i * lddh);
    for (int j = threadIdx.x; j < H / 8; j += blockDim.x) d[j] = make_uint4(0u, 0u, 0u, 0u);
}

// dst row r (ld ldd) = src row rows[r] (ld lds) when gather, else dst row rows[r] = src row r; H bf16 a row.
static __global__ void ce_rows_copy_kernel(uint16_t *dst, int ldd, const uint16_t *src, int lds, int H,
                                           const int32_t *rows, int gather)
{
    const int r = blockIdx.x, q = rows[r];
    const uint4 *s = reinterpret_cast<const uint4 *>(src + (size_t)(gather ? q : r) * lds);
    uint4 *d = reinterpret_cast<uint4 *>(dst + (size_t)(gather ? r : q) * ldd);
    for (int j = threadIdx.x; j < H / 8; j += blockDim.x) d[j] = s[j];
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
    // the row cluster: the fewest blocks whose slices are small enough for two blocks an SM, at most 8
    const int V4 = V / 4;
    c->cl = 1;
    while (c->cl < kMaxCluster && (size_t)((V4 + c->cl - 1) / c->cl) * 16 > kSliceWanted) c->cl *= 2;
    c->sv = (V4 + c->cl - 1) / c->cl;
    if ((size_t)c->sv * 16 > kSliceMax) {
        fprintf(stderr, "cross_entropy_cuda: vocabulary %d is larger than a cluster of %d blocks holds (%zu KiB "
                "each)\n", V, kMaxCluster, kSliceMax >> 10);
        exit(1);
    }
    // the kernel's attribute, not the context's: the bound of every context
    CHECK_CUDA(cudaFuncSetAttribute(ce_row_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSliceMax));
    c->overlap = 2;
    for (int i = 0; i < 2; i++) {
        CHECK_CUDA(cudaMalloc(&c->logits[i], (size_t)c->chunk * c->ldl * sizeof(float)));
        CHECK_CUDA(cudaMalloc(&c->hc[i], (size_t)c->chunk * H * 2));
        CHECK_CUDA(cudaEventCreateWithFlags(&c->ev_gemm[i], cudaEventDisableTiming));
        CHECK_CUDA(cudaEventCreateWithFlags(&c->ev_rows[i], cudaEventDisableTiming));
    }
    CHECK_CUDA(cudaMalloc(&c->dhc, (size_t)c->chunk * H * 2));
    for (int i = 0; i < 2; i++) CHECK_CUDA(cudaMalloc(&c->lt_ws[i], kLtWorkspace));
    CHECK_CUBLAS(cublasLtCreate(&c->lt));
    int least = 0, greatest = 0;
    CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CHECK_CUDA(cudaStreamCreateWithPriority(&c->side, cudaStreamNonBlocking, greatest));
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
    CHECK_CUDA(cudaStreamSynchronize(c->side));
    for (int i = 0; i < c->ngemms; i++) gemm_entry_free(&c->gemms[i]);
    CHECK_CUBLAS(cublasLtDestroy(c->lt));
    for (int i = 0; i < 2; i++) {
        CHECK_CUDA(cudaFree(c->logits[i]));
        CHECK_CUDA(cudaFree(c->hc[i]));
        CHECK_CUDA(cudaEventDestroy(c->ev_gemm[i]));
        CHECK_CUDA(cudaEventDestroy(c->ev_rows[i]));
    }
    CHECK_CUDA(cudaFree(c->dhc));
    for (int i = 0; i < 2; i++) CHECK_CUDA(cudaFree(c->lt_ws[i]));
    CHECK_CUDA(cudaStreamDestroy(c->side));
    free(c);
    *cp = NULL;
}

extern "C" size_t cross_entropy_cuda_workspace_bytes(const cross_entropy_cuda_ctx *c)
{
    return 2 * (size_t)c->chunk * c->ldl * sizeof(float) + 3 * (size_t)c->chunk * c->H * 2 + 2 * kLtWorkspace;
}

extern "C" void cross_entropy_cuda_set_overlap(cross_entropy_cuda_ctx *c, int level)
{
    c->overlap = level < 0 ? 0 : level > 2 ? 2 : level;
}

// cuBLASLt's heuristic candidates for an entry's GEMM (every operand 16-byte aligned), best first by its model, under
// matmul.cu's preference (the project's one: no in-place split-K reduction).
static int gemm_candidates(cross_entropy_cuda_ctx *c, const gemm_entry *e, cublasLtMatmulHeuristicResult_t *res)
{
    const uint32_t align[4] = {16, 16, 16, 16};
    return matmul_lt_candidates(c->lt, e->desc, e->la, e->lb, e->lc, e->lc, kLtWorkspace, align, res, kCandidates);
}

// Which candidate runs: matmul_lt_pick's, the project's one GEMM pick rule (a function of the heuristic's answer and
// the shape only, so the same one every run: the bits do not depend on timing). The logits (fp32 out, inner H 4096)
// get the candidate without split-K with the most waves (at m 1024, V 151936: the first, 320x128 tiles, 28.8 waves,
// 1.97 ms, 649 TFLOP/s; the pick, 144x128, 64 waves, 1.60 ms, 795), dh (bf16 out, inner V) the heuristic's first.
static int gemm_pick(int which, const cublasLtMatmulHeuristicResult_t *res, int nres, int H, int V)
{
    return which == GEMM_LOGITS ? matmul_lt_pick(res, nres, 4, H) : matmul_lt_pick(res, nres, 2, V);
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
    cublasLtMatmulHeuristicResult_t res[kCandidates];
    const int nres = gemm_candidates(c, e, res), pick = gemm_pick(key.which, res, nres, c->H, c->V);
    if (nres < 1) {
        fprintf(stderr, "cross_entropy_cuda: cuBLASLt has no algorithm for %s m=%d H=%d V=%d ld=%d\n",
                key.which == GEMM_LOGITS ? "logits" : "dh", key.m, c->H, c->V, key.ld);
        exit(1);
    }
    e->algo = res[pick].algo;
}

static void gemm_run(cross_entropy_cuda_ctx *c, int which, int m, int ld, const void *a, const void *b, void *d,
                     void *ws, cudaStream_t stream)
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
                                ws, kLtWorkspace, stream));
    if (transient) gemm_entry_free(e);
}

extern "C" int cross_entropy_cuda_survey(cross_entropy_cuda_ctx *c, int which, int m, const uint16_t *h, int ldh,
                                         const uint16_t *lm_head, cross_entropy_algo *out, int max_out, void *stream_)
{
    cudaStream_t stream = (cudaStream_t)stream_;
    if (m < 1 || m > c->chunk || max_out < 1) ce_fail("survey: m outside [1, chunk] or no room for results");
    gemm_entry e;
    gemm_entry_init(c, &e, gemm_key{which, m, which == GEMM_LOGITS ? ldh : c->H});
    cublasLtMatmulHeuristicResult_t res[kCandidates];
    int nres = gemm_candidates(c, &e, res);
    const int pick = gemm_pick(which, res, nres, c->H, c->V);
    if (nres > max_out) nres = max_out;
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    const void *b = which == GEMM_LOGITS ? (const void *)h : (const void *)c->logits[0];
    void *d = which == GEMM_LOGITS ? (void *)c->logits[0] : (void *)c->dhc;
    const float alpha = 1.0f, beta = 0.0f;
    for (int i = 0; i < nres; i++) {
        cross_entropy_algo *o = &out[i];
        memset(o, 0, sizeof *o);
        size_t got = 0;
        const cublasLtMatmulAlgo_t *al = &res[i].algo;
        cublasLtMatmulAlgoConfigGetAttribute(al, CUBLASLT_ALGO_CONFIG_ID, &o->id, sizeof o->id, &got);
        cublasLtMatmulAlgoConfigGetAttribute(al, CUBLASLT_ALGO_CONFIG_TILE_ID, &o->tile, sizeof o->tile, &got);
        cublasLtMatmulAlgoConfigGetAttribute(al, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &o->splitk, sizeof o->splitk, &got);
        cublasLtMatmulAlgoConfigGetAttribute(al, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &o->reduction,
                                             sizeof o->reduction, &got);
        cublasLtMatmulAlgoConfigGetAttribute(al, CUBLASLT_ALGO_CONFIG_STAGES_ID, &o->stages, sizeof o->stages, &got);
        cublasLtMatmulAlgoConfigGetAttribute(al, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &o->cluster,
                                             sizeof o->cluster, &got);
        o->waves = res[i].wavesCount;
        o->used = i == pick;
        o->ms = -1.0f;
        if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
        for (int it = 0; it < 4; it++) { // one warm-up, three timed
            if (it == 1) CHECK_CUDA(cudaEventRecord(e0, stream));
            CHECK_CUBLAS(cublasLtMatmul(c->lt, e.desc, &alpha, lm_head, e.la, b, e.lb, &beta, d, e.lc, d, e.lc,
                                        &res[i].algo, c->lt_ws[0], kLtWorkspace, stream));
        }
        CHECK_CUDA(cudaEventRecord(e1, stream));
        CHECK_CUDA(cudaEventSynchronize(e1));
        CHECK_CUDA(cudaEventElapsedTime(&o->ms, e0, e1));
        o->ms /= 3;
    }
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    gemm_entry_free(&e);
    return nres;
}

static void row_kernel_run(cross_entropy_cuda_ctx *c, float *ce, int32_t *argmax, float *logits,
                           const int32_t *labels, const float *weights, const int32_t *rows, int r0, int m,
                           float loss_scale, int write_g, cudaStream_t stream)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(m * c->cl));
    cfg.blockDim = dim3(kRowThreads);
    cfg.dynamicSmemBytes = (size_t)c->sv * 16;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)c->cl, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr, cfg.numAttrs = 1;
    CHECK_CUDA(cudaLaunchKernelEx(&cfg, ce_row_kernel, ce, argmax, logits, c->ldl, c->V, c->sv, labels, weights,
                                  rows, r0, loss_scale, write_g));
}

extern "C" void cross_entropy_cuda(cross_entropy_cuda_ctx *c, float *ce, int32_t *argmax, double *wce_sum,
                                   uint16_t *dh, int lddh, const uint16_t *h, int ldh, const uint16_t *lm_head,
                                   const int32_t *labels, const float *weights, float loss_scale, int n,
                                   const int32_t *rows, int nrows, void *stream_)
{
    cudaStream_t stream = (cudaStream_t)stream_;
    if (n < 0 || (rows && (nrows < 0 || nrows > n))) ce_fail("n < 0, or a row list longer than n");
    if ((uintptr_t)h % 16 || (uintptr_t)lm_head % 16 || ldh % 8 || ldh < c->H)
        ce_fail("h and lm_head must be 16-byte aligned, ldh >= H and ldh % 8 == 0");
    if (dh && ((uintptr_t)dh % 16 || lddh % 8 || lddh < c->H))
        ce_fail("dh must be 16-byte aligned, lddh >= H and lddh % 8 == 0");
    const int H = c->H, nw = rows ? nrows : n, nchunks = (nw + c->chunk - 1) / c->chunk;
    if (rows && n > 0) {
        ce_clear_kernel<<<n, 128, 0, stream>>>(ce, argmax, dh, lddh, H, n);
        CHECK_CUDA_LAUNCH();
    }
    // chunk i: logits GEMM L_i into buffer b = i % 2 (0 on one stream), row kernel R_i, dh GEMM D_i. The first chunk
    // takes the remainder, so that the dh GEMM of a partial chunk (fewer tiles than SMs) has a logits GEMM beside it.
    const int m0 = nw - (nchunks - 1) * c->chunk;
    auto chunk_rows = [&](int i, int *r0, int *m) {
        *r0 = i == 0 ? 0 : m0 + (i - 1) * c->chunk;
        *m = i == 0 ? m0 : c->chunk;
    };
    cudaStream_t rs = c->overlap ? c->side : stream, ds = c->overlap == 2 ? c->side : stream;
    void *dws = c->lt_ws[c->overlap == 2];
    auto dh_chunk = [&](int i) {
        int r0, m;
        chunk_rows(i, &r0, &m);
        const int buf = c->overlap ? i % 2 : 0;
        if (c->overlap == 1) CHECK_CUDA(cudaStreamWaitEvent(stream, c->ev_rows[buf], 0));
        if (!dh) return;
        if (rows) {
            gemm_run(c, GEMM_DH, m, H, lm_head, c->logits[buf], c->dhc, dws, ds);
            ce_rows_copy_kernel<<<m, 128, 0, ds>>>(dh, lddh, c->dhc, H, H, rows + r0, 0);
            CHECK_CUDA_LAUNCH();
        } else {
            gemm_run(c, GEMM_DH, m, lddh, lm_head, c->logits[buf], dh + (size_t)r0 * lddh, dws, ds);
        }
    };
    for (int i = 0; i < nchunks; i++) {
        int r0, m;
        chunk_rows(i, &r0, &m);
        const int buf = c->overlap ? i % 2 : 0;
        // buffer buf was last used by chunk i - 2: its side-stream work (level 2), its R (level 1; D_{i-2} on this
        // stream waited for it already, but without dh nothing else does)
        if (c->overlap && i >= 2) CHECK_CUDA(cudaStreamWaitEvent(stream, c->ev_rows[buf], 0));
        if (rows) {
            ce_rows_copy_kernel<<<m, 128, 0, stream>>>(c->hc[buf], H, h, ldh, H, rows + r0, 1);
            CHECK_CUDA_LAUNCH();
            gemm_run(c, GEMM_LOGITS, m, H, lm_head, c->hc[buf], c->logits[buf], c->lt_ws[0], stream);
        } else {
            gemm_run(c, GEMM_LOGITS, m, ldh, lm_head, h + (size_t)r0 * ldh, c->logits[buf], c->lt_ws[0], stream);
        }
        if (c->overlap) {
            CHECK_CUDA(cudaEventRecord(c->ev_gemm[buf], stream));
            CHECK_CUDA(cudaStreamWaitEvent(rs, c->ev_gemm[buf], 0));
        }
        row_kernel_run(c, ce, argmax, c->logits[buf], labels, weights, rows ? rows + r0 : NULL, r0, m, loss_scale,
                       dh != NULL, rs);
        if (c->overlap == 2) dh_chunk(i); // behind R_i on the side stream
        if (c->overlap) CHECK_CUDA(cudaEventRecord(c->ev_rows[buf], rs));
        if (c->overlap == 1 && i >= 1) dh_chunk(i - 1); // R_i runs beside D_{i-1} and L_{i+1}
        if (c->overlap == 0) dh_chunk(i);
    }
    if (c->overlap == 1 && nchunks > 0) dh_chunk(nchunks - 1);
    if (c->overlap == 2 && nchunks > 0) // the side stream is in order: its last event covers all its work
        CHECK_CUDA(cudaStreamWaitEvent(stream, c->ev_rows[(nchunks - 1) % 2], 0));
    if (wce_sum) {
        ce_sum_kernel<<<1, 256, 0, stream>>>(wce_sum, ce, weights, n);
        CHECK_CUDA_LAUNCH();
    }
}
