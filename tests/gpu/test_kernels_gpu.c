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
#include "embedding.h"
#include "rmsnorm.h"
#include "util.h"

/* bf16 unit roundoff, and an allowance for fp32 differences in the reduction order and rsqrtf */
#define BF16_REL_TOL (0x1p-8 + 1e-5)

static int failures;
static cudaStream_t stream;
static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static double rnd_uniform(void) /* [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* n bf16 values of amplitude amp, and their exact fp32 values in f (may be NULL). */
static uint16_t *rnd_bf16(size_t n, double amp, float *f)
{
    uint16_t *h = xmalloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        h[i] = f32_to_bf16((float)(amp * rnd_uniform()));
        if (f) f[i] = bf16_to_f32(h[i]);
    }
    return h;
}

static void *dev_upload(const void *src, size_t bytes)
{
    void *d = NULL;
    CHECK_CUDA(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes) CHECK_CUDA(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
    return d;
}

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

    CHECK_CUDA(cudaStreamDestroy(stream));
    printf("test_kernels_gpu: %d case(s) failed\n", failures);
    return failures ? 1 : 0;
}
