// matmul: the linear layer on cuBLASLt, bf16 operands with fp32 accumulation. Row-major y = x·wᵀ (+ beta·c) is the
// column-major product yᵀ = w·xᵀ: A = w seen as (k, n) column-major and transposed, B = x seen as (k, m), C/D = y
// seen as (n, m). Descriptors and the heuristic's first algorithm are cached per shape/stride/alignment key, so a
// steady-state forward creates nothing. C and D may be different buffers with different row strides: that is how a
// residual add lands straight in a tap column block.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cuda_check.h"
#include "matmul.h"

namespace {

struct matmul_key {
    int m, n, k, ldx, ldy, ldc, has_c, same_cd;
    int align_x, align_w, align_c, align_y;
};

struct matmul_entry {
    matmul_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasLtMatmulAlgo_t algo;
};

constexpr int kMaxEntries = 128;

} // namespace

struct matmul_cuda {
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    int nentries;
    matmul_entry entries[kMaxEntries];
};

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

static void matmul_entry_init(matmul_cuda *h, matmul_entry *e, const matmul_key &key)
{
    e->key = key;
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&e->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    // A: w as column-major (k, n), ld k; B: x as (k, m), ld ldx; C/D: (n, m), ld ldc/ldy
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->la, CUDA_R_16BF, (uint64_t)key.k, (uint64_t)key.n, key.k));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->lb, CUDA_R_16BF, (uint64_t)key.k, (uint64_t)key.m, key.ldx));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->lc, CUDA_R_16BF, (uint64_t)key.n, (uint64_t)key.m,
                                            key.has_c ? key.ldc : key.ldy));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&e->ld, CUDA_R_16BF, (uint64_t)key.n, (uint64_t)key.m, key.ldy));

    cublasLtMatmulPreference_t pref;
    CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &h->workspace_bytes, sizeof h->workspace_bytes));
    uint32_t al_a = (uint32_t)key.align_w, al_b = (uint32_t)key.align_x, al_c = (uint32_t)key.align_c,
             al_d = (uint32_t)key.align_y;
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                      sizeof al_a));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                      sizeof al_b));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                                      sizeof al_c));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                                      sizeof al_d));
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(h->lt, e->desc, e->la, e->lb, e->lc, e->ld, pref, 1, &res, &nres));
    cublasLtMatmulPreferenceDestroy(pref);
    if (nres < 1) {
        fprintf(stderr, "matmul_forward_cuda: cuBLASLt has no algorithm for m=%d n=%d k=%d ldx=%d ldy=%d ldc=%d\n",
                key.m, key.n, key.k, key.ldx, key.ldy, key.ldc);
        exit(1);
    }
    e->algo = res.algo;
}

extern "C" void matmul_forward_cuda(matmul_cuda *h, uint16_t *y, int ldy, const uint16_t *c, int ldc, float beta,
                                    const uint16_t *x, int ldx, const uint16_t *w, int m, int n, int k, void *stream)
{
    if (m <= 0 || n <= 0) return;
    if (beta == 0.0f) c = NULL;
    matmul_key key;
    memset(&key, 0, sizeof key);
    key.m = m, key.n = n, key.k = k, key.ldx = ldx, key.ldy = ldy;
    key.has_c = c != NULL;
    key.same_cd = c == y;
    key.ldc = c ? ldc : 0;
    key.align_x = matmul_alignment(x), key.align_w = matmul_alignment(w);
    key.align_y = matmul_alignment(y), key.align_c = c ? matmul_alignment(c) : key.align_y;
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
    CHECK_CUBLAS(cublasLtMatmul(h->lt, e->desc, &alpha, w, e->la, x, e->lb, &beta, c ? (const void *)c : (const void *)y,
                                e->lc, y, e->ld, &e->algo, h->workspace, h->workspace_bytes, (cudaStream_t)stream));
    if (transient) matmul_entry_free(e);
}
