/* The elementwise and gather kernels: swiglu (forward, backward), embedding (gather, ids out of range), cast
 * (fp32 -> bf16, round to nearest even, NaN kept), colsum_add and rand_fill. CPU: against double formulas, finite
 * differences, exact values. CUDA: against the CPU reference on the same values (bit-identical where the operation
 * is exact: gather, cast, colsum, rand_fill). */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cast.h"
#include "colsum.h"
#include "embedding.h"
#include "qk_norm_rope.h"
#include "rand_fill.h"
#include "rmsnorm.h"
#include "rope.h"
#include "swiglu.h"
#include "tests/kernel_cases.h"
#include "tests/test.h"
#include "util.h"

/* bf16 unit roundoff, and an allowance for fp32 differences */
#define BF16_REL_TOL (0x1p-8 + 1e-5)

/* ---- swiglu forward: rows dim ldo (the CPU check: rows·dim contiguous values) ---- */

static void swiglu_forward_cpu_check(const kc_case *c)
{
    size_t n = (size_t)c->p[0] * c->p[1];
    float *g = rnd_floats(n, 8.0), *u = rnd_floats(n, 3.0), *out = xmalloc(n * sizeof *out);
    if (n > 2) g[0] = -100.0f, g[1] = 100.0f, g[2] = 0.0f;
    swiglu_forward_cpu(out, g, u, n);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double ref = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        worst = fmax(worst, fabs(out[i] - ref) / (fabs(ref) + 1e-30));
    }
    EXPECT(worst < 1e-6);
    float *ga = dup_floats(g, n), *ua = dup_floats(u, n);
    swiglu_forward_cpu(ga, ga, u, n);
    swiglu_forward_cpu(ua, g, ua, n);
    EXPECT(memcmp(ga, out, n * sizeof *out) == 0);
    EXPECT(memcmp(ua, out, n * sizeof *out) == 0);
    free(g), free(u), free(out), free(ga), free(ua);
}

struct sw_ctx {
    float *g, *u, *dy, *y;
    int n;
};

static double sw_loss(void *p)
{
    struct sw_ctx *c = p;
    swiglu_forward_cpu(c->y, c->g, c->u, (size_t)c->n);
    return kc_dot_loss(c->dy, c->y, 1, c->n, c->n);
}

/* ---- swiglu backward: rows dim ldgu lddo in_place (the CPU check: rows·dim contiguous values) ---- */
static void swiglu_backward_cpu_check(const kc_case *kc)
{
    struct sw_ctx c = {.n = kc->p[0] * kc->p[1]};
    c.g = rnd_floats(c.n, 4.0);
    c.u = rnd_floats(c.n, 2.0);
    c.dy = rnd_floats(c.n, 1.0);
    c.y = xmalloc((size_t)c.n * sizeof *c.y);
    float *dg = xmalloc((size_t)c.n * sizeof *dg), *du = xmalloc((size_t)c.n * sizeof *du);
    swiglu_backward_cpu(dg, du, c.dy, c.g, c.u, (size_t)c.n);
    kc_check_grad("dgate", c.g, 1, c.n, c.n, dg, c.n, sw_loss, &c);
    kc_check_grad("dup", c.u, 1, c.n, c.n, du, c.n, sw_loss, &c);
    EXPECT(kc_max_abs(dg, c.n) > 0 && kc_max_abs(du, c.n) > 0);
    free(c.g), free(c.u), free(c.dy), free(c.y), free(dg), free(du);
}

/* ---- embedding: vocab dim n offset ---- */

static int32_t *embedding_ids(int vocab, int n)
{
    int32_t *ids = xmalloc((size_t)(n ? n : 1) * sizeof *ids);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((rnd_uniform() + 1.0) * 0.5 * vocab) % vocab;
    if (n > 1) ids[0] = 0, ids[n - 1] = vocab - 1;
    if (n > 3) ids[3] = ids[2]; /* an id twice */
    return ids;
}

static void embedding_cpu_check(const kc_case *c)
{
    int vocab = c->p[0], dim = c->p[1], n = c->p[2];
    float *table = rnd_floats((size_t)vocab * dim, 1.0), *out = xmalloc((size_t)(n ? n : 1) * dim * sizeof *out);
    int32_t *ids = embedding_ids(vocab, n);
    embedding_forward_cpu(out, ids, n, table, vocab, dim);
    for (int i = 0; i < n; i++)
        EXPECT(memcmp(out + (size_t)i * dim, table + (size_t)ids[i] * dim, (size_t)dim * sizeof *out) == 0);
    free(table), free(out), free(ids);
}

static void embedding_expect_abort(int32_t bad)
{
    float table[8] = {0}, out[4];
    int32_t ids[2] = {1, bad};
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(3);
        embedding_forward_cpu(out, ids, 2, table, 4, 2);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    EXPECT(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
}

static void embedding_rejects_cpu_check(const kc_case *c)
{
    (void)c;
    embedding_expect_abort(4);
    embedding_expect_abort(-1);
}

/* ---- cast: n offset (the CPU check: ties to even, NaN, inf by value; then n random values against the rule) ---- */

static void cast_cpu_check(const kc_case *c)
{
    const float in[] = {1.0f, 1.00390625f /* 1 + 2^-8: a tie, down to even */, 1.01171875f /* tie, up */, -2.5f,
                        NAN, INFINITY};
    uint16_t out[6];
    cast_f32_bf16_cpu(out, in, 6);
    EXPECT(out[0] == 0x3f80 && out[1] == 0x3f80 && out[2] == 0x3f82 && out[3] == 0xc020);
    EXPECT((out[4] & 0x7f80) == 0x7f80 && (out[4] & 0x7f) != 0);
    EXPECT(out[5] == 0x7f80);
    /* random values: the nearest bf16, ties to even (against the rule written on the bits here) */
    size_t n = (size_t)c->p[0];
    float *x = rnd_floats(n, 3.0);
    uint16_t *y = xmalloc(2 * (n ? n : 1));
    cast_f32_bf16_cpu(y, x, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        uint32_t want = (u + 0x7fff + ((u >> 16) & 1)) >> 16;
        bad += y[i] != (uint16_t)want;
    }
    EXPECT(bad == 0);
    free(x), free(y);
}

/* ---- colsum_add: nparts dim (the CPU check on small integers: exact in any order) ---- */

static void colsum_cpu_check(const kc_case *c)
{
    int P = c->p[0], DIM = c->p[1];
    float *part = xmalloc(sizeof(float) * (size_t)P * DIM), *dw = xmalloc(sizeof(float) * (size_t)DIM);
    for (int i = 0; i < P * DIM; i++) part[i] = (float)((i * 37) % 11) - 5.0f;
    for (int k = 0; k < DIM; k++) dw[k] = (float)k;
    colsum_add_cpu(dw, part, P, DIM);
    for (int k = 0; k < DIM; k++) {
        double want = k;
        for (int p = 0; p < P; p++) want += part[p * DIM + k];
        EXPECT_NEAR(dw[k], want, 1e-4);
    }
    free(part), free(dw);
}

/* n seed scale_milli bias_milli: element i = bf16(bias + scale·u_i), u_i in [-1, 1) from (seed, i) alone: the values
 * in range, a shorter tensor the prefix of a longer one, another seed another tensor, the mean near bias */
static void rand_fill_cpu_check(const kc_case *c)
{
    const size_t n = (size_t)c->p[0];
    const uint64_t seed = (uint64_t)c->p[1];
    const float scale = c->p[2] / 1000.0f, bias = c->p[3] / 1000.0f;
    uint16_t *a = xmalloc(2 * n), *b = xmalloc(2 * n), *o = xmalloc(2 * n);
    rand_fill_bf16_cpu(a, n, seed, scale, bias);
    rand_fill_bf16_cpu(b, n / 2, seed, scale, bias);
    rand_fill_bf16_cpu(o, n, seed + 1, scale, bias);
    EXPECT(memcmp(a, b, n / 2 * 2) == 0);
    size_t out_of_range = 0, same = 0;
    double sum = 0, lo = bias - fabsf(scale), hi = bias + fabsf(scale), ulp = fmax(fabs(lo), fabs(hi)) * 0x1p-8;
    for (size_t i = 0; i < n; i++) {
        double v = bf16_to_f32(a[i]);
        out_of_range += !(v >= lo - ulp && v <= hi + ulp);
        same += a[i] == o[i];
        sum += v;
    }
    EXPECT(out_of_range == 0);
    if (scale != 0.0f) {
        EXPECT(same < n / 2); /* another seed, another tensor */
        EXPECT(fabs(sum / n - bias) <= 5.0 * fabsf(scale) / sqrt(3.0 * n) + 0x1p-8 * fabs(bias)); /* 5 sigma */
    } else {
        EXPECT(same == n); /* scale 0: every element is bf16(bias) */
        for (size_t i = 0; i < n; i++) EXPECT(a[i] == f32_to_bf16(bias));
    }
    free(a), free(b), free(o);
}

#ifdef DFLASH_CUDA
static void swiglu_forward_cuda_check(const kc_case *c)
{
    int rows = c->p[0], dim = c->p[1], ldo = c->p[2];
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
    kc_report(name, err, BF16_REL_TOL + 1e-5); /* one rounding; __expf adds a few ulp of fp32 */
    CHECK_CUDA(cudaFree(d_gu)); CHECK_CUDA(cudaFree(d_o));
    free(gu_f), free(ref), free(gu), free(o);
}

static void swiglu_backward_cuda_check(const kc_case *c)
{
    int rows = c->p[0], dim = c->p[1], ldgu = c->p[2], lddo = c->p[3], in_place = c->p[4];
    int lddgu = in_place ? ldgu : ldgu + 8;
    size_t ng = (size_t)rows * ldgu, nd = (size_t)rows * lddo, ndg = (size_t)rows * lddgu;
    float *gu_f = xmalloc(ng * 4), *do_f = xmalloc(nd * 4), *ref = xmalloc((size_t)rows * 2 * dim * 4);
    uint16_t *gu = rnd_bf16(ng, 6.0, gu_f), *dout = rnd_bf16(nd, 1.0, do_f);
    for (int r = 0; r < rows; r++)
        swiglu_backward_cpu(ref + (size_t)r * 2 * dim, ref + (size_t)r * 2 * dim + dim, do_f + (size_t)r * lddo,
                            gu_f + (size_t)r * ldgu, gu_f + (size_t)r * ldgu + dim, (size_t)dim);
    uint16_t *d_gu = dev_upload(gu, ng * 2), *d_do = dev_upload(dout, nd * 2);
    uint16_t *d_dgu = in_place ? d_gu : dev_upload(NULL, ndg * 2);
    uint16_t *got[2];
    for (int run = 0; run < 2; run++) {
        if (in_place) dev_put(d_gu, gu, ng * 2);
        else CHECK_CUDA(cudaMemset(d_dgu, 0xff, ndg * 2)); /* NaN poison: an unwritten element fails */
        swiglu_backward_cuda(d_dgu, lddgu, d_do, lddo, d_gu, ldgu, rows, dim, stream);
        got[run] = dev_get(d_dgu, ndg * 2);
    }
    double mx = 0, e = err_bf16(got[0], lddgu, ref, 2 * dim, rows, 2 * dim, &mx);
    char name[200];
    snprintf(name, sizeof name, "swiglu_backward_cuda rows=%d dim=%d ldgu=%d lddout=%d%s", rows, dim, ldgu, lddo,
             in_place ? " in_place" : "");
    kc_report(name, e, 0x1p-8 * mx); /* one bf16 rounding per output; expf within 2 ulp of the CPU's */
    report_same_bits(name, got[0], got[1], ndg * 2, 0);
    CHECK_CUDA(cudaFree(d_gu)); CHECK_CUDA(cudaFree(d_do));
    if (!in_place) CHECK_CUDA(cudaFree(d_dgu));
    free(gu_f), free(do_f), free(ref), free(gu), free(dout), free(got[0]), free(got[1]);
}

/* table_offset shifts the table by some elements to exercise the unaligned (scalar) path. */
static void embedding_cuda_check(const kc_case *c)
{
    int vocab = c->p[0], dim = c->p[1], n = c->p[2], table_offset = c->p[3];
    size_t tn = (size_t)vocab * dim + table_offset;
    float *table_f = xmalloc(tn * sizeof *table_f);
    uint16_t *table = rnd_bf16(tn, 4.0, table_f);
    int32_t *ids = embedding_ids(vocab, n);
    float *ref = xmalloc((size_t)(n ? n : 1) * dim * sizeof *ref);
    embedding_forward_cpu(ref, ids, n, table_f + table_offset, vocab, dim);

    uint16_t *d_table = dev_upload(table, tn * sizeof *table);
    int32_t *d_ids = dev_upload(ids, (size_t)n * sizeof *ids);
    size_t on = (size_t)n * dim;
    uint16_t *d_out = dev_upload(NULL, on * sizeof(uint16_t) + 16);
    embedding_forward_cuda(d_out, d_ids, n, d_table + table_offset, dim, stream);
    uint16_t *out = dev_get(d_out, on * sizeof *out);

    double err = 0;
    for (size_t i = 0; i < on; i++) err = fmax(err, fabs(bf16_to_f32(out[i]) - ref[i]));
    char name[128];
    snprintf(name, sizeof name, "embedding_forward_cuda vocab=%d dim=%d n=%d offset=%d", vocab, dim, n,
             table_offset);
    kc_report(name, err, 0.0); /* a gather is exact */

    CHECK_CUDA(cudaFree(d_table));
    CHECK_CUDA(cudaFree(d_ids));
    CHECK_CUDA(cudaFree(d_out));
    free(table_f), free(table), free(ids), free(ref), free(out);
}

/* cast_f32_bf16_cuda against its CPU reference: bit-identical (NaN and the aligned/unaligned paths included). */
static void cast_cuda_check(const kc_case *c)
{
    size_t n = (size_t)c->p[0], offset = (size_t)c->p[1];
    float *x = rnd_f32(n + offset, 3.0, 0.0);
    if (n > 2) x[offset + 1] = NAN;
    uint16_t *want = xmalloc(2 * n);
    cast_f32_bf16_cpu(want, x + offset, n);
    float *d_x = dev_upload(x, sizeof(float) * (n + offset));
    uint16_t *d_y = dev_upload(NULL, 2 * n + 2);
    cast_f32_bf16_cuda(d_y, d_x + offset, n, stream);
    uint16_t *got = dev_get(d_y, 2 * n);
    double diff = 0;
    for (size_t i = 0; i < n; i++) diff += got[i] != want[i];
    char name[96];
    snprintf(name, sizeof name, "cast_f32_bf16_cuda n=%zu offset=%zu (elements not bit-identical)", n, offset);
    kc_report(name, diff, 0);
    free(x); free(want); free(got);
    CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_y));
}

/* colsum_add_cuda against its CPU reference (same order): bit-identical. */
static void colsum_cuda_check(const kc_case *c)
{
    int nparts = c->p[0], dim = c->p[1];
    float *part = rnd_f32((size_t)nparts * dim, 1.0, 0.0), *dw = rnd_f32((size_t)dim, 1.0, 0.0);
    float *d_part = dev_upload(part, sizeof(float) * (size_t)nparts * dim), *d_dw = dev_upload(dw, sizeof(float) * dim);
    colsum_add_cpu(dw, part, nparts, dim);
    colsum_add_cuda(d_dw, d_part, nparts, dim, stream);
    float *got = dev_get(d_dw, sizeof(float) * dim);
    double diff = 0;
    for (int k = 0; k < dim; k++) diff += memcmp(&got[k], &dw[k], 4) != 0;
    char name[96];
    snprintf(name, sizeof name, "colsum_add_cuda nparts=%d dim=%d (elements not bit-identical)", nparts, dim);
    kc_report(name, diff, 0);
    free(part); free(dw); free(got);
    CHECK_CUDA(cudaFree(d_part)); CHECK_CUDA(cudaFree(d_dw));
}

/* n seed scale_milli bias_milli */
static void rand_fill_cuda_check(const kc_case *c)
{
    size_t n = (size_t)c->p[0];
    uint64_t seed = (uint64_t)c->p[1];
    float scale = c->p[2] / 1000.0f, bias = c->p[3] / 1000.0f;
    uint16_t *ref = xmalloc(n * 2), *d = dev_poisoned(n);
    rand_fill_bf16_cpu(ref, n, seed, scale, bias);
    rand_fill_bf16_cuda(d, n, seed, scale, bias, stream);
    uint16_t *got = dev_get(d, (n) * 2);
    size_t diff = 0;
    for (size_t i = 0; i < n; i++) diff += got[i] != ref[i];
    char name[128];
    snprintf(name, sizeof name, "rand_fill_bf16_cuda n=%zu (elements differing from the CPU)", n);
    kc_report(name, (double)diff, 0.0);
    CHECK_CUDA(cudaFree(d));
    free(ref), free(got);
}

/* The memory-bound kernels of one dense target layer (target_dense_cuda + attn_block_cuda) at bench_target's Qwen3-8B
 * shape (19218 tokens, hidden 4096, 32/8 heads of 128, intermediate 12288): per kernel the time, the bytes it must
 * move (each operand read once, each output written once) and the rate; the sum is the "other kernels" share of one
 * layer in bench_target's time split. */
#define HBM_GBS 4800.0 /* H200 peak bandwidth, GB/s */
void kc_time_dense_layer_other(void)
{
    const int T = 19218, H = 4096, nh = 32, nkv = 8, hd = 128, I = 12288, qkvw = (nh + 2 * nkv) * hd;
    uint16_t *d_x = dev_upload(NULL, (size_t)T * H * 2), *d_u = dev_upload(NULL, (size_t)T * H * 2);
    uint16_t *d_w = dev_upload(NULL, (size_t)H * 2), *d_qkv = dev_upload(NULL, (size_t)T * qkvw * 2);
    uint16_t *d_gu = dev_upload(NULL, (size_t)T * 2 * I * 2), *d_act = dev_upload(NULL, (size_t)T * I * 2);
    rand_fill_bf16_cuda(d_x, (size_t)T * H, 1, 2.0f, 0.0f, stream);
    rand_fill_bf16_cuda(d_w, (size_t)H, 2, 0.0f, 1.0f, stream);
    rand_fill_bf16_cuda(d_qkv, (size_t)T * qkvw, 3, 2.0f, 0.0f, stream);
    rand_fill_bf16_cuda(d_gu, (size_t)T * 2 * I, 4, 2.0f, 0.0f, stream);
    int32_t *pos = xmalloc((size_t)T * 4);
    for (int t = 0; t < T; t++) pos[t] = t % 2048;
    double inv[64];
    rope_params rp = {.theta = 1e6};
    rope_inv_freq(inv, hd, &rp);
    int32_t *d_pos = dev_upload(pos, (size_t)T * 4);
    double *d_inv = dev_upload(inv, sizeof inv);
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a)); CHECK_CUDA(cudaEventCreate(&b));
    const char *names[3] = {"rmsnorm_forward_cuda (x -> u, hidden 4096)", "qk_norm_rope_cuda (q|k of qkv in place)",
                            "swiglu_forward_cuda (gate|up -> act)"};
    const double bytes[3] = {2.0 * T * H * 2, 2.0 * T * (nh + nkv) * hd * 2, 3.0 * T * I * 2};
    double total_ms = 0, total_bytes = 0;
    for (int k = 0; k < 3; k++) {
        const int iters = 20;
        for (int i = -1; i < iters; i++) {
            if (i == 0) CHECK_CUDA(cudaEventRecord(a, stream));
            if (k == 0) rmsnorm_forward_cuda(d_u, H, d_x, H, d_w, T, H, 1e-6f, stream);
            if (k == 1)
                qk_norm_rope_cuda(d_qkv, qkvw, d_qkv + nh * hd, qkvw, T, nh, nkv, hd, d_w, d_w, 1e-6f, d_pos, d_inv,
                                  stream);
            if (k == 2) swiglu_forward_cuda(d_act, I, d_gu, 2 * I, T, I, stream);
        }
        CHECK_CUDA(cudaEventRecord(b, stream));
        double ms = elapsed_ms(a, b) / iters;
        total_ms += (k == 0 ? 2 : 1) * ms, total_bytes += (k == 0 ? 2 : 1) * bytes[k];
        printf("timing %s T=%d: %.1f us, %.0f GB/s (%.0f%% of %.0f GB/s)\n", names[k], T, ms * 1e3,
               bytes[k] / ms / 1e6, 100.0 * bytes[k] / ms / 1e6 / HBM_GBS, HBM_GBS);
    }
    printf("timing one dense layer's memory-bound kernels (2 rmsnorm + qk_norm_rope + swiglu): %.1f us, %.0f GB/s; "
           "x 36 layers %.1f ms (at %.0f GB/s: %.1f ms)\n", total_ms * 1e3, total_bytes / total_ms / 1e6,
           36 * total_ms, HBM_GBS, 36 * total_bytes / HBM_GBS / 1e6);
    CHECK_CUDA(cudaEventDestroy(a)); CHECK_CUDA(cudaEventDestroy(b));
    void *f[] = {d_x, d_u, d_w, d_qkv, d_gu, d_act, d_pos, d_inv};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) CHECK_CUDA(cudaFree(f[i]));
    free(pos);
}
#endif

const kc_op kc_swiglu_forward = {"swiglu_forward", "bf16", "rows dim ldo", swiglu_forward_cpu_check,
                                 KC_CUDA(swiglu_forward_cuda_check)};
const kc_op kc_swiglu_backward = {"swiglu_backward", "bf16", "rows dim ldgu lddo in_place", swiglu_backward_cpu_check,
                                  KC_CUDA(swiglu_backward_cuda_check)};
const kc_op kc_embedding_forward = {"embedding_forward", "bf16", "vocab dim n offset", embedding_cpu_check,
                                    KC_CUDA(embedding_cuda_check)};
const kc_op kc_embedding_rejects = {"embedding_rejects_out_of_range_id", "f32", "", embedding_rejects_cpu_check, NULL};
const kc_op kc_cast_f32_bf16 = {"cast_f32_bf16", "f32->bf16", "n offset", cast_cpu_check, KC_CUDA(cast_cuda_check)};
const kc_op kc_colsum_add = {"colsum_add", "f32", "nparts dim", colsum_cpu_check, KC_CUDA(colsum_cuda_check)};
const kc_op kc_rand_fill = {"rand_fill", "bf16", "n seed scale_milli bias_milli", rand_fill_cpu_check,
                            KC_CUDA(rand_fill_cuda_check)};
