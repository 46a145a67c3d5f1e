/* The chunked CUDA gated delta rule against the CPU recurrence (run on the GPU machine). q and k are l2-normalised
 * (q also scaled by dk^-½) in fp32, rounded to bf16, and the CPU reference runs on the same bf16 values with the
 * same fp32 g and beta; the CUDA output is bf16, so it may differ by one bf16 rounding of the output plus fp32
 * differences of the chunked order: tolerance 2^-7 · max|ref| (twice the bf16 rounding bound at the largest value;
 * a host emulation of the kernel, one pthread per CUDA thread, stayed below 2^-8 · max|ref|). Cases: sequences of
 * 1, 63, 64, 65 and 200 tokens packed together (chunk boundaries, state crossing chunks), grouped value heads, value
 * dims that are not a multiple of the 32-column tile, the Qwen3.5 shapes (dk = dv = 128), dk = 256, a 3000-token
 * sequence without decay (g = 0: the delta rule keeps the state bounded) and a huge decay (g = -60: exp underflows
 * to 0, never overflows); and the decoding entry (state carried in and out through slots, steps of 1..70 rows:
 * the recurrent kernel for steps of at most 16 rows, the chunked one otherwise).
 * Prints "ok <case> ..." / "FAIL <case> ..."; exit status 0 only when every case passed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "gated_delta_rule.h"
#include "util.h"

static int failures;
static cudaStream_t stream;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double rnd_uniform(void) /* [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static void *dev_upload(const void *src, size_t bytes)
{
    void *d = NULL;
    CHECK_CUDA(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes) CHECK_CUDA(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* n rows of `heads` vectors of dim d (row stride ld), l2-normalised and scaled, rounded to bf16 (and back in f). */
static uint16_t *rnd_unit_rows(int n, int ld, int heads, int d, float scale, float *f)
{
    uint16_t *h = xcalloc((size_t)n * ld, sizeof *h);
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

/* g_mode: 0 random in [-1.5, -0.01], 1 zero, 2 = -60 */
static void check(const char *name, const int *lens, int nseq, int hk, int hv, int dk, int dv, int g_mode)
{
    int32_t *cu = xmalloc(sizeof(int32_t) * (size_t)(nseq + 1));
    cu[0] = 0;
    for (int s = 0; s < nseq; s++) cu[s + 1] = cu[s] + lens[s];
    const int T = cu[nseq], ldq = hk * dk + 3, ldv = hv * dv + 5, ldo = hv * dv, ldg = hv;
    float *qf = xcalloc((size_t)T * ldq, sizeof(float)), *kf = xcalloc((size_t)T * ldq, sizeof(float));
    float *vf = xcalloc((size_t)T * ldv, sizeof(float));
    uint16_t *qh = rnd_unit_rows(T, ldq, hk, dk, 1.0f / sqrtf((float)dk), qf);
    uint16_t *kh = rnd_unit_rows(T, ldq, hk, dk, 1.0f, kf);
    uint16_t *vh = xcalloc((size_t)T * ldv, sizeof *vh);
    for (size_t i = 0; i < (size_t)T * ldv; i++) {
        vh[i] = f32_to_bf16((float)(2.0 * rnd_uniform()));
        vf[i] = bf16_to_f32(vh[i]);
    }
    float *g = xmalloc(sizeof(float) * (size_t)T * hv), *beta = xmalloc(sizeof(float) * (size_t)T * hv);
    for (size_t i = 0; i < (size_t)T * hv; i++) {
        g[i] = g_mode == 1 ? 0.0f : g_mode == 2 ? -60.0f : (float)(-0.01 - 0.745 * (rnd_uniform() + 1.0));
        beta[i] = (float)(0.5 * (rnd_uniform() + 1.0));
    }
    float *ref = xmalloc(sizeof(float) * (size_t)T * ldo);
    gated_delta_rule_forward_cpu(ref, ldo, qf, ldq, kf, ldq, vf, ldv, g, ldg, beta, ldg, cu, nseq, hk, hv, dk, dv);

    uint16_t *d_q = dev_upload(qh, sizeof *qh * (size_t)T * ldq), *d_k = dev_upload(kh, sizeof *kh * (size_t)T * ldq);
    uint16_t *d_v = dev_upload(vh, sizeof *vh * (size_t)T * ldv), *d_out = NULL;
    float *d_g = dev_upload(g, sizeof *g * (size_t)T * hv), *d_b = dev_upload(beta, sizeof *beta * (size_t)T * hv);
    int32_t *d_cu = dev_upload(cu, sizeof *cu * (size_t)(nseq + 1));
    CHECK_CUDA(cudaMalloc((void **)&d_out, sizeof *d_out * (size_t)T * ldo));
    gated_delta_rule_forward_cuda(d_out, ldo, d_q, ldq, d_k, ldq, d_v, ldv, d_g, ldg, d_b, ldg, d_cu, nseq, hk, hv, dk,
                                  dv, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    uint16_t *out = xmalloc(sizeof *out * (size_t)T * ldo);
    CHECK_CUDA(cudaMemcpy(out, d_out, sizeof *out * (size_t)T * ldo, cudaMemcpyDeviceToHost));
    double err = 0, mx = 0;
    int finite = 1;
    for (size_t i = 0; i < (size_t)T * ldo; i++) {
        float o = bf16_to_f32(out[i]);
        if (!isfinite(o)) finite = 0;
        err = fmax(err, fabs((double)o - ref[i]));
        mx = fmax(mx, fabs(ref[i]));
    }
    double tol = 0x1p-7 * mx + 1e-6;
    int ok = finite && err <= tol;
    printf("%s gated_delta_rule_forward_cuda %s T=%d hk=%d hv=%d dk=%d dv=%d max_err=%.3g tol=%.3g%s\n",
           ok ? "ok" : "FAIL", name, T, hk, hv, dk, dv, err, tol, finite ? "" : " (non-finite output)");
    fflush(stdout);
    if (!ok) failures++;
    CHECK_CUDA(cudaFree(d_q)); CHECK_CUDA(cudaFree(d_k)); CHECK_CUDA(cudaFree(d_v)); CHECK_CUDA(cudaFree(d_out));
    CHECK_CUDA(cudaFree(d_g)); CHECK_CUDA(cudaFree(d_b)); CHECK_CUDA(cudaFree(d_cu));
    free(cu); free(qf); free(kf); free(vf); free(qh); free(kh); free(vh); free(g); free(beta); free(ref); free(out);
}

/* Decoding (gated_delta_rule_forward_state_cuda): sequences of lens rows continuing from random states in slots
 * (-1: a sequence start), the states after them written to other slots; outputs and states against
 * gated_delta_rule_forward_state_cpu per sequence. Tolerances as above (the states: fp32 against fp32, 1e-3 of the
 * largest value: the chunked order's rounding only). */
static void check_state(const char *name, const int *lens, int nseq, const int32_t *in, const int32_t *out,
                        int nslots, int hk, int hv, int dk, int dv)
{
    int32_t *cu = xmalloc(sizeof(int32_t) * (size_t)(nseq + 1));
    cu[0] = 0;
    int maxlen = 0;
    for (int s = 0; s < nseq; s++) cu[s + 1] = cu[s] + lens[s], maxlen = lens[s] > maxlen ? lens[s] : maxlen;
    const int T = cu[nseq], ldq = hk * dk, ldv = hv * dv, ldo = hv * dv, ldg = hv;
    const size_t sn = (size_t)hv * dk * dv;
    float *qf = xcalloc((size_t)T * ldq, sizeof(float)), *kf = xcalloc((size_t)T * ldq, sizeof(float));
    float *vf = xcalloc((size_t)T * ldv, sizeof(float));
    uint16_t *qh = rnd_unit_rows(T, ldq, hk, dk, 1.0f / sqrtf((float)dk), qf);
    uint16_t *kh = rnd_unit_rows(T, ldq, hk, dk, 1.0f, kf);
    uint16_t *vh = xcalloc((size_t)T * ldv, sizeof *vh);
    for (size_t i = 0; i < (size_t)T * ldv; i++) vh[i] = f32_to_bf16((float)(2.0 * rnd_uniform())), vf[i] = bf16_to_f32(vh[i]);
    float *g = xmalloc(sizeof(float) * (size_t)T * hv), *beta = xmalloc(sizeof(float) * (size_t)T * hv);
    for (size_t i = 0; i < (size_t)T * hv; i++) {
        g[i] = (float)(-0.01 - 0.2 * (rnd_uniform() + 1.0));
        beta[i] = (float)(0.5 * (rnd_uniform() + 1.0));
    }
    float *states = xmalloc(sizeof(float) * sn * (size_t)nslots), *want = xmalloc(sizeof(float) * sn * (size_t)nslots);
    for (size_t i = 0; i < sn * (size_t)nslots; i++) states[i] = (float)(0.5 * rnd_uniform());
    memcpy(want, states, sizeof(float) * sn * (size_t)nslots);
    float *ref = xmalloc(sizeof(float) * (size_t)T * ldo), *S = xmalloc(sizeof(float) * sn);
    for (int s = 0; s < nseq; s++) {
        if (in[s] >= 0) memcpy(S, states + (size_t)in[s] * sn, sizeof(float) * sn);
        else memset(S, 0, sizeof(float) * sn);
        const size_t t0 = (size_t)cu[s];
        gated_delta_rule_forward_state_cpu(ref + t0 * ldo, ldo, qf + t0 * ldq, ldq, kf + t0 * ldq, ldq, vf + t0 * ldv,
                                           ldv, g + t0 * ldg, ldg, beta + t0 * ldg, ldg, lens[s], hk, hv, dk, dv, S);
        memcpy(want + (size_t)out[s] * sn, S, sizeof(float) * sn);
    }
    uint16_t *d_q = dev_upload(qh, sizeof *qh * (size_t)T * ldq), *d_k = dev_upload(kh, sizeof *kh * (size_t)T * ldq);
    uint16_t *d_v = dev_upload(vh, sizeof *vh * (size_t)T * ldv), *d_out = NULL;
    float *d_g = dev_upload(g, sizeof *g * (size_t)T * hv), *d_b = dev_upload(beta, sizeof *beta * (size_t)T * hv);
    float *d_s = dev_upload(states, sizeof(float) * sn * (size_t)nslots);
    int32_t *d_cu = dev_upload(cu, sizeof *cu * (size_t)(nseq + 1));
    int32_t *d_in = dev_upload(in, sizeof *in * (size_t)nseq), *d_o = dev_upload(out, sizeof *out * (size_t)nseq);
    CHECK_CUDA(cudaMalloc((void **)&d_out, sizeof *d_out * (size_t)T * ldo));
    gated_delta_rule_forward_state_cuda(d_out, ldo, d_q, ldq, d_k, ldq, d_v, ldv, d_g, ldg, d_b, ldg, d_cu, nseq, maxlen,
                                        hk, hv, dk, dv, d_s, d_in, d_o, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    uint16_t *o = xmalloc(sizeof *o * (size_t)T * ldo);
    float *got = xmalloc(sizeof(float) * sn * (size_t)nslots);
    CHECK_CUDA(cudaMemcpy(o, d_out, sizeof *o * (size_t)T * ldo, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(got, d_s, sizeof(float) * sn * (size_t)nslots, cudaMemcpyDeviceToHost));
    double err = 0, mx = 0, serr = 0, smx = 0;
    int finite = 1;
    for (size_t i = 0; i < (size_t)T * ldo; i++) {
        float x = bf16_to_f32(o[i]);
        if (!isfinite(x)) finite = 0;
        err = fmax(err, fabs((double)x - ref[i]));
        mx = fmax(mx, fabs(ref[i]));
    }
    for (size_t i = 0; i < sn * (size_t)nslots; i++) {
        if (!isfinite(got[i])) finite = 0;
        serr = fmax(serr, fabs((double)got[i] - want[i]));
        smx = fmax(smx, fabs(want[i]));
    }
    double tol = 0x1p-7 * mx + 1e-6, stol = 1e-3 * smx + 1e-6;
    int ok = finite && err <= tol && serr <= stol;
    printf("%s gated_delta_rule_forward_state_cuda %s T=%d hk=%d hv=%d dk=%d dv=%d max_err=%.3g tol=%.3g; "
           "states (untouched slots included) max_err=%.3g tol=%.3g%s\n", ok ? "ok" : "FAIL", name, T, hk, hv, dk, dv,
           err, tol, serr, stol, finite ? "" : " (non-finite)");
    fflush(stdout);
    if (!ok) failures++;
    void *dev[] = {d_q, d_k, d_v, d_out, d_g, d_b, d_s, d_cu, d_in, d_o};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CHECK_CUDA(cudaFree(dev[i]));
    free(cu); free(qf); free(kf); free(vf); free(qh); free(kh); free(vh); free(g); free(beta); free(states);
    free(want); free(ref); free(S); free(o); free(got);
}

int main(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: test_gated_delta_rule_gpu\nCompares the chunked CUDA gated delta rule with the CPU recurrence "
               "on random packed batches.\n");
        return 0;
    }
    CHECK_CUDA(cudaStreamCreate(&stream));
    const int mixed[5] = {1, 63, 64, 65, 200}, one_long[1] = {3000};
    check("packed", mixed, 5, 2, 4, 16, 24, 0);
    check("packed_gva4_odd_dv", mixed, 5, 1, 4, 32, 40, 0);
    check("qwen35_heads", mixed, 5, 2, 4, 128, 128, 0);
    check("dk256", mixed, 5, 1, 1, 256, 32, 0);
    check("no_decay_long", one_long, 1, 1, 2, 128, 128, 1);
    check("huge_decay", mixed, 5, 2, 2, 64, 64, 2);
    {   /* decoding: one token, a block of 16, 3, and a 70-row prefill from a start (two chunks) in one call */
        const int lens[4] = {1, 16, 3, 70};
        const int32_t in[4] = {2, 0, 5, -1}, out[4] = {3, 1, 4, 6};
        check_state("decode_steps", lens, 4, in, out, 7, 2, 4, 16, 24);
        check_state("decode_qwen35_heads", lens, 4, in, out, 7, 2, 4, 128, 128);
        check_state("decode_dk256_odd_dv", lens, 4, in, out, 7, 1, 2, 256, 40);
        /* steps of at most 16 rows a sequence (one token, verified blocks, an empty one): the recurrent kernel */
        const int short_lens[5] = {1, 16, 3, 0, 9};
        const int32_t sin[5] = {2, 0, 5, 9, -1}, sout[5] = {3, 1, 4, 6, 8};
        check_state("decode_short_qwen35_heads", short_lens, 5, sin, sout, 10, 2, 4, 128, 128);
        check_state("decode_short_dk256_odd_dv", short_lens, 5, sin, sout, 10, 1, 2, 256, 40);
        check_state("decode_short_dk64_gva4", short_lens, 5, sin, sout, 10, 1, 4, 64, 24);
        check_state("decode_short_dk16_chunked", short_lens, 5, sin, sout, 10, 2, 4, 16, 24);
    }
    CHECK_CUDA(cudaStreamDestroy(stream));
    printf("%s\n", failures ? "FAIL test_gated_delta_rule_gpu" : "ok test_gated_delta_rule_gpu");
    return failures ? 1 : 0;
}
