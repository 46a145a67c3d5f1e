/* target_base_cuda: the pieces of the CUDA target that the generic code and every family use: device allocation
 * counted in the model's bytes (cudaMalloc, or the next buffer of the model's arena: target_arena_cuda.h), uploads of checkpoint tensors as bf16, the linear layer (the one rule for which kernel runs it), and
 * the profiling marks. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "env_switch.h"
#include "gemv.h"
#include "matmul.h"
#include "matmul_swiglu.h"
#include "rmsnorm.h"
#include "swiglu.h"
#include "target_arena_cuda.h"
#include "target_model_cuda_impl.h"

void *target_cuda_alloc(target_cuda *m, size_t bytes)
{
    void *p = NULL;
    m->device_bytes += bytes;
    if (m->arena) return target_arena_take(m->arena, bytes ? bytes : 16);
    CHECK_CUDA(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}

void target_cuda_free(void *pp)
{
    void **p = (void **)pp;
    if (*p && !target_arena_owns(*p)) CHECK_CUDA(cudaFree(*p));
    *p = NULL;
}

void target_cuda_put(uint16_t *dst, const float *src, size_t n, float add)
{
    const size_t chunk = (size_t)1 << 22;
    uint16_t *h = xmalloc(sizeof *h * (n < chunk ? n : chunk));
    for (size_t off = 0; off < n; off += chunk) {
        size_t cnt = n - off < chunk ? n - off : chunk;
        for (size_t i = 0; i < cnt; i++) h[i] = f32_to_bf16(src[off + i] + add);
        CHECK_CUDA(cudaMemcpy(dst + off, h, cnt * 2, cudaMemcpyHostToDevice));
    }
    free(h);
}

int target_cuda_upload_tensor(const st_file *st, const char *name, uint16_t *dst, int64_t d0, int64_t d1,
                              errbuf *err)
{
    const st_tensor *t = st_find(st, name);
    if (!t) return errbuf_set(err, ENOENT, "%s: tensor %s is missing", st_path(st), name);
    int ndim = d1 > 0 ? 2 : 1;
    if (t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1))
        return errbuf_set(err, EINVAL, "%s: tensor %s has shape [%lld%s%lld], expected [%lld%s%lld]", t->file, name,
                          (long long)t->shape[0], t->ndim > 1 ? ", " : "", t->ndim > 1 ? (long long)t->shape[1] : 0LL,
                          (long long)d0, ndim > 1 ? ", " : "", ndim > 1 ? (long long)d1 : 0LL);
    size_t n = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1);
    if (t->dtype == ST_BF16) {
        CHECK_CUDA(cudaMemcpy(dst, t->data, n * 2, cudaMemcpyHostToDevice));
        return 0;
    }
    if (t->dtype != ST_F32 && t->dtype != ST_F16)
        return errbuf_set(err, EINVAL, "%s: tensor %s has dtype %s, expected F32, BF16 or F16", t->file, name,
                          st_dtype_name(t->dtype));
    const size_t chunk = (size_t)1 << 24;
    uint16_t *h = xmalloc(sizeof *h * (n < chunk ? n : chunk));
    for (size_t off = 0; off < n; off += chunk) {
        size_t c = n - off < chunk ? n - off : chunk;
        for (size_t i = 0; i < c; i++) {
            float f;
            if (t->dtype == ST_F32) {
                memcpy(&f, (const char *)t->data + 4 * (off + i), 4);
            } else {
                uint16_t hv;
                memcpy(&hv, (const char *)t->data + 2 * (off + i), 2);
                f = f16_to_f32(hv);
            }
            h[i] = f32_to_bf16(f);
        }
        CHECK_CUDA(cudaMemcpy(dst + off, h, c * 2, cudaMemcpyHostToDevice));
    }
    free(h);
    return 0;
}

/* Profiling: an event after each kernel; the span from the previous event is charged to the kernel's class. */
void target_cuda_mark(target_cuda *m, int cls)
{
    if (!m->profiling || m->nev >= TC_MAX_EVENTS) return;
    m->ev_class[m->nev] = cls;
    CHECK_CUDA(cudaEventRecord(m->ev[m->nev++], m->stream));
}

void target_cuda_linear(target_cuda *m, uint16_t *y, int ldy, const uint16_t *c, int ldc, float beta,
                        const uint16_t *x, int ldx, const uint16_t *w, int T, int n, int k)
{
    if (T <= m->gemv_rows && gemv_cuda_takes(x, ldx, w, T, n, k))
        gemv_forward_cuda(y, ldy, c, ldc, beta, x, ldx, w, T, n, k, m->stream);
    else
        matmul_forward_cuda(m->mm, y, ldy, c, ldc, beta, x, ldx, w, T, n, k, m->stream);
}

/* The rule for the GEMVs with the norm (and SwiGLU) folded in: the few rows of a decoding step that the CUDA-core
 * GEMV takes (target_cuda_set_gemv_rows, GEMV_FMA_AUTO_M); the kernel's own _takes says whether the operands suit. */
static int tc_gemv_folds(const target_cuda *m, int T) { return T <= m->gemv_rows && T <= GEMV_FMA_AUTO_M; }

void target_cuda_norm_linear(target_cuda *m, uint16_t *y, int ldy, uint16_t *u, const uint16_t *x, int ldx,
                             const uint16_t *norm_w, float eps, const uint16_t *w, int T, int n, int k)
{
    if (tc_gemv_folds(m, T) && gemv_rmsnorm_cuda_takes(x, ldx, norm_w, w, T, n, k)) {
        gemv_rmsnorm_forward_cuda(y, ldy, NULL, 0, 0.0f, x, ldx, norm_w, eps, w, T, n, k, m->stream);
    } else {
        rmsnorm_forward_cuda(u, k, x, ldx, norm_w, T, k, eps, m->stream);
        target_cuda_mark(m, TARGET_CUDA_OTHER);
        target_cuda_linear(m, y, ldy, NULL, 0, 0.0f, u, k, w, T, n, k);
    }
}

/* The rule for the gate|up GEMM with SwiGLU in its epilogue (matmul_swiglu: gu never goes to memory): the rows the
 * GEMV does not take, on the operands (sm_90a device, shapes) matmul_swiglu_cuda_takes accepts, unless
 * DFLASH_GATEUP_FUSED=0 (read once). Else cuBLASLt into gu, then swiglu_forward_cuda. On the H200 the fused GEMM
 * made the Qwen3-8B target step 434.2 ms against 438.6 (bench/RESULTS.md, 2026-12-05). */
static int tc_gateup_fused(const target_cuda *m, const uint16_t *act, int ldact, const uint16_t *u,
                           const uint16_t *w_gu, int T, int I, int k)
{
    static int off = -1;
    return !env_switch(&off, "DFLASH_GATEUP_FUSED", "0") && T > m->gemv_rows &&
           matmul_swiglu_cuda_takes(act, ldact, u, k, w_gu, T, I, k);
}

void target_cuda_norm_linear_swiglu(target_cuda *m, uint16_t *act, int ldact, uint16_t *gu, uint16_t *u,
                                    const uint16_t *x, int ldx, const uint16_t *norm_w, float eps, const uint16_t *w_gu,
                                    int T, int I, int k)
{
    if (tc_gemv_folds(m, T) && gemv_rmsnorm_swiglu_cuda_takes(x, ldx, norm_w, w_gu, T, I, k, ldact)) {
        gemv_rmsnorm_swiglu_forward_cuda(act, ldact, x, ldx, norm_w, eps, w_gu, T, I, k, m->stream);
        target_cuda_mark(m, TARGET_CUDA_MATMUL);
        return;
    }
    if (tc_gateup_fused(m, act, ldact, u, w_gu, T, I, k)) {
        rmsnorm_forward_cuda(u, k, x, ldx, norm_w, T, k, eps, m->stream);
        target_cuda_mark(m, TARGET_CUDA_OTHER);
        matmul_swiglu_forward_cuda(act, ldact, u, k, w_gu, T, I, k, m->stream);
        target_cuda_mark(m, TARGET_CUDA_MATMUL);
        return;
    }
    target_cuda_norm_linear(m, gu, 2 * I, u, x, ldx, norm_w, eps, w_gu, T, 2 * I, k);
    target_cuda_mark(m, TARGET_CUDA_MATMUL);
    swiglu_forward_cuda(act, ldact, gu, 2 * I, T, I, m->stream);
    target_cuda_mark(m, TARGET_CUDA_OTHER);
}
