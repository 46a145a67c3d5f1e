// matmul: the linear layer on cuBLASLt, bf16 operands with fp32 accumulation. Row-major y = x·wᵀ (+ beta·c) is the
// column-major product yᵀ = w·xᵀ: A = w seen as (k, n) column-major and transposed, B = x seen as (k, m), C/D = y
// seen as (n, m). The backward, in the same column-major view: dxᵀ (k, m) = w (k, n) · dyᵀ (n, m), and
// dwᵀ (k, n) = xᵀ (k, m) · dy (m, n) with dy seen as (n, m) and transposed, into fp32. Descriptors and the
// algorithm matmul_algo_pick chooses among the heuristic's candidates are cached per kind/shape/stride/alignment
// key, so a steady-state call creates nothing. C and D may be different buffers with different row strides: that is
// how a residual add lands straight in a tap column block.
//
// Determinism: the algorithm comes from the heuristic (never from timing) and is cached, and the preference allows
// only split-K reductions through a separate fp32 workspace pass (CUBLASLT_REDUCTION_SCHEME_NONE | COMPUTE_TYPE): no
// in-place reduction into the output (counters/atomics, and bf16 partials for a bf16 output). With the handle's own
// workspace on one stream, cuBLASLt then gives the same bits for the same call.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cuda_check.h"
#include "matmul.h"

namespace {

enum matmul_kind { MATMUL_FWD = 0, MATMUL_FWD_F32, MATMUL_BWD_DX, MATMUL_BWD_DW };

struct matmul_key {
    int kind, m, n, k, ldx, ldy, ldc, has_c, same_cd;
    int align_x, align_w, align_c, align_y;
};

struct matmul_entry {
    matmul_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasLtMatmulAlgo_t algo;
};

constexpr int kMaxEntries = 128;
constexpr int kCandidates = 16; // heuristic answers asked for

} // namespace

struct matmul_cuda {
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    int nentries;
    matmul_entry entries[kMaxEntries];
    matmul_algo *survey; // matmul_cuda_survey's (NULL: off)
    int survey_max, survey_iters, *survey_n, *survey_pick;
};


static void matmul_algo_describe(const cublasLtMatmulHeuristicResult_t *r, matmul_algo *o)
{
    memset(o, 0, sizeof *o);
    size_t got = 0;
    const cublasLtMatmulAlgo_t *a = &r->algo;
    o->splitk = 1;
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &o->id, sizeof o->id, &got);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &o->tile, sizeof o->tile, &got);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &o->stages, sizeof o->stages, &got);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &o->splitk, sizeof o->splitk, &got);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &o->reduction, sizeof o->reduction,
                                         &got);
    uint16_t cluster = 0;
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster, &got);
    o->cluster = cluster;
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &o->swizzle, sizeof o->swizzle, &got);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &o->custom, sizeof o->custom, &got);
    o->runnable = r->state == CUBLAS_STATUS_SUCCESS;
    o->waves = r->wavesCount;
    o->workspace = r->workspaceSize;
    o->ms = -1.0f;
}

int matmul_lt_pick(const cublasLtMatmulHeuristicResult_t *res, int nres, int out_bytes, int inner_k)
{
    matmul_algo a[kCandidates];
    if (nres > kCandidates) nres = kCandidates;
    for (int i = 0; i < nres; i++) matmul_algo_describe(&res[i], &a[i]);
    return nres > 0 ? matmul_algo_pick(a, nres, out_bytes, inner_k) : 0;
}

extern "C" void matmul_cuda_survey(matmul_cuda *h, matmul_algo *out, int max_out, int iters, int *nout, int *picked)
{
    h->survey = out;
    h->survey_max = max_out < kCandidates ? max_out : kCandidates;
    h->survey_iters = iters > 0 ? iters : 1;
    h->survey_n = nout, h->survey_pick = picked;
}

static int matmul_alignment(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 2 && (a % (uintptr_t)al) != 0) al >>= 1;
    return al;
}

extern "C" matmul_cuda *matmul_cuda_create(size_t workspace_bytes)
{
    matmul_cuda *h = (matmul_cuda *)calloc(1, sizeof *h);
    if (!h) {
        fprintf(stderr, "matmul_cuda_create: out of host memory\n");
        exit(1);
    }
    h->workspace_bytes = workspace_bytes ? workspace_bytes : (size_t)64 << 20;
    CHECK_CUBLAS(cublasLtCreate(&h->lt));
    CHECK_CUDA(cudaMalloc(&h->workspace, h->workspace_bytes));
    return h;
}

static void matmul_entry_free(matmul_entry *e)
{
    cublasLtMatrixLayoutDestroy(e->la);
    cublasLtMatrixLayoutDestroy(e->lb);
    cublasLtMatrixLayoutDestroy(e->lc);
    cublasLtMatrixLayoutDestroy(e->ld);
    cublasLtMatmulDescDestroy(e->desc);
}

extern "C" void matmul_cuda_destroy(matmul_cuda **hp)
{
    matmul_cuda *h = *hp;
    if (!h) return;
    for (int i = 0; i < h->nentries; i++) matmul_entry_free(&h->entries[i]);
    CHECK_CUDA(cudaFree(h->workspace));
    CHECK_CUBLAS(cublasLtDestroy(h->lt));
    free(h);
    *hp = NULL;
}

static const char *matmul_kind_name(int kind)
{
    static const char *names[] = {"matmul_forward_cuda", "matmul_forward_f32_cuda", "matmul_backward_cuda (dx)",
                                  "matmul_backward_cuda (dw)"};
    return names[kind];
}

// Key fields by kind (row-major names): x is the B-side operand and w the A side, y the output D and c the input C.
//   FWD / FWD_F32: A = w (n, k), B = x (m, k; ldx), D = y (m, n; ldy) bf16 / fp32
//   BWD_DX:        A = w (n, k), B = dy (m, n; ldx), D = dx (m, k; ldy) bf16
//   BWD_DW:        A = x (m, k; ldc), B = dy (m, n; ldx), D = dw (n, k; ldy) fp32
static void matmul_entry_layouts(matmul_entry *e, const matmul_key &key)
{
    e->key = key;
    const uint64_t m = (uint64_t)key.m, n = (uint64_t)key.n, k = (uint64_t)key.k;
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    cudaDataType_t dt = CUDA_R_16BF;
    switch (key.kind) {
    case MATMUL_FWD:
    case MATMUL_FWD_F32:
        ta = CUBLAS_OP_T;
        dt = key.kind == MATMUL_FWD ? CUDA_R_16BF : CUDA_R_32F;
        // A: w as column-major (k, n), ld k; B: x as (k, m), ld ldx; C/D: (n, m), ld ldc/ldy
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->la, CUDA_R_16BF, k, n, key.k));
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->lb, CUDA_R_16BF, k, m, key.ldx));
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->lc, dt, n, m, key.has_c ? key.ldc : key.ldy));
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->ld, dt, n, m, key.ldy));
        break;
    case MATMUL_BWD_DX:
        // A: w as (k, n), ld k; B: dy as (n, m), ld lddy; C = D: dx as (k, m), ld lddx
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->la, CUDA_R_16BF, k, n, key.k));
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->lb, CUDA_R_16BF, n, m, key.ldx));
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->lc, CUDA_R_16BF, k, m, key.ldy));
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->ld, CUDA_R_16BF, k, m, key.ldy));
        break;
    default: // MATMUL_BWD_DW
        // A: x as (k, m), ld ldx; B: dy as (n, m), ld lddy, transposed; C = D: dw as (k, n), ld k, fp32
        tb = CUBLAS_OP_T;
        dt = CUDA_R_32F;
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->la, CUDA_R_16BF, k, m, key.ldc));
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->lb, CUDA_R_16BF, n, m, key.ldx));
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->lc, CUDA_R_32F, k, n, key.ldy));
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->ld, CUDA_R_32F, k, n, key.ldy));
        break;
    }
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&e->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
}

int matmul_lt_candidates(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                         cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                         size_t workspace_bytes, const uint32_t align[4], cublasLtMatmulHeuristicResult_t *res, int max)
{
    cublasLtMatmulPreference_t pref;
    CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspace_bytes, sizeof workspace_bytes));
    uint32_t red = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red,
                                                      sizeof red));
    const cublasLtMatmulPreferenceAttributes_t al_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, al_attr[i], &align[i], sizeof align[i]));
    int nres = 0;
    CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, ld, pref, max, res, &nres));
    cublasLtMatmulPreferenceDestroy(pref);
    return nres;
}

// cuBLASLt's heuristic candidates for the entry's GEMM, best first by its model (at least one; exits when none).
static int matmul_entry_candidates(matmul_cuda *h, const matmul_entry *e, cublasLtMatmulHeuristicResult_t *res)
{
    const matmul_key &key = e->key;
    const uint32_t align[4] = {(uint32_t)key.align_w, (uint32_t)key.align_x, (uint32_t)key.align_c,
                               (uint32_t)key.align_y};
    const int nres = matmul_lt_candidates(h->lt, e->desc, e->la, e->lb, e->lc, e->ld, h->workspace_bytes, align, res,
                                          kCandidates);
    if (nres < 1) {
        fprintf(stderr, "%s: cuBLASLt has no algorithm for m=%d n=%d k=%d ld=%d/%d/%d\n", matmul_kind_name(key.kind),
                key.m, key.n, key.k, key.ldx, key.ldy, key.ldc);
        exit(1);
    }
    return nres;
}

// The rule's view of the entry's GEMM: its output's element size and inner dimension (k: the forward; n: dx; m: dw).
static int matmul_entry_pick(const matmul_entry *e, const cublasLtMatmulHeuristicResult_t *res, int nres)
{
    const matmul_key &k = e->key;
    const int out_bytes = k.kind == MATMUL_FWD || k.kind == MATMUL_BWD_DX ? 2 : 4;
    const int inner = k.kind == MATMUL_BWD_DX ? k.n : k.kind == MATMUL_BWD_DW ? k.m : k.k;
    return matmul_lt_pick(res, nres, out_bytes, inner);
}

static void matmul_entry_init(matmul_cuda *h, matmul_entry *e, const matmul_key &key)
{
    cublasLtMatmulHeuristicResult_t res[kCandidates];
    matmul_entry_layouts(e, key);
    const int nres = matmul_entry_candidates(h, e, res);
    e->algo = res[matmul_entry_pick(e, res, nres)].algo;
}

// The survey (matmul_cuda_survey): each candidate for the entry's GEMM, one warm-up and h->survey_iters timed calls.
static void matmul_survey_run(matmul_cuda *h, matmul_entry *e, const void *a, const void *b, float beta,
                              const void *c, void *d, cudaStream_t st)
{
    cublasLtMatmulHeuristicResult_t res[kCandidates];
    int nres = matmul_entry_candidates(h, e, res);
    *h->survey_pick = matmul_entry_pick(e, res, nres);
    if (nres > h->survey_max) nres = h->survey_max;
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    const float alpha = 1.0f;
    for (int i = 0; i < nres; i++) {
        matmul_algo *o = &h->survey[i];
        matmul_algo_describe(&res[i], o);
        if (!o->runnable) continue;
        for (int it = 0; it <= h->survey_iters; it++) {
            if (it == 1) CHECK_CUDA(cudaEventRecord(e0, st));
            CHECK_CUBLAS(cublasLtMatmul(h->lt, e->desc, &alpha, a, e->la, b, e->lb, &beta, c, e->lc, d, e->ld,
                                        &res[i].algo, h->workspace, h->workspace_bytes, st));
        }
        CHECK_CUDA(cudaEventRecord(e1, st));
        CHECK_CUDA(cudaEventSynchronize(e1));
        CHECK_CUDA(cudaEventElapsedTime(&o->ms, e0, e1));
        o->ms /= (float)h->survey_iters;
    }
    *h->survey_n = nres;
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
}

// D = A·B (+ beta·C) for the key, through the cached entry (made on the first call of the key).
static void matmul_run(matmul_cuda *h, const matmul_key &key, const void *a, const void *b, float beta, const void *c,
                       void *d, cudaStream_t st)
{
    matmul_entry *e = NULL, tmp;
    for (int i = 0; i < h->nentries && !e; i++)
        if (!memcmp(&h->entries[i].key, &key, sizeof key)) e = &h->entries[i];
    int transient = 0;
    if (!e) {
        if (h->nentries < kMaxEntries) {
            e = &h->entries[h->nentries++];
        } else {
            e = &tmp, transient = 1;
        }
        matmul_entry_init(h, e, key);
    }
    float alpha = 1.0f;
    if (h->survey)
        matmul_survey_run(h, e, a, b, beta, c, d, st);
    else
        CHECK_CUBLAS(cublasLtMatmul(h->lt, e->desc, &alpha, a, e->la, b, e->lb, &beta, c, e->lc, d, e->ld, &e->algo,
                                    h->workspace, h->workspace_bytes, st));
    if (transient) matmul_entry_free(e);
}

static void matmul_forward_any(matmul_cuda *h, int kind, void *y, int ldy, const void *c, int ldc, float beta,
                               const uint16_t *x, int ldx, const uint16_t *w, int m, int n, int k, void *stream)
{
    if (m <= 0 || n <= 0) return;
    if (beta == 0.0f) c = NULL;
    matmul_key key;
    memset(&key, 0, sizeof key);
    key.kind = kind;
    key.m = m, key.n = n, key.k = k, key.ldx = ldx, key.ldy = ldy;
    key.has_c = c != NULL;
    key.same_cd = c == y;
    key.ldc = c ? ldc : 0;
    key.align_x = matmul_alignment(x), key.align_w = matmul_alignment(w);
    key.align_y = matmul_alignment(y), key.align_c = c ? matmul_alignment(c) : key.align_y;
    matmul_run(h, key, w, x, beta, c ? c : y, y, (cudaStream_t)stream);
}

extern "C" void matmul_forward_cuda(matmul_cuda *h, uint16_t *y, int ldy, const uint16_t *c, int ldc, float beta,
                                    const uint16_t *x, int ldx, const uint16_t *w, int m, int n, int k, void *stream)
{
    matmul_forward_any(h, MATMUL_FWD, y, ldy, c, ldc, beta, x, ldx, w, m, n, k, stream);
}

extern "C" void matmul_forward_f32_cuda(matmul_cuda *h, float *y, int ldy, float beta, const uint16_t *x, int ldx,
                                        const uint16_t *w, int m, int n, int k, void *stream)
{
    matmul_forward_any(h, MATMUL_FWD_F32, y, ldy, y, ldy, beta, x, ldx, w, m, n, k, stream);
}

extern "C" void matmul_backward_cuda(matmul_cuda *h, uint16_t *dx, int lddx, int accumulate_dx, float *dw,
                                     int accumulate_dw, const uint16_t *dy, int lddy, const uint16_t *x, int ldx,
                                     const uint16_t *w, int m, int n, int k, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    if (m < 0 || n < 0 || k <= 0) return;
    if (dx && m > 0) {
        if (n == 0) {
            if (!accumulate_dx) CHECK_CUDA(cudaMemset2DAsync(dx, (size_t)lddx * 2, 0, (size_t)k * 2, (size_t)m, st));
        } else {
            matmul_key key;
            memset(&key, 0, sizeof key);
            key.kind = MATMUL_BWD_DX;
            key.m = m, key.n = n, key.k = k, key.ldx = lddy, key.ldy = lddx;
            key.has_c = key.same_cd = accumulate_dx != 0;
            key.align_x = matmul_alignment(dy), key.align_w = matmul_alignment(w);
            key.align_y = key.align_c = matmul_alignment(dx);
            matmul_run(h, key, w, dy, accumulate_dx ? 1.0f : 0.0f, dx, dx, st);
        }
    }
    if (dw && n > 0) {
        if (m == 0) {
            if (!accumulate_dw) CHECK_CUDA(cudaMemsetAsync(dw, 0, (size_t)n * k * sizeof(float), st));
            return;
        }
        matmul_key key;
        memset(&key, 0, sizeof key);
        key.kind = MATMUL_BWD_DW;
        key.m = m, key.n = n, key.k = k, key.ldx = lddy, key.ldy = k, key.ldc = ldx;
        key.has_c = key.same_cd = accumulate_dw != 0;
        // A is x here: its alignment goes in the A slot (align_w), dy in the B slot (align_x)
        key.align_w = matmul_alignment(x), key.align_x = matmul_alignment(dy);
        key.align_y = key.align_c = matmul_alignment(dw);
        matmul_run(h, key, x, dy, accumulate_dw ? 1.0f : 0.0f, dw, dw, st);
    }
}
