/* CUDA kernels against their CPU references on random data (run on the GPU machine). Inputs are drawn in fp32,
 * rounded to bf16, and the CPU reference runs in fp32 on the same bf16 values; a CUDA result may then differ from
 * it by one bf16 rounding (relative 2^-8) plus fp32 noise. Prints "ok <case> ..." / "FAIL <case> ..." with the
 * largest error and the tolerance; exit status 0 only when every case passed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#define GPU_TEST_SEED 0x2545f4914f6cdd1dull
#include "gpu_test.h"
#include "attention.h"
#include "embedding.h"
#include "matmul.h"
#include "qk_norm_rope.h"
#include "rand_fill.h"
#include "rmsnorm.h"
#include "rope.h"
#include "swiglu.h"
#include "util.h"

/* bf16 unit roundoff, and an allowance for fp32 differences in the reduction order and rsqrtf */
#define BF16_REL_TOL (0x1p-8 + 1e-5)




static void report(const char *name, double err, double tol)
{
    int ok = err <= tol;
    printf("%s %s max_err=%.3g tol=%.3g\n", ok ? "ok" : "FAIL", name, err, tol);
    fflush(stdout);
    if (!ok) failures++;
}

/* table_offset shifts the table by some elements to exercise the unaligned (scalar) path. */
static void check_embedding(int vocab, int dim, int n, int table_offset)
{
    size_t tn = (size_t)vocab * dim + table_offset;
    float *table_f = xmalloc(tn * sizeof *table_f);
    uint16_t *table = rnd_bf16(tn, 4.0, table_f);
    int32_t *ids = xmalloc((size_t)(n ? n : 1) * sizeof *ids);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((rnd_uniform() + 1.0) * 0.5 * vocab) % vocab;
    if (n > 1) ids[0] = 0, ids[n - 1] = vocab - 1;
    float *ref = xmalloc((size_t)(n ? n : 1) * dim * sizeof *ref);
    embedding_forward_cpu(ref, ids, n, table_f + table_offset, vocab, dim);

    uint16_t *d_table = dev_upload(table, tn * sizeof *table);
    int32_t *d_ids = dev_upload(ids, (size_t)n * sizeof *ids);
    uint16_t *d_out = NULL;
    size_t on = (size_t)n * dim;
    CHECK_CUDA(cudaMalloc((void **)&d_out, on * sizeof *d_out + 16));
    embedding_forward_cuda(d_out, d_ids, n, d_table + table_offset, dim, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    uint16_t *out = xmalloc((on ? on : 1) * sizeof *out);
    CHECK_CUDA(cudaMemcpy(out, d_out, on * sizeof *out, cudaMemcpyDeviceToHost));

    double err = 0;
    for (size_t i = 0; i < on; i++) err = fmax(err, fabs(bf16_to_f32(out[i]) - ref[i]));
    char name[128];
    snprintf(name, sizeof name, "embedding_forward_cuda vocab=%d dim=%d n=%d offset=%d", vocab, dim, n,
             table_offset);
    report(name, err, 0.0); /* a gather is exact */

    CHECK_CUDA(cudaFree(d_table));
    CHECK_CUDA(cudaFree(d_ids));
    CHECK_CUDA(cudaFree(d_out));
    free(table_f), free(table), free(ids), free(ref), free(out);
}

/* in_place runs with y == x (ldy = ldx). Columns past dim in y must stay untouched. */
static void check_rmsnorm(int rows, int dim, int ldx, int ldy, int in_place)
{
    float eps = 1e-6f;
    if (in_place) ldy = ldx;
    size_t xn = (size_t)rows * ldx, yn = (size_t)rows * ldy;
    float *x_f = xmalloc(xn * sizeof *x_f), *w_f = xmalloc((size_t)dim * sizeof *w_f);
    uint16_t *x = rnd_bf16(xn, 3.0, x_f), *w = rnd_bf16(dim, 1.5, w_f);
    if (rows > 1) /* a row of tiny values, where eps matters */
        for (int i = 0; i < dim; i++) {
            x[(size_t)ldx + i] = f32_to_bf16(x_f[(size_t)ldx + i] * 1e-3f);
            x_f[(size_t)ldx + i] = bf16_to_f32(x[(size_t)ldx + i]);
        }
    float *ref = xmalloc(yn * sizeof *ref);
    rmsnorm_forward_cpu(ref, ldy, x_f, ldx, w_f, rows, dim, eps);

    uint16_t *y0 = in_place ? x : rnd_bf16(yn, 1.0, NULL);
    uint16_t *d_x = dev_upload(x, xn * sizeof *x), *d_w = dev_upload(w, (size_t)dim * sizeof *w);
    uint16_t *d_y = in_place ? d_x : dev_upload(y0, yn * sizeof *y0);
    rmsnorm_forward_cuda(d_y, ldy, d_x, ldx, d_w, rows, dim, eps, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    uint16_t *y = xmalloc(yn * sizeof *y);
    CHECK_CUDA(cudaMemcpy(y, d_y, yn * sizeof *y, cudaMemcpyDeviceToHost));

    double err = 0; /* relative to the reference value, with an absolute floor for values near 0 */
    int pad_changed = 0;
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < dim; i++) {
            double want = ref[(size_t)r * ldy + i], got = bf16_to_f32(y[(size_t)r * ldy + i]);
            err = fmax(err, fabs(got - want) / fmax(fabs(want), 1e-3));
        }
        for (int i = dim; i < ldy; i++) pad_changed |= y[(size_t)r * ldy + i] != y0[(size_t)r * ldy + i];
    }
    char name[128];
    snprintf(name, sizeof name, "rmsnorm_forward_cuda rows=%d dim=%d ldx=%d ldy=%d%s", rows, dim, ldx, ldy,
             in_place ? " in_place" : "");
    report(name, pad_changed ? INFINITY : err, BF16_REL_TOL);

    CHECK_CUDA(cudaFree(d_x));
    CHECK_CUDA(cudaFree(d_w));
    if (!in_place) CHECK_CUDA(cudaFree(d_y));
    if (!in_place) free(y0);
    free(x_f), free(w_f), free(x), free(w), free(ref), free(y);
}

/* max |got - ref| / max |ref| over n values (got bf16 with row stride ldg, ref fp32 with ldr); NaN -> inf */
static double err_vs_max(const uint16_t *got, int ldg, const float *ref, int ldr, int rows, int cols, double *norm_rel)
{
    double mx = 0, e = 0, se = 0, sr = 0;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < cols; i++) mx = fmax(mx, fabs(ref[(size_t)r * ldr + i]));
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < cols; i++) {
            double g = bf16_to_f32(got[(size_t)r * ldg + i]), w = ref[(size_t)r * ldr + i];
            if (isnan(g)) return INFINITY;
            e = fmax(e, fabs(g - w));
            se += (g - w) * (g - w), sr += w * w;
        }
    if (norm_rel) *norm_rel = sr > 0 ? sqrt(se / sr) : sqrt(se);
    return mx > 0 ? e / mx : e;
}

/* y = x·wᵀ (+ c) through cuBLASLt; with c, C and D are different buffers with different row strides. */
static void check_matmul(matmul_cuda *mm, int m, int n, int k, int with_c)
{
    int ldx = k + 8, ldy = n + 24, ldc = n + 8;
    float *x_f = xmalloc((size_t)m * ldx * 4), *w_f = xmalloc((size_t)n * k * 4), *c_f = xmalloc((size_t)m * ldc * 4);
    uint16_t *x = rnd_bf16((size_t)m * ldx, 1.0, x_f), *w = rnd_bf16((size_t)n * k, 0.5, w_f);
    uint16_t *c = rnd_bf16((size_t)m * ldc, 2.0, c_f);
    float *ref = xmalloc((size_t)m * ldy * 4);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) ref[(size_t)i * ldy + j] = with_c ? c_f[(size_t)i * ldc + j] : 0.0f;
    matmul_forward_cpu(ref, ldy, x_f, ldx, w_f, m, n, k, 1);
    uint16_t *d_x = dev_upload(x, (size_t)m * ldx * 2), *d_w = dev_upload(w, (size_t)n * k * 2);
    uint16_t *d_c = dev_upload(c, (size_t)m * ldc * 2), *d_y = dev_poisoned((size_t)m * ldy);
    matmul_forward_cuda(mm, d_y, ldy, with_c ? d_c : NULL, ldc, with_c ? 1.0f : 0.0f, d_x, ldx, d_w, m, n, k, stream);
    uint16_t *y = dev_get(d_y, ((size_t)m * ldy) * 2);
    double nr = 0, e = err_vs_max(y, ldy, ref, ldy, m, n, &nr);
    char name[160];
    snprintf(name, sizeof name, "matmul_forward_cuda m=%d n=%d k=%d%s (max err / max|ref|)", m, n, k,
             with_c ? " +residual C!=D" : "");
    report(name, e, 4e-3); /* one bf16 rounding of the output (2^-9 of the value) + fp32 accumulation order */
    CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_w)); CHECK_CUDA(cudaFree(d_c)); CHECK_CUDA(cudaFree(d_y));
    free(x_f), free(w_f), free(c_f), free(x), free(w), free(c), free(ref), free(y);
}

static void check_swiglu(int rows, int dim, int ldo)
{
    int ldgu = 2 * dim + 8;
    size_t ng = (size_t)rows * ldgu;
    float *gu_f = xmalloc(ng * 4), *ref = xmalloc((size_t)rows * dim * 4);
    uint16_t *gu = rnd_bf16(ng, 6.0, gu_f);
    for (int r = 0; r < rows; r++)
        swiglu_forward_cpu(ref + (size_t)r * dim, gu_f + (size_t)r * ldgu, gu_f + (size_t)r * ldgu + dim, (size_t)dim);
    uint16_t *d_gu = dev_upload(gu, ng * 2), *d_o = dev_poisoned((size_t)rows * ldo);
    swiglu_forward_cuda(d_o, ldo, d_gu, ldgu, rows, dim, stream);
    uint16_t *o = dev_get(d_o, ((size_t)rows * ldo) * 2);
    double err = 0;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < dim; i++) {
            double g = bf16_to_f32(o[(size_t)r * ldo + i]), want = ref[(size_t)r * dim + i];
            err = isnan(g) ? INFINITY : fmax(err, fabs(g - want) / fmax(fabs(want), 1e-3));
        }
    char name[128];
    snprintf(name, sizeof name, "swiglu_forward_cuda rows=%d dim=%d ldo=%d (relative)", rows, dim, ldo);
    report(name, err, BF16_REL_TOL + 1e-5); /* one rounding; __expf adds a few ulp of fp32 */
    CHECK_CUDA(cudaFree(d_gu)); CHECK_CUDA(cudaFree(d_o));
    free(gu_f), free(ref), free(gu), free(o);
}

/* q and k inside one (n, qd + 2 kd) buffer as in the forward; positions up to maxpos. */
static void check_qk_norm_rope(int n, int nh, int nkv, int hd, int with_norm, int maxpos)
{
    int ld = (nh + 2 * nkv) * hd;
    size_t nx = (size_t)n * ld;
    float *x_f = xmalloc(nx * 4), *qw_f = xmalloc((size_t)hd * 4), *kw_f = xmalloc((size_t)hd * 4);
    uint16_t *x = rnd_bf16(nx, 3.0, x_f), *qw = rnd_bf16((size_t)hd, 1.5, qw_f), *kw = rnd_bf16((size_t)hd, 1.5, kw_f);
    int32_t *pos = xmalloc((size_t)n * 4);
    for (int t = 0; t < n; t++) pos[t] = (int32_t)((rnd_uniform() + 1.0) * 0.5 * maxpos);
    pos[0] = 0, pos[n - 1] = maxpos;
    double *inv = xmalloc(sizeof(double) * (size_t)hd / 2);
    rope_params rp = {.theta = 1e6};
    rope_inv_freq(inv, hd, &rp);
    qk_norm_rope_cpu(x_f, ld, x_f + (size_t)nh * hd, ld, n, nh, nkv, hd, with_norm ? qw_f : NULL,
                     with_norm ? kw_f : NULL, 1e-6f, pos, inv);
    uint16_t *d_x = dev_upload(x, nx * 2), *d_qw = dev_upload(qw, (size_t)hd * 2), *d_kw = dev_upload(kw, (size_t)hd * 2);
    int32_t *d_pos = dev_upload(pos, (size_t)n * 4);
    double *d_inv = dev_upload(inv, sizeof(double) * (size_t)hd / 2);
    qk_norm_rope_cuda(d_x, ld, d_x + (size_t)nh * hd, ld, n, nh, nkv, hd, with_norm ? d_qw : NULL,
                      with_norm ? d_kw : NULL, 1e-6f, d_pos, d_inv, stream);
    uint16_t *y = dev_get(d_x, (nx) * 2);
    /* q|k columns changed as the reference says; v columns untouched (the reference leaves them as they were) */
    double err = 0, nr = 0;
    err = err_vs_max(y, ld, x_f, ld, n, (nh + nkv) * hd, &nr);
    for (size_t t = 0; t < (size_t)n; t++)
        for (int i = (nh + nkv) * hd; i < ld; i++)
            if (y[t * ld + i] != x[t * ld + i]) err = INFINITY;
    char name[160];
    snprintf(name, sizeof name, "qk_norm_rope_cuda n=%d nh=%d nkv=%d hd=%d norm=%d maxpos=%d (max err / max|ref|)", n,
             nh, nkv, hd, with_norm, maxpos);
    report(name, err, 0x1p-8); /* one bf16 rounding of each output (fp32 math in between) */
    CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_qw)); CHECK_CUDA(cudaFree(d_kw));
    CHECK_CUDA(cudaFree(d_pos)); CHECK_CUDA(cudaFree(d_inv));
    free(x_f), free(qw_f), free(kw_f), free(x), free(qw), free(kw), free(pos), free(inv), free(y);
}

/* q|k|v packed in one (T, (nh + 2 nkv) hd) buffer as in the forward; out with its own stride. */
static void check_attention(const int *lens, int nseq, int nh, int nkv, int hd, double amp)
{
    int32_t *cu = xmalloc(sizeof(int32_t) * (size_t)(nseq + 1));
    cu[0] = 0;
    int maxlen = 0;
    for (int s = 0; s < nseq; s++) cu[s + 1] = cu[s] + lens[s], maxlen = lens[s] > maxlen ? lens[s] : maxlen;
    int T = cu[nseq], ld = (nh + 2 * nkv) * hd, qd = nh * hd, kd = nkv * hd, ldo = qd + 8;
    size_t nx = (size_t)T * ld;
    float *x_f = xmalloc(nx * 4);
    uint16_t *x = rnd_bf16(nx, amp, x_f);
    float *q = xmalloc((size_t)T * qd * 4), *k = xmalloc((size_t)T * kd * 4), *v = xmalloc((size_t)T * kd * 4);
    for (int t = 0; t < T; t++) {
        memcpy(q + (size_t)t * qd, x_f + (size_t)t * ld, (size_t)qd * 4);
        memcpy(k + (size_t)t * kd, x_f + (size_t)t * ld + qd, (size_t)kd * 4);
        memcpy(v + (size_t)t * kd, x_f + (size_t)t * ld + qd + kd, (size_t)kd * 4);
    }
    float *ref = xmalloc((size_t)T * qd * 4), scale = 1.0f / sqrtf((float)hd);
    attention_causal_forward_cpu(ref, q, k, v, cu, nseq, nh, nkv, hd, scale);
    uint16_t *d_x = dev_upload(x, nx * 2), *d_o = dev_poisoned((size_t)T * ldo);
    int32_t *d_cu = dev_upload(cu, sizeof(int32_t) * (size_t)(nseq + 1));
    attention_causal_forward_cuda(d_o, ldo, d_x, ld, d_x + qd, ld, d_x + qd + kd, ld, d_cu, nseq, maxlen, nh, nkv, hd,
                                  scale, stream);
    uint16_t *o = dev_get(d_o, ((size_t)T * ldo) * 2);
    double nr = 0, e = err_vs_max(o, ldo, ref, qd, T, qd, &nr);
    char name[160];
    snprintf(name, sizeof name, "attention_causal_forward_cuda T=%d nseq=%d nh=%d nkv=%d hd=%d maxlen=%d", T, nseq, nh,
             nkv, hd, maxlen);
    /* P is rounded to bf16 before P·V (2^-9 relative per weight) and the output once: max err / max|ref| 1e-2,
     * ‖err‖/‖ref‖ 5e-3 */
    int ok = e <= 1e-2 && nr <= 5e-3;
    printf("%s %s max_err/max_ref=%.3g (tol 1e-2) norm_rel=%.3g (tol 5e-3)\n", ok ? "ok" : "FAIL", name, e, nr);
    fflush(stdout);
    if (!ok) failures++;
    CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_o)); CHECK_CUDA(cudaFree(d_cu));
    free(cu), free(x_f), free(x), free(q), free(k), free(v), free(ref), free(o);
}

static void check_rand_fill(size_t n, uint64_t seed, float scale, float bias)
{
    uint16_t *ref = xmalloc(n * 2), *d = dev_poisoned(n);
    rand_fill_bf16_cpu(ref, n, seed, scale, bias);
    rand_fill_bf16_cuda(d, n, seed, scale, bias, stream);
    uint16_t *got = dev_get(d, (n) * 2);
    size_t diff = 0;
    for (size_t i = 0; i < n; i++) diff += got[i] != ref[i];
    char name[128];
    snprintf(name, sizeof name, "rand_fill_bf16_cuda n=%zu (elements differing from the CPU)", n);
    report(name, (double)diff, 0.0);
    CHECK_CUDA(cudaFree(d));
    free(ref), free(got);
}

int main(void)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("FAIL test_kernels_gpu: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 1;
    }
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaStreamCreate(&stream));

    check_embedding(1000, 4096, 77, 0); /* 16-byte vector path */
    check_embedding(151, 13, 40, 0);    /* row not a multiple of 8: scalar path */
    check_embedding(64, 16, 9, 3);      /* misaligned table: scalar path */
    check_embedding(1, 8, 1, 0);        /* one token */

    check_rmsnorm(33, 4096, 4096, 4096, 0); /* hidden norm */
    check_rmsnorm(257, 128, 128, 128, 0);   /* q/k norm: rows = tokens*heads */
    check_rmsnorm(5, 37, 41, 40, 0);        /* odd dim, wide strides */
    check_rmsnorm(3, 5000, 5003, 5001, 0);  /* more elements than threads per block */
    check_rmsnorm(1, 7, 7, 7, 0);           /* fewer elements than a warp */
    check_rmsnorm(9, 1000, 1024, 0, 1);     /* in place */

    matmul_cuda *mm = matmul_cuda_create(0);
    check_matmul(mm, 77, 384, 256, 0);
    check_matmul(mm, 77, 384, 256, 1);
    check_matmul(mm, 300, 1000, 4096, 1);
    check_matmul(mm, 5, 64, 160, 1); /* the tiny model's down_proj */
    matmul_cuda_destroy(&mm);

    check_swiglu(37, 12288 / 16, 12288 / 16); /* vector path */
    check_swiglu(9, 160, 168);                /* vector path, strided */
    check_swiglu(7, 13, 13);                  /* scalar path */

    check_qk_norm_rope(50, 32, 8, 128, 1, 40000);
    check_qk_norm_rope(33, 4, 2, 16, 1, 300);
    check_qk_norm_rope(20, 8, 8, 64, 0, 5000); /* Llama: rope only */
    check_qk_norm_rope(11, 3, 1, 10, 1, 100);  /* head_dim not a multiple of 4: one pair per lane */

    const int lens_a[] = {1, 17, 64, 65, 200, 333, 129};
    check_attention(lens_a, 7, 32, 8, 128, 2.0); /* Qwen3-8B heads */
    check_attention(lens_a, 7, 4, 2, 16, 2.0);   /* tiny model */
    check_attention(lens_a, 7, 8, 2, 64, 4.0);
    const int lens_b[] = {70, 3, 140};
    check_attention(lens_b, 3, 6, 3, 48, 2.0); /* head_dim 48: scalar path */
    const int lens_c[] = {1000};
    check_attention(lens_c, 1, 8, 8, 128, 1.0); /* one long sequence, MHA */
    const int lens_d[] = {256, 127, 383, 64, 128, 513};
    check_attention(lens_d, 6, 16, 4, 128, 2.0); /* 128-query tile edges, 4 query heads per kv head */
    check_attention(lens_d, 6, 4, 1, 32, 2.0);
    /* head_dim 256 (Qwen3.5's gated attention, 16/4 heads): 64-query tiles of one m16 tile per warp, 32-key tiles */
    check_attention(lens_a, 7, 16, 4, 256, 2.0);
    check_attention(lens_d, 6, 6, 2, 256, 2.0);
    check_attention(lens_c, 1, 2, 1, 256, 1.0);

    check_rand_fill(1000003, 42, 0.05f, 0.0f);
    check_rand_fill(4097, 7, 0.0f, 1.0f);

    CHECK_CUDA(cudaStreamDestroy(stream));
    printf("test_kernels_gpu: %d case(s) failed\n", failures);
    return failures ? 1 : 0;
}
