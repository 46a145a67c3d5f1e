/* matmul_swiglu: act = swiglu(x · w_guᵀ), the gate|up GEMM with SwiGLU in its epilogue. CPU: the reference's gu
 * against a naive double sum (bf16 values, one rounding), its act against silu(gate) * up of those gu values in double,
 * the padding columns of act untouched. CUDA (sm_90a): the fused kernel against the CPU reference, against the
 * two-kernel path it replaces (cuBLASLt gu + swiglu_forward_cuda: a tolerance, and nearly every value the same bits,
 * the accumulation orders differing only in rare roundings of gate or up), nothing written past the (T, I) block; the
 * driver checks two runs bitwise; a row names its schedule (kernel: matmul_swiglu.h's MATMUL_SWIGLU_*), the
 * cooperative one's bits the others' (the TMA-store twins too: the same epilogue arithmetic). Timing: every schedule
 * against cuBLASLt gate|up + swiglu at Qwen3-8B's shape. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "matmul.h"
#include "matmul_swiglu.h"
#include "swiglu.h"
#include "tests/kernel_cases.h"
#include "tests/test.h"
#include "util.h"
#ifdef DFLASH_CUDA
#include "rand_fill.h"
#endif

/* ---- T I H ldx ldact kernel (the CPU check: the reference, whatever the schedule) ---- */

static void matmul_swiglu_cpu_check(const kc_case *c)
{
    const int T = c->p[0], I = c->p[1], H = c->p[2], ldx = c->p[3], ldact = c->p[4];
    float *x = rnd_floats((size_t)T * ldx, 1.0), *w = rnd_floats((size_t)2 * I * H, 0.5);
    float *act = rnd_floats((size_t)T * ldact, 1.0), *act0 = dup_floats(act, (size_t)T * ldact);
    float *gu = xmalloc(sizeof(float) * (size_t)T * 2 * I);
    matmul_swiglu_forward_cpu(act, ldact, gu, x, ldx, w, T, I, H);
    double worst_gu = 0, worst_act = 0;
    size_t not_bf16 = 0, touched = 0;
    for (int r = 0; r < T; r++) {
        for (int j = 0; j < 2 * I; j++) {
            double ref = 0, mag = 0;
            for (int e = 0; e < H; e++) {
                const double p = (double)x[(size_t)r * ldx + e] * w[(size_t)j * H + e];
                ref += p, mag += fabs(p);
            }
            const float v = gu[(size_t)r * 2 * I + j];
            not_bf16 += bf16_to_f32(f32_to_bf16(v)) != v;
            /* one bf16 rounding (at most 2^-8 of the value) of an fp32 sum */
            worst_gu = fmax(worst_gu, fabs(v - ref) / (ldexp(fabs(ref), -8) + 1e-5 * mag + 1e-30));
        }
        for (int j = 0; j < ldact; j++) {
            const size_t o = (size_t)r * ldact + j;
            if (j >= I) { /* padding columns are untouched */
                touched += act[o] != act0[o];
                continue;
            }
            const double g = gu[(size_t)r * 2 * I + j], u = gu[(size_t)r * 2 * I + I + j];
            const double e = g / (1.0 + exp(-g)) * u;
            worst_act = fmax(worst_act, fabs(act[o] - e) / (1e-5 * fabs(e) + 1e-30));
        }
    }
    EXPECT(not_bf16 == 0);
    EXPECT(worst_gu <= 1.0);
    EXPECT(worst_act <= 1.0);
    EXPECT(touched == 0);
    free(x), free(w), free(act), free(act0), free(gu);
}

#ifdef DFLASH_CUDA
static matmul_cuda *the_mm(void)
{
    static matmul_cuda *mm;
    if (!mm) mm = matmul_cuda_create(0);
    return mm;
}

/* every schedule, in the order the timing runs them (the clusters' last: a hang there loses the least); the names
 * are matmul_swiglu_kernel_name's */
static const int ms_kernels[] = {MATMUL_SWIGLU_COOPERATIVE,         MATMUL_SWIGLU_PINGPONG,
                                 MATMUL_SWIGLU_PINGPONG_TMASTORE,   MATMUL_SWIGLU_PINGPONG_WIDE,
                                 MATMUL_SWIGLU_COOPERATIVE_TMASTORE, MATMUL_SWIGLU_CLUSTER,
                                 MATMUL_SWIGLU_CLUSTER_TMASTORE};
enum { MS_NKERNELS = (int)(sizeof ms_kernels / sizeof ms_kernels[0]) };
_Static_assert(MS_NKERNELS == MATMUL_SWIGLU_NKERNELS - 1, "the timing runs every schedule");

static const char *ms_kernel_name(int kernel)
{
    const char *n = matmul_swiglu_kernel_name(kernel);
    return n ? n : "unknown";
}

/* The row's schedule against the CPU reference and the two-kernel path; any other than the cooperative one also
 * against the cooperative one's bits. */
static void matmul_swiglu_cuda_check(const kc_case *kc)
{
    const int T = kc->p[0], I = kc->p[1], H = kc->p[2], ldx = kc->p[3], ldact = kc->p[4], kernel = kc->p[5];
    const size_t nx = (size_t)T * ldx, nw = (size_t)2 * I * H, nact = (size_t)T * ldact, n = (size_t)T * I;
    /* act with a tile's worth of poisoned rows past T: a store of a row >= T shows */
    const size_t nall = nact + (size_t)128 * ldact;
    float *x_f = xmalloc(nx * 4), *w_f = xmalloc(nw * 4);
    uint16_t *x = rnd_bf16(nx, 1.0, x_f), *w = rnd_bf16(nw, 0.5, w_f);
    uint16_t *d_x = dev_upload(x, nx * 2), *d_w = dev_upload(w, nw * 2), *d_act = dev_poisoned(nall);
    char name[300], shape[160];
    snprintf(shape, sizeof shape, "%s T=%d I=%d H=%d ldx=%d ldact=%d", ms_kernel_name(kernel), T, I, H, ldx, ldact);
    if (!matmul_swiglu_cuda_takes(d_act, ldact, d_x, ldx, d_w, T, I, H)) {
        kc_skip("matmul_swiglu_forward_cuda runs on sm_90 devices whose driver makes tensor maps");
    } else {
        float *gu_ref = xmalloc(sizeof(float) * (size_t)T * 2 * I), *ref = xmalloc(sizeof(float) * n);
        matmul_swiglu_forward_cpu(ref, I, gu_ref, x_f, ldx, w_f, T, I, H);
        /* the path it replaces: cuBLASLt gu (T, 2I), then swiglu */
        uint16_t *d_gu = dev_poisoned((size_t)T * 2 * I), *d_act2 = dev_poisoned(nact);
        matmul_forward_cuda(the_mm(), d_gu, 2 * I, NULL, 0, 0.0f, d_x, ldx, d_w, T, 2 * I, H, stream);
        swiglu_forward_cuda(d_act2, ldact, d_gu, 2 * I, T, I, stream);
        uint16_t *got2 = dev_get(d_act2, nact * 2);
        float *unfused = xmalloc(n * 4);
        for (int r = 0; r < T; r++)
            for (int j = 0; j < I; j++) unfused[(size_t)r * I + j] = bf16_to_f32(got2[(size_t)r * ldact + j]);
        uint16_t *blk = xmalloc(n * 2);
        matmul_swiglu_forward_cuda_with(kernel, d_act, ldact, d_x, ldx, d_w, T, I, H, stream);
        uint16_t *got = dev_get(d_act, nall * 2);
        size_t stray = 0, differ = 0;
        for (int r = 0; r < T + 128; r++)
            for (int j = 0; j < ldact; j++) {
                const size_t o = (size_t)r * ldact + j;
                if (r < T && j < I) blk[(size_t)r * I + j] = got[o], differ += got[o] != got2[o];
                else stray += got[o] != 0xffff;
            }
        snprintf(name, sizeof name, "matmul_swiglu_forward_cuda %s against the CPU reference", shape);
        compare_bf16(name, blk, ref, n, 8e-3, 2e-2); /* gate|up's rounding, then the output's (as gemv_rmsnorm_swiglu) */
        snprintf(name, sizeof name, "matmul_swiglu_forward_cuda %s against cuBLASLt gu + swiglu_forward_cuda", shape);
        compare_bf16(name, blk, unfused, n, 8e-3, 2e-2);
        /* the same arithmetic as the two-kernel path: a value differs only where the two accumulation orders round
         * gate or up to different bf16 values (fp32 sums ~1e-7 apart against a bf16 step of 4e-3: rare) */
        snprintf(name, sizeof name,
                 "matmul_swiglu_forward_cuda %s: share of act values not bitwise those of cuBLASLt gu + swiglu "
                 "(%zu of %zu)", shape, differ, n);
        kc_report(name, (double)differ / (double)n, 0.01);
        snprintf(name, sizeof name, "matmul_swiglu_forward_cuda %s: values written past the (T, I) block (columns "
                 "to ldact, 128 rows past T)", shape);
        kc_report(name, (double)stray, 0.0);
        if (kernel != MATMUL_SWIGLU_COOPERATIVE) { /* the same k order per output: the same bits */
            uint16_t *d_act3 = dev_poisoned(nact);
            matmul_swiglu_forward_cuda_with(MATMUL_SWIGLU_COOPERATIVE, d_act3, ldact, d_x, ldx, d_w, T, I, H, stream);
            uint16_t *coop = dev_get(d_act3, nact * 2);
            snprintf(name, sizeof name, "matmul_swiglu_forward_cuda %s against the cooperative schedule", shape);
            report_same_bits(name, coop, got, nact * 2, 0);
            CHECK_CUDA(cudaFree(d_act3));
            free(coop);
        }
        free(got);
        CHECK_CUDA(cudaFree(d_gu));
        CHECK_CUDA(cudaFree(d_act2));
        free(gu_ref), free(ref), free(got2), free(blk), free(unfused);
    }
    CHECK_CUDA(cudaFree(d_x));
    CHECK_CUDA(cudaFree(d_w));
    CHECK_CUDA(cudaFree(d_act));
    free(x_f), free(w_f), free(x), free(w);
}

/* Timing at bench_target's Qwen3-8B MLP shape (19218 tokens, hidden 4096, intermediate 12288): cuBLASLt gate|up,
 * swiglu_forward_cuda, the two together (the path of today) and the fused kernel's schedules, each with its
 * TFLOP/s of the gate|up GEMM's 2·T·2I·H; then the fused act against the two-kernel act at this shape (a tolerance,
 * the share of values that differ), the other schedules' bits against the cooperative one's, and that one twice
 * bitwise. */
void kc_time_matmul_swiglu(void)
{
    const int T = 19218, H = 4096, I = 12288, iters = 10;
    const size_t nx = (size_t)T * H, nw = (size_t)2 * I * H, ngu = (size_t)T * 2 * I, n = (size_t)T * I;
    uint16_t *d_x = dev_upload(NULL, nx * 2), *d_w = dev_upload(NULL, nw * 2), *d_gu = dev_upload(NULL, ngu * 2);
    uint16_t *d_act = dev_upload(NULL, n * 2), *d_act2 = dev_upload(NULL, n * 2);
    if (!matmul_swiglu_cuda_takes(d_act, I, d_x, H, d_w, T, I, H)) {
        printf("timing matmul_swiglu: skipped, matmul_swiglu_forward_cuda runs on sm_90 devices whose driver makes "
               "tensor maps\n");
    } else {
        rand_fill_bf16_cuda(d_x, nx, 11, 2.0f, 0.0f, stream);      /* about a normalised activation */
        rand_fill_bf16_cuda(d_w, nw, 12, 0.03f, 0.0f, stream);     /* about 1/sqrt(H), as a trained projection */
        matmul_cuda *mm = the_mm();
        cudaEvent_t a, b;
        CHECK_CUDA(cudaEventCreate(&a));
        CHECK_CUDA(cudaEventCreate(&b));
        const double flops = 2.0 * T * 2.0 * I * H;
        enum { NT = 3 + MS_NKERNELS };
        const char *names[NT] = {"cuBLASLt gate|up (matmul_forward_cuda)", "swiglu_forward_cuda",
                                 "cuBLASLt gate|up + swiglu_forward_cuda (today's path)"};
        char knames[MS_NKERNELS][64];
        for (int k = 0; k < MS_NKERNELS; k++) {
            snprintf(knames[k], sizeof knames[k], "matmul_swiglu_forward_cuda %s", ms_kernel_name(ms_kernels[k]));
            names[3 + k] = knames[k];
        }
        double ms[NT];
        uint16_t *got[MS_NKERNELS];
        for (int k = 0; k < NT; k++) {
            for (int i = -1; i < iters; i++) { /* one warm-up */
                if (i == 0) CHECK_CUDA(cudaEventRecord(a, stream));
                if (k == 0 || k == 2) matmul_forward_cuda(mm, d_gu, 2 * I, NULL, 0, 0.0f, d_x, H, d_w, T, 2 * I, H, stream);
                if (k == 1 || k == 2) swiglu_forward_cuda(d_act2, I, d_gu, 2 * I, T, I, stream);
                if (k >= 3)
                    matmul_swiglu_forward_cuda_with(ms_kernels[k - 3], d_act, I, d_x, H, d_w, T, I, H, stream);
            }
            CHECK_CUDA(cudaEventRecord(b, stream));
            ms[k] = elapsed_ms(a, b) / iters;
            if (k == 1) printf("timing %s T=%d I=%d: %.3f ms\n", names[k], T, I, ms[k]);
            else
                printf("timing %s T=%d H=%d I=%d: %.3f ms, %.0f TFLOP/s\n", names[k], T, H, I, ms[k],
                       flops / ms[k] / 1e9);
            fflush(stdout);
            if (k >= 3) got[k - 3] = dev_get(d_act, n * 2);
        }
        for (int k = 3; k < NT; k++)
            printf("timing matmul_swiglu: %s %.3f ms against %.3f ms (%+.1f%%); x 36 layers %+.1f ms\n",
                   names[k], ms[k], ms[2], 100.0 * (ms[k] - ms[2]) / ms[2], 36.0 * (ms[k] - ms[2]));
        uint16_t *got2 = dev_get(d_act2, n * 2);
        float *unfused = xmalloc(n * 4);
        size_t differ = 0;
        for (size_t i = 0; i < n; i++) unfused[i] = bf16_to_f32(got2[i]), differ += got[0][i] != got2[i];
        char name[200];
        snprintf(name, sizeof name, "matmul_swiglu_forward_cuda T=%d I=%d H=%d against cuBLASLt gu + swiglu", T, I, H);
        compare_bf16(name, got[0], unfused, n, 8e-3, 2e-2);
        snprintf(name, sizeof name,
                 "matmul_swiglu_forward_cuda T=%d I=%d H=%d: share of act values not bitwise the two-kernel path's "
                 "(%zu of %zu)", T, I, H, differ, n);
        kc_report(name, (double)differ / (double)n, 0.01);
        for (int k = 1; k < MS_NKERNELS; k++) {
            snprintf(name, sizeof name, "matmul_swiglu_forward_cuda %s against cooperative T=%d I=%d H=%d",
                     ms_kernel_name(ms_kernels[k]), T, I, H);
            report_same_bits(name, got[0], got[k], n * 2, 0);
        }
        matmul_swiglu_forward_cuda_with(MATMUL_SWIGLU_COOPERATIVE, d_act, I, d_x, H, d_w, T, I, H, stream);
        uint16_t *again = dev_get(d_act, n * 2);
        snprintf(name, sizeof name, "matmul_swiglu_forward_cuda T=%d I=%d H=%d", T, I, H);
        report_same_bits(name, got[0], again, n * 2, 0);
        CHECK_CUDA(cudaEventDestroy(a));
        CHECK_CUDA(cudaEventDestroy(b));
        for (int k = 0; k < MS_NKERNELS; k++) free(got[k]);
        free(got2), free(again), free(unfused);
    }
    void *f[] = {d_x, d_w, d_gu, d_act, d_act2};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) CHECK_CUDA(cudaFree(f[i]));
}
#endif

const kc_op kc_matmul_swiglu = {"matmul_swiglu", "bf16", "T I H ldx ldact kernel", matmul_swiglu_cpu_check,
                                KC_CUDA(matmul_swiglu_cuda_check)};
