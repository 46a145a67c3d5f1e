/* The gated delta rule (Gated DeltaNet's recurrence) of the hybrid target. CPU: the state-carrying reference
 * (gated_delta_rule_forward_state_cpu) run in chunks (of 1 token, of fewer tokens than a chunk, of more) with the
 * state carried gives the bits of one packed run, each sequence of a packed batch from a zero state the bits of the
 * packed run, and the state after a whole run gives the next token of a packed run one token longer.
 * CUDA: gated_delta_rule_forward_cuda (the chunked kernel) and gated_delta_chunk (tensor cores, exact and bf16 modes)
 * against the CPU recurrence. q and k are l2-normalised (q also scaled by dk^-½) in fp32, rounded to bf16, and the
 * CPU reference runs on the same bf16 values with the same fp32 g and beta; the CUDA output is bf16, so it may differ
 * by one bf16 rounding of the output plus fp32 differences of the chunked order: tolerance 2^-7 · max|ref| (twice the
 * bf16 rounding bound at the largest value; a host emulation of the kernel, one pthread per CUDA thread, stayed below
 * 2^-8 · max|ref|). gated_delta_chunk: exact mode (fp32 operands split into bf16 hi + lo) max error <= 2^-7, relative
 * norm <= 2^-8; bf16 mode (operands rounded once, fla's precision): 2^-5 and 2^-6; every packed case runs twice and
 * the two outputs must be bitwise equal. The decoding entries (…_state_cuda): sequences continuing from random states
 * in slots (aux: the nseqs slots read, -1 a sequence start, then the nseqs slots written), outputs within the bounds
 * above, the states within 1e-3 of the largest (fp32 against fp32: summation order only), untouched slots kept.
 * g_mode: 0 random in [-1.5, -0.01], 1 zero (no decay), 2 = -60 (exp underflows to 0, never overflows). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gated_delta_chunk.h"
#include "gated_delta_rule.h"
#include "tests/kernel_cases.h"
#include "tests/test.h"
#include "util.h"

enum { G_RANDOM, G_ZERO, G_HUGE };
enum { STRIDE_ALIGNED, STRIDE_ODD };

static float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(0.5 * (rnd_uniform() + 1.0)); }

/* hk hv dk dv g_mode (seqs): the CPU recurrence with its state carried */
static void rule_state_cpu_check(const kc_case *c)
{
    const int hk = c->p[0], hv = c->p[1], dk = c->p[2], dv = c->p[3], g_mode = c->p[4], nseq = c->nseqs;
    const int qk = hk * dk, vd = hv * dv;
    int32_t *cu = xmalloc(sizeof(int32_t) * (size_t)(nseq + 1));
    cu[0] = 0;
    for (int s = 0; s < nseq; s++) cu[s + 1] = cu[s] + c->seqs[s];
    const int T = cu[nseq], T1 = T + 1;
    float *q = xmalloc(sizeof(float) * (size_t)T1 * qk), *k = xmalloc(sizeof(float) * (size_t)T1 * qk);
    float *v = xmalloc(sizeof(float) * (size_t)T1 * vd), *g = xmalloc(sizeof(float) * (size_t)T1 * hv);
    float *b = xmalloc(sizeof(float) * (size_t)T1 * hv), *ref = xmalloc(sizeof(float) * (size_t)T1 * vd);
    float *out = xmalloc(sizeof(float) * (size_t)T1 * vd), *S = xmalloc(sizeof(float) * (size_t)hv * dk * dv);
    const size_t sbytes = sizeof(float) * (size_t)hv * dk * dv;
    for (size_t i = 0; i < (size_t)T1 * qk; i++) q[i] = uniform(-0.5f, 0.5f), k[i] = uniform(-0.5f, 0.5f);
    for (size_t i = 0; i < (size_t)T1 * vd; i++) v[i] = uniform(-1, 1);
    for (size_t i = 0; i < (size_t)T1 * hv; i++) {
        g[i] = g_mode == G_ZERO ? 0.0f : g_mode == G_HUGE ? -60.0f : uniform(-1.5f, -0.01f);
        b[i] = uniform(0, 1);
    }
    /* the packed sequences, each from a zero state */
    gated_delta_rule_forward_cpu(ref, vd, q, qk, k, qk, v, vd, g, hv, b, hv, cu, nseq, hk, hv, dk, dv);
    for (int s = 0; s < nseq; s++) {
        const size_t t0 = (size_t)cu[s];
        memset(S, 0, sbytes);
        gated_delta_rule_forward_state_cpu(out + t0 * vd, vd, q + t0 * qk, qk, k + t0 * qk, qk, v + t0 * vd, vd,
                                           g + t0 * hv, hv, b + t0 * hv, hv, c->seqs[s], hk, hv, dk, dv, S);
        EXPECT(memcmp(out + t0 * vd, ref + t0 * vd, sizeof(float) * (size_t)c->seqs[s] * vd) == 0);
    }
    /* all T rows as one sequence, in chunks of 1, 2, 5, 1, 3, ... tokens, the state carried */
    static const int chunks[] = {1, 2, 5, 1, 3};
    int32_t cu1[2] = {0, T};
    gated_delta_rule_forward_cpu(ref, vd, q, qk, k, qk, v, vd, g, hv, b, hv, cu1, 1, hk, hv, dk, dv);
    memset(S, 0, sbytes);
    for (int t = 0, i = 0; t < T; i++) {
        int n = chunks[i % 5] < T - t ? chunks[i % 5] : T - t;
        gated_delta_rule_forward_state_cpu(out + (size_t)t * vd, vd, q + (size_t)t * qk, qk, k + (size_t)t * qk, qk,
                                           v + (size_t)t * vd, vd, g + (size_t)t * hv, hv, b + (size_t)t * hv, hv, n,
                                           hk, hv, dk, dv, S);
        t += n;
    }
    EXPECT(memcmp(out, ref, sizeof(float) * (size_t)T * vd) == 0);
    /* the state after the whole run: the next token's output from it equals a packed run over T+1 tokens */
    int32_t cu2[2] = {0, T1};
    gated_delta_rule_forward_cpu(ref, vd, q, qk, k, qk, v, vd, g, hv, b, hv, cu2, 1, hk, hv, dk, dv);
    gated_delta_rule_forward_state_cpu(out, vd, q + (size_t)T * qk, qk, k + (size_t)T * qk, qk, v + (size_t)T * vd, vd,
                                       g + (size_t)T * hv, hv, b + (size_t)T * hv, hv, 1, hk, hv, dk, dv, S);
    EXPECT(memcmp(out, ref + (size_t)T * vd, sizeof(float) * vd) == 0);
    free(cu), free(q), free(k), free(v), free(g), free(b), free(ref), free(out), free(S);
}

/* hk hv dk dv nslots (seqs): the state-carrying recurrence, as the packed ops' CPU check runs it, on these sequences
 * (random decay) */
static void state_cpu_check(const kc_case *c)
{
    kc_case r = *c;
    r.p[4] = G_RANDOM;
    rule_state_cpu_check(&r);
}

#ifdef DFLASH_CUDA
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

/* g_mode: 0 random in [-1.5, -0.01], 1 zero, 2 = -60 */
static void rule_cuda_check(const kc_case *c)
{
    const char *name = "packed";
    const int *lens = c->seqs, nseq = c->nseqs, hk = c->p[0], hv = c->p[1], dk = c->p[2], dv = c->p[3], g_mode = c->p[4];
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
    uint16_t *out = dev_get(d_out, sizeof(uint16_t) * (size_t)T * ldo);
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
static void rule_state_cuda_check(const kc_case *c)
{
    const char *name = "decode";
    const int *lens = c->seqs, nseq = c->nseqs, hk = c->p[0], hv = c->p[1], dk = c->p[2], dv = c->p[3], nslots = c->p[4];
    const int32_t *in = c->aux, *out = c->aux + nseq;
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
    uint16_t *o = dev_get(d_out, sizeof(uint16_t) * (size_t)T * ldo);
    float *got = dev_get(d_s, sizeof(float) * sn * (size_t)nslots);
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

static void chunk_cuda_check(const kc_case *c)
{
    const char *name = "packed";
    const int *lens = c->seqs, nseq = c->nseqs, hk = c->p[0], hv = c->p[1], dk = c->p[2], dv = c->p[3], g_mode = c->p[4];
    const int stride = c->p[5];
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
static void chunk_state_cuda_check(const kc_case *c)
{
    const char *name = "decode";
    const int *lens = c->seqs, nseq = c->nseqs, hk = c->p[0], hv = c->p[1], dk = c->p[2], dv = c->p[3], nslots = c->p[4];
    const int32_t *in = c->aux, *out = c->aux + nseq;
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

#endif

const kc_op kc_gated_delta_rule = {"gated_delta_rule", "bf16 (g, beta f32)", "hk hv dk dv g_mode",
                                   rule_state_cpu_check, KC_CUDA(rule_cuda_check)};
const kc_op kc_gated_delta_rule_state = {"gated_delta_rule_state", "bf16 (states f32)", "hk hv dk dv nslots", state_cpu_check,
                                         KC_CUDA(rule_state_cuda_check)};
const kc_op kc_gated_delta_chunk = {"gated_delta_chunk", "bf16 (g, beta f32)", "hk hv dk dv g_mode odd_strides",
                                    rule_state_cpu_check, KC_CUDA(chunk_cuda_check)};
const kc_op kc_gated_delta_chunk_state = {"gated_delta_chunk_state", "bf16 (states f32)", "hk hv dk dv nslots", state_cpu_check,
                                          KC_CUDA(chunk_state_cuda_check)};
