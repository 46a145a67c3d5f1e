/* The tensor-core chunked gated delta rule (gated_delta_chunk) against the CPU recurrence (run on the GPU machine).
 * q and k are l2-normalised (q also scaled by dk^-½) in fp32 and rounded to bf16, v is bf16; the CPU reference runs on
 * the same bf16 values with the same fp32 g and beta. Bounds, in units of max|ref| over the case:
 *   exact mode (fp32 operands split into bf16 hi + lo): max error <= 2^-7 (the output's own bf16 rounding is
 *   2^-9 of a value; the rest is fp32 summation order), relative norm <= 2^-8;
 *   bf16 mode (operands rounded once, fla's precision): max error <= 2^-5, relative norm <= 2^-6.
 * Cases: packed sequences of 1, 63, 64, 65, 200, 0, 129 and 7 tokens (chunk boundaries, a state crossing chunks, an
 * empty sequence), one-token sequences only, grouped value heads (hv/hk = 2, 4), the Qwen3.5 heads (16 k x 32 v of
 * 128) on three benchmark-length sequences, dk = 256, value dims that do not fill the value tile (40, 24) or are not a
 * multiple of 8 (20: the plain-load path), odd row strides (the plain-load path), a 3000-token sequence without decay
 * (g = 0) and a huge decay (g = -60), 600 sequences (more than the kernel sorts by length), and dk = 64 (handed to
 * the older kernel); the decoding entry (states carried in and out through slots, once). Every packed case runs twice: the two outputs must be bitwise equal (determinism). Prints "ok <case> ..." / "FAIL <case> ..."; exit status 0 only when all pass. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gated_delta_chunk.h"
#include "gated_delta_rule.h"
#include "gpu_test.h"

/* n rows of `heads` vectors of dim d (row stride ld), l2-normalised and scaled, rounded to bf16 (and back in f). */
static uint16_t *rnd_unit_rows(int n, int ld, int heads, int d, float scale, float *f)
{
    uint16_t *h = xcalloc((size_t)n * ld + 8, sizeof *h);
    float *tmp = xmalloc(sizeof(float) * (size_t)d);
    for (int t = 0; t < n; t++)
        for (int hh = 0; hh < heads; hh++) {
            double ss = 0;
            for (int i = 0; i < d; i++) {
                tmp[i] = (float)rnd_uniform();
                ss += (double)tmp[i] * tmp[i];
            }
            float inv = (float)(1.0 / sqrt(ss + 1e-6)) * scale;
            for (int i = 0; i < d; i++) {
                size_t at = (size_t)t * ld + (size_t)hh * d + i;
                h[at] = f32_to_bf16(tmp[i] * inv);
                f[at] = bf16_to_f32(h[at]);
            }
        }
    free(tmp);
    return h;
}

enum { G_RANDOM, G_ZERO, G_HUGE };
enum { STRIDE_ALIGNED, STRIDE_ODD };

static void check(const char *name, const int *lens, int nseq, int hk, int hv, int dk, int dv, int g_mode, int stride)
{
    int32_t *cu = xmalloc(sizeof(int32_t) * (size_t)(nseq + 1));
    cu[0] = 0;
    for (int s = 0; s < nseq; s++) cu[s + 1] = cu[s] + lens[s];
    const int T = cu[nseq], odd = stride == STRIDE_ODD;
    const int ldq = hk * dk + (odd ? 3 : 8), ldk = hk * dk + (odd ? 1 : 0), ldv = hv * dv + (odd ? 5 : 8);
    const int ldo = hv * dv + (odd ? 1 : 0), ldg = hv, ldb = hv + (odd ? 1 : 0);
    float *qf = xcalloc((size_t)T * ldq + 8, sizeof(float)), *kf = xcalloc((size_t)T * ldk + 8, sizeof(float));
    float *vf = xcalloc((size_t)T * ldv + 8, sizeof(float));
    uint16_t *qh = rnd_unit_rows(T, ldq, hk, dk, 1.0f / sqrtf((float)dk), qf);
    uint16_t *kh = rnd_unit_rows(T, ldk, hk, dk, 1.0f, kf);
    uint16_t *vh = xcalloc((size_t)T * ldv + 8, sizeof *vh);
    for (size_t i = 0; i < (size_t)T * ldv; i++) {
        vh[i] = f32_to_bf16((float)(2.0 * rnd_uniform()));
        vf[i] = bf16_to_f32(vh[i]);
    }
    float *g = xcalloc((size_t)T * ldg + 1, sizeof(float)), *beta = xcalloc((size_t)T * ldb + 1, sizeof(float));
    for (int t = 0; t < T; t++)
        for (int h = 0; h < hv; h++) {
            g[(size_t)t * ldg + h] = g_mode == G_ZERO   ? 0.0f
                                     : g_mode == G_HUGE ? -60.0f
                                                        : (float)(-0.01 - 0.745 * (rnd_uniform() + 1.0));
            beta[(size_t)t * ldb + h] = (float)(0.5 * (rnd_uniform() + 1.0));
        }
    float *ref = xcalloc((size_t)T * ldo + 1, sizeof(float));
    gated_delta_rule_forward_cpu(ref, ldo, qf, ldq, kf, ldk, vf, ldv, g, ldg, beta, ldb, cu, nseq, hk, hv, dk, dv);

    uint16_t *d_q = dev_upload(qh, sizeof *qh * (size_t)T * ldq), *d_k = dev_upload(kh, sizeof *kh * (size_t)T * ldk);
    uint16_t *d_v = dev_upload(vh, sizeof *vh * (size_t)T * ldv);
    float *d_g = dev_upload(g, sizeof *g * (size_t)T * ldg), *d_b = dev_upload(beta, sizeof *beta * (size_t)T * ldb);
    int32_t *d_cu = dev_upload(cu, sizeof *cu * (size_t)(nseq + 1));
    const size_t no = (size_t)T * ldo;
    for (int mode = GATED_DELTA_CHUNK_EXACT; mode <= GATED_DELTA_CHUNK_BF16; mode++) {
        uint16_t *d_out[2], *out[2];
        for (int run = 0; run < 2; run++) {
            d_out[run] = dev_poisoned(no);
            gated_delta_chunk_forward_mode_cuda(d_out[run], ldo, d_q, ldq, d_k, ldk, d_v, ldv, d_g, ldg, d_b, ldb,
                                                d_cu, nseq, hk, hv, dk, dv, mode, stream);
            out[run] = dev_get(d_out[run], no * sizeof(uint16_t));
        }
        double err = 0, mx = 0, se = 0, sr = 0;
        int finite = 1;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < hv * dv; j++) {
                const size_t i = (size_t)t * ldo + j;
                const double o = bf16_to_f32(out[0][i]), r = ref[i];
                if (!isfinite(o)) finite = 0;
                err = fmax(err, fabs(o - r)), mx = fmax(mx, fabs(r));
                se += (o - r) * (o - r), sr += r * r;
            }
        const int same = !memcmp(out[0], out[1], no * sizeof(uint16_t));
        const double tol = (mode == GATED_DELTA_CHUNK_EXACT ? 0x1p-7 : 0x1p-5) * mx + 1e-6;
        const double tol_norm = mode == GATED_DELTA_CHUNK_EXACT ? 0x1p-8 : 0x1p-6;
        const double nrel = sr > 0 ? sqrt(se / sr) : sqrt(se);
        const int ok = finite && same && err <= tol && nrel <= tol_norm;
        printf("%s gated_delta_chunk %s %s T=%d nseq=%d hk=%d hv=%d dk=%d dv=%d%s max_err=%.3g tol=%.3g "
               "norm_rel=%.3g tol=%.3g max|ref|=%.3g%s%s\n",
               ok ? "ok" : "FAIL", name, mode == GATED_DELTA_CHUNK_EXACT ? "exact" : "bf16", T, nseq, hk, hv, dk, dv,
               odd ? " odd-strides" : "", err, tol, nrel, tol_norm, mx, finite ? "" : " (non-finite output)",
               same ? "" : " (two runs differ)");
        fflush(stdout);
        if (!ok) failures++;
        for (int run = 0; run < 2; run++) {
            CHECK_CUDA(cudaFree(d_out[run]));
            free(out[run]);
        }
    }
    CHECK_CUDA(cudaFree(d_q)); CHECK_CUDA(cudaFree(d_k)); CHECK_CUDA(cudaFree(d_v));
    CHECK_CUDA(cudaFree(d_g)); CHECK_CUDA(cudaFree(d_b)); CHECK_CUDA(cudaFree(d_cu));
    free(cu); free(qf); free(kf); free(vf); free(qh); free(kh); free(vh); free(g); free(beta); free(ref);
}

/* Decoding (gated_delta_chunk_forward_state_cuda): sequences continuing from random states in slots (in[s], -1: a
 * start), the states after them to other slots (an empty sequence copies its state across); outputs against
 * gated_delta_rule_forward_state_cpu per sequence within the exact mode's bounds, the states within 1e-3 of the
 * largest (fp32 against fp32: summation order only), the slots nobody writes untouched. */
static void check_state(const char *name, const int *lens, int nseq, const int32_t *in, const int32_t *out,
                        int nslots, int hk, int hv, int dk, int dv)
{
    int32_t *cu = xmalloc(sizeof(int32_t) * (size_t)(nseq + 1));
    int maxlen = 0;
    cu[0] = 0;
    for (int s = 0; s < nseq; s++) cu[s + 1] = cu[s] + lens[s], maxlen = lens[s] > maxlen ? lens[s] : maxlen;
    const int T = cu[nseq], ldq = hk * dk, ldv = hv * dv, ldo = hv * dv, ldg = hv;
    const size_t sn = (size_t)hv * dk * dv, ns = sn * (size_t)nslots;
    float *qf = xcalloc((size_t)T * ldq + 8, sizeof(float)), *kf = xcalloc((size_t)T * ldq + 8, sizeof(float));
    float *vf = xcalloc((size_t)T * ldv + 8, sizeof(float));
    uint16_t *qh = rnd_unit_rows(T, ldq, hk, dk, 1.0f / sqrtf((float)dk), qf);
    uint16_t *kh = rnd_unit_rows(T, ldq, hk, dk, 1.0f, kf);
    uint16_t *vh = xcalloc((size_t)T * ldv + 8, sizeof *vh);
    for (size_t i = 0; i < (size_t)T * ldv; i++) vh[i] = f32_to_bf16((float)(2.0 * rnd_uniform())), vf[i] = bf16_to_f32(vh[i]);
    float *g = xcalloc((size_t)T * hv + 1, sizeof(float)), *beta = xcalloc((size_t)T * hv + 1, sizeof(float));
    for (size_t i = 0; i < (size_t)T * hv; i++) {
        g[i] = (float)(-0.01 - 0.2 * (rnd_uniform() + 1.0));
        beta[i] = (float)(0.5 * (rnd_uniform() + 1.0));
    }
    float *states = xmalloc(sizeof(float) * ns), *want = xmalloc(sizeof(float) * ns), *S = xmalloc(sizeof(float) * sn);
    for (size_t i = 0; i < ns; i++) states[i] = (float)(0.5 * rnd_uniform());
    memcpy(want, states, sizeof(float) * ns);
    float *ref = xcalloc((size_t)T * ldo + 1, sizeof(float));
    for (int s = 0; s < nseq; s++) {
        if (in[s] >= 0) memcpy(S, states + (size_t)in[s] * sn, sizeof(float) * sn);
        else memset(S, 0, sizeof(float) * sn);
        const size_t t0 = (size_t)cu[s];
        gated_delta_rule_forward_state_cpu(ref + t0 * ldo, ldo, qf + t0 * ldq, ldq, kf + t0 * ldq, ldq, vf + t0 * ldv,
                                           ldv, g + t0 * ldg, ldg, beta + t0 * ldg, ldg, lens[s], hk, hv, dk, dv, S);
        memcpy(want + (size_t)out[s] * sn, S, sizeof(float) * sn);
    }
    uint16_t *d_q = dev_upload(qh, sizeof *qh * (size_t)T * ldq), *d_k = dev_upload(kh, sizeof *kh * (size_t)T * ldq);
    uint16_t *d_v = dev_upload(vh, sizeof *vh * (size_t)T * ldv), *d_out = dev_poisoned((size_t)T * ldo);
    float *d_g = dev_upload(g, sizeof *g * (size_t)T * hv), *d_b = dev_upload(beta, sizeof *beta * (size_t)T * hv);
    float *d_s = dev_upload(states, sizeof(float) * ns);
    int32_t *d_cu = dev_upload(cu, sizeof *cu * (size_t)(nseq + 1));
    int32_t *d_in = dev_upload(in, sizeof *in * (size_t)nseq), *d_o = dev_upload(out, sizeof *out * (size_t)nseq);
    gated_delta_chunk_forward_state_cuda(d_out, ldo, d_q, ldq, d_k, ldq, d_v, ldv, d_g, ldg, d_b, ldg, d_cu, nseq,
                                         maxlen, hk, hv, dk, dv, d_s, d_in, d_o, stream);
    uint16_t *o = dev_get(d_out, sizeof(uint16_t) * (size_t)T * ldo);
    float *got = dev_get(d_s, sizeof(float) * ns);
    double err = 0, mx = 0, se = 0, sr = 0, serr = 0, smx = 0;
    int finite = 1;
    for (size_t i = 0; i < (size_t)T * ldo; i++) {
        const double x = bf16_to_f32(o[i]), r = ref[i];
        if (!isfinite(x)) finite = 0;
        err = fmax(err, fabs(x - r)), mx = fmax(mx, fabs(r));
        se += (x - r) * (x - r), sr += r * r;
    }
    for (size_t i = 0; i < ns; i++) {
        if (!isfinite(got[i])) finite = 0;
        serr = fmax(serr, fabs((double)got[i] - want[i])), smx = fmax(smx, fabs(want[i]));
    }
    const double tol = 0x1p-7 * mx + 1e-6, nrel = sr > 0 ? sqrt(se / sr) : sqrt(se), stol = 1e-3 * smx + 1e-6;
    const int ok = finite && err <= tol && nrel <= 0x1p-8 && serr <= stol;
    printf("%s gated_delta_chunk_forward_state %s T=%d nseq=%d hk=%d hv=%d dk=%d dv=%d max_err=%.3g tol=%.3g "
           "norm_rel=%.3g tol=%.3g; states max_err=%.3g tol=%.3g%s\n", ok ? "ok" : "FAIL", name, T, nseq, hk, hv, dk,
           dv, err, tol, nrel, 0x1p-8, serr, stol, finite ? "" : " (non-finite)");
    fflush(stdout);
    if (!ok) failures++;
    void *dev[] = {d_q, d_k, d_v, d_out, d_g, d_b, d_s, d_cu, d_in, d_o};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CHECK_CUDA(cudaFree(dev[i]));
    free(cu); free(qf); free(kf); free(vf); free(qh); free(kh); free(vh); free(g); free(beta); free(states);
    free(want); free(S); free(ref); free(o); free(got);
}

int main(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: test_gated_delta_chunk_gpu [quick]\nCompares the tensor-core chunked gated delta rule with the "
               "CPU recurrence on random packed batches (quick: without the large Qwen3.5-heads case).\n");
        return 0;
    }
    const int quick = argc > 1 && !strcmp(argv[1], "quick");
    CHECK_CUDA(cudaStreamCreate(&stream));
    const int mixed[8] = {1, 63, 64, 65, 200, 0, 129, 7}, ones[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    const int one_long[1] = {3000}, bench3[3] = {773, 355, 1876};
    check("packed", mixed, 8, 2, 4, 128, 128, G_RANDOM, STRIDE_ALIGNED);
    check("packed_odd_strides", mixed, 8, 2, 4, 128, 128, G_RANDOM, STRIDE_ODD);
    check("one_token_seqs", ones, 9, 1, 2, 128, 128, G_RANDOM, STRIDE_ALIGNED);
    check("gva4_dv40", mixed, 8, 1, 4, 128, 40, G_RANDOM, STRIDE_ALIGNED);
    check("dv24", mixed, 8, 2, 2, 128, 24, G_RANDOM, STRIDE_ALIGNED);
    check("dv20_plain_loads", mixed, 8, 1, 2, 128, 20, G_RANDOM, STRIDE_ALIGNED);
    check("dk256", mixed, 8, 1, 2, 256, 128, G_RANDOM, STRIDE_ALIGNED);
    check("dk256_odd_strides_dv40", mixed, 8, 1, 2, 256, 40, G_RANDOM, STRIDE_ODD);
    check("dk256_one_token_seqs", ones, 9, 2, 2, 256, 64, G_RANDOM, STRIDE_ALIGNED);
    check("no_decay_long", one_long, 1, 1, 2, 128, 128, G_ZERO, STRIDE_ALIGNED);
    check("no_decay_long_dk256", one_long, 1, 1, 1, 256, 128, G_ZERO, STRIDE_ALIGNED);
    check("huge_decay", mixed, 8, 2, 2, 128, 128, G_HUGE, STRIDE_ALIGNED);
    check("dk64_old_kernel", mixed, 8, 2, 4, 64, 64, G_RANDOM, STRIDE_ALIGNED);
    { /* decoding: a prefill beside continuing sequences (one row, 17, 70 = two chunks, none) on the tensor cores;
       * a step of short blocks (the fp32 kernel) */
        const int lens[5] = {1, 17, 70, 0, 130}, short_lens[3] = {1, 16, 3};
        const int32_t in[5] = {2, 0, -1, 7, 5}, out[5] = {3, 1, 4, 6, 8}, sin[3] = {0, -1, 2}, sout[3] = {1, 3, 4};
        check_state("decode_prefill_beside_steps", lens, 5, in, out, 9, 2, 4, 128, 128);
        check_state("decode_prefill_dk256_dv40", lens, 5, in, out, 9, 1, 2, 256, 40);
        check_state("decode_short_steps_fp32_kernel", short_lens, 3, sin, sout, 5, 2, 4, 128, 64);
    }
    int many[600]; /* more sequences than the kernel orders longest first: the launch order is the batch's */
    for (int i = 0; i < 600; i++) many[i] = 1 + (i * 37) % 90;
    check("600_seqs", many, 600, 1, 2, 128, 64, G_RANDOM, STRIDE_ALIGNED);
    if (!quick) check("qwen35_heads", bench3, 3, 16, 32, 128, 128, G_RANDOM, STRIDE_ALIGNED);
    CHECK_CUDA(cudaStreamDestroy(stream));
    printf("%s\n", failures ? "FAIL test_gated_delta_chunk_gpu" : "ok test_gated_delta_chunk_gpu");
    return failures ? 1 : 0;
}
