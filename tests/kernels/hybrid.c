/* The kernels of the hybrid target (Qwen3.5 family) and of the MoE layers. CPU: causal_conv1d_silu_state_cpu run in
 * chunks (of 1 token, of fewer tokens than the conv history, of more) with the state carried gives the bits of the
 * packed run and leaves the last K-1 input rows as the state. CUDA against the CPU references on the same bf16-exact
 * inputs: causal_conv1d (packed sequences, strided input; and continuing carried histories, decoding: aux = the
 * nseqs slots read, -1 a start, then the nseqs slots written), gated_delta_prep, gated_rmsnorm, sigmoid_gate,
 * qk_norm_rope_partial (in rope_attention.c), moe_router (expert ids exactly, weights to fp32 rounding), moe_group
 * (every index exactly), moe_gemm (the grouped gate|up + SwiGLU and down GEMMs on moe_group's schedule, both tile
 * widths, repeated bit for bit) and moe_combine. The GPU output is bf16 (one rounding of an fp32 result): tolerances
 * 1e-2 on the relative norm and the max error. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "causal_conv1d.h"
#include "gated_delta_prep.h"
#include "gated_rmsnorm.h"
#include "moe_combine.h"
#include "moe_gemm.h"
#include "moe_group.h"
#include "moe_router.h"
#include "sigmoid_gate.h"
#include "tests/kernel_cases.h"
#include "tests/test.h"
#include "util.h"

#define TOL 1e-2

/* C K ldx (seqs): each sequence in chunks of 1, 2, 5, 1, 3, ... rows, the state carried, against the packed run */
static void conv_cpu_check(const kc_case *c)
{
    const int C = c->p[0], K = c->p[1], ld = c->p[2], nseq = c->nseqs;
    int32_t *cu = xmalloc(sizeof(int32_t) * (size_t)(nseq + 1));
    cu[0] = 0;
    for (int s = 0; s < nseq; s++) cu[s + 1] = cu[s] + c->seqs[s];
    const int T = cu[nseq];
    float *x = rnd_floats((size_t)T * ld, 2.0), *w = rnd_floats((size_t)C * K, 1.0);
    float *ref = xcalloc((size_t)T * ld + 1, sizeof(float)), *y = xcalloc((size_t)T * ld + 1, sizeof(float));
    float *state = xmalloc(sizeof(float) * (size_t)(K - 1) * C);
    causal_conv1d_silu_cpu(ref, ld, x, ld, w, C, K, cu, nseq);
    static const int chunks[] = {1, 2, 5, 1, 3};
    for (int s = 0; s < nseq; s++) {
        const int t0 = cu[s], len = c->seqs[s];
        memset(state, 0, sizeof(float) * (size_t)(K - 1) * C); /* zeros: a sequence start */
        for (int t = 0, i = 0; t < len; i++) {
            int n = chunks[i % 5] < len - t ? chunks[i % 5] : len - t;
            causal_conv1d_silu_state_cpu(y + (size_t)(t0 + t) * ld, ld, x + (size_t)(t0 + t) * ld, ld, w, C, K, n,
                                         state);
            t += n;
        }
        for (int r = t0; r < t0 + len; r++) EXPECT(memcmp(y + (size_t)r * ld, ref + (size_t)r * ld, sizeof(float) * C) == 0);
        /* the state holds the last K-1 input rows */
        if (len >= K - 1)
            for (int r = 0; r < K - 1; r++)
                EXPECT(memcmp(state + (size_t)r * C, x + (size_t)(t0 + len - (K - 1) + r) * ld, sizeof(float) * C) == 0);
        /* NULL state: a sequence start, as the packed form's */
        memset(y + (size_t)t0 * ld, 0, sizeof(float) * (size_t)len * ld);
        causal_conv1d_silu_state_cpu(y + (size_t)t0 * ld, ld, x + (size_t)t0 * ld, ld, w, C, K, len, NULL);
        for (int r = t0; r < t0 + len; r++) EXPECT(memcmp(y + (size_t)r * ld, ref + (size_t)r * ld, sizeof(float) * C) == 0);
    }
    free(cu), free(x), free(w), free(ref), free(y), free(state);
}

static double rel_err(const float *got, const double *ref, size_t n)
{
    double e = 0, mx = 0;
    for (size_t i = 0; i < n; i++) e = fmax(e, fabs(got[i] - ref[i])), mx = fmax(mx, fabs(ref[i]));
    return e / fmax(1.0, mx);
}

/* T hk dk hv: q and k l2-normalised (q scaled by dk^-1/2), beta = sigmoid(b), g = -exp(A_log)·softplus(a + dt_bias)
 * (threshold 20), against double; the columns past q|k untouched */
static void prep_cpu_check(const kc_case *c)
{
    const int T = c->p[0], hk = c->p[1], dk = c->p[2], hv = c->p[3];
    const int ldqk = 2 * hk * dk + 24, ldba = 2 * hv + 6;
    float *qk = rnd_floats((size_t)T * ldqk, 1.5), *ba = rnd_floats((size_t)T * ldba, 4.0);
    float *alog = xmalloc(sizeof(float) * hv), *dtb = xmalloc(sizeof(float) * hv);
    for (int h = 0; h < hv; h++) alog[h] = (float)log(1.0 + 7.5 * (rnd_uniform() + 1.0)), dtb[h] = (float)rnd_uniform();
    if (T > 0) ba[hv + 3] = 30.0f; /* past softplus's threshold */
    float *x = dup_floats(qk, (size_t)T * ldqk), *beta = xmalloc(sizeof(float) * (size_t)T * hv);
    float *g = xmalloc(sizeof(float) * (size_t)T * hv);
    gated_delta_prep_cpu(qk, ldqk, T, hk, dk, beta, g, hv, ba, ldba, ba + hv + 3, ldba, alog, dtb, hv);
    double *rq = xmalloc(sizeof(double) * (size_t)T * 2 * hk * dk), *rb = xmalloc(sizeof(double) * (size_t)T * hv);
    double *rg = xmalloc(sizeof(double) * (size_t)T * hv);
    float *gq = xmalloc(sizeof(float) * (size_t)T * 2 * hk * dk);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < 2 * hk; h++) {
            const float *xr = x + (size_t)t * ldqk + (size_t)h * dk;
            double ss = 0;
            for (int i = 0; i < dk; i++) ss += (double)xr[i] * xr[i];
            double s = 1.0 / sqrt(ss + 1e-6) * (h < hk ? 1.0 / sqrt((double)dk) : 1.0);
            for (int i = 0; i < dk; i++) {
                rq[((size_t)t * 2 * hk + h) * dk + i] = xr[i] * s;
                gq[((size_t)t * 2 * hk + h) * dk + i] = qk[(size_t)t * ldqk + (size_t)h * dk + i];
            }
        }
        for (int i = 2 * hk * dk; i < ldqk; i++) EXPECT(qk[(size_t)t * ldqk + i] == x[(size_t)t * ldqk + i]);
        for (int h = 0; h < hv; h++) {
            double bv = ba[(size_t)t * ldba + h], av = (double)ba[(size_t)t * ldba + hv + 3 + h] + dtb[h];
            rb[(size_t)t * hv + h] = 1.0 / (1.0 + exp(-bv));
            rg[(size_t)t * hv + h] = -exp((double)alog[h]) * (av > 20.0 ? av : log1p(exp(av)));
        }
    }
    EXPECT(rel_err(gq, rq, (size_t)T * 2 * hk * dk) <= 1e-6);
    EXPECT(rel_err(beta, rb, (size_t)T * hv) <= 1e-6);
    EXPECT(rel_err(g, rg, (size_t)T * hv) <= 1e-5);
    free(qk), free(ba), free(alog), free(dtb), free(x), free(beta), free(g), free(rq), free(rb), free(rg), free(gq);
}

/* T heads dim: y = w · rmsnorm(x) · silu(z) per head, in place, against double */
static void gated_rmsnorm_cpu_check(const kc_case *c)
{
    const int T = c->p[0], heads = c->p[1], dim = c->p[2], ld = heads * dim, ldz = ld + 40;
    float *x = rnd_floats((size_t)T * ld, 3.0), *z = rnd_floats((size_t)T * ldz, 3.0), *w = rnd_floats(dim, 1.0);
    float *y = dup_floats(x, (size_t)T * ld);
    double *ref = xmalloc(sizeof(double) * (size_t)T * ld);
    gated_rmsnorm_cpu(y, ld, y, ld, z + 40, ldz, w, T, heads, dim, 1e-6f);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < heads; h++) {
            const float *xr = x + (size_t)t * ld + (size_t)h * dim, *zr = z + 40 + (size_t)t * ldz + (size_t)h * dim;
            double ss = 0;
            for (int i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
            double r = 1.0 / sqrt(ss / dim + 1e-6);
            for (int i = 0; i < dim; i++)
                ref[(size_t)t * ld + (size_t)h * dim + i] = w[i] * (xr[i] * r) * (zr[i] / (1.0 + exp(-(double)zr[i])));
        }
    EXPECT(rel_err(y, ref, (size_t)T * ld) <= 1e-5);
    free(x), free(z), free(w), free(y), free(ref);
}

/* rows dim: y = x · sigmoid(gate), in place and apart, against double */
static void sigmoid_gate_cpu_check(const kc_case *c)
{
    const int rows = c->p[0], dim = c->p[1], ldg = 2 * dim + 8, ldy = dim + 3;
    float *x = rnd_floats((size_t)rows * dim, 2.0), *g = rnd_floats((size_t)rows * ldg, 6.0);
    if (rows * dim > 1) g[dim] = -100.0f, g[dim + 1] = 100.0f; /* saturated gates */
    float *y = rnd_floats((size_t)rows * ldy, 1.0), *y0 = dup_floats(y, (size_t)rows * ldy), *xi = dup_floats(x, (size_t)rows * dim);
    double *ref = xmalloc(sizeof(double) * (size_t)rows * dim);
    float *yc = xmalloc(sizeof(float) * (size_t)rows * dim);
    sigmoid_gate_cpu(y, ldy, x, dim, g + dim, ldg, rows, dim);
    sigmoid_gate_cpu(xi, dim, xi, dim, g + dim, ldg, rows, dim);
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < dim; i++) {
            double gv = g[(size_t)r * ldg + dim + i];
            ref[(size_t)r * dim + i] = x[(size_t)r * dim + i] / (1.0 + exp(-gv));
            yc[(size_t)r * dim + i] = y[(size_t)r * ldy + i];
        }
        for (int i = dim; i < ldy; i++) EXPECT(y[(size_t)r * ldy + i] == y0[(size_t)r * ldy + i]);
    }
    EXPECT(rel_err(yc, ref, (size_t)rows * dim) <= 1e-6);
    EXPECT(memcmp(xi, yc, sizeof(float) * (size_t)rows * dim) == 0);
    free(x), free(g), free(y), free(y0), free(xi), free(ref), free(yc);
}

/* T E K norm: softmax over E, the K largest (ties to the lower id, decreasing), renormalised when norm; against a
 * double softmax and a selection written here */
static void router_cpu_check(const kc_case *c)
{
    const int T = c->p[0], E = c->p[1], K = c->p[2], norm = c->p[3], ldl = E + 3;
    float *l = xmalloc(sizeof(float) * (size_t)T * ldl);
    for (size_t i = 0; i < (size_t)T * ldl; i++) l[i] = (float)(4.0 * rnd_uniform());
    if (T > 0 && E > 2) l[1] = l[2]; /* a tie: the lower id first */
    int32_t *sel = xmalloc(sizeof(int32_t) * (size_t)T * K);
    float *w = xmalloc(sizeof(float) * (size_t)T * K);
    moe_router_topk_cpu(sel, w, l, ldl, T, E, K, norm);
    double *p = xmalloc(sizeof(double) * E);
    char *used = xmalloc((size_t)E);
    int bad_ids = 0;
    double werr = 0;
    for (int t = 0; t < T; t++) {
        const float *lr = l + (size_t)t * ldl;
        double mx = -INFINITY, s = 0;
        for (int e = 0; e < E; e++) mx = fmax(mx, lr[e]);
        for (int e = 0; e < E; e++) s += p[e] = exp(lr[e] - mx);
        for (int e = 0; e < E; e++) p[e] /= s;
        memset(used, 0, (size_t)E);
        double ws = 0, want[64];
        int ids[64];
        for (int j = 0; j < K; j++) {
            int b = -1;
            for (int e = 0; e < E; e++)
                if (!used[e] && (b < 0 || lr[e] > lr[b])) b = e; /* softmax is monotone: order by logit, ties low */
            used[b] = 1, ids[j] = b, want[j] = p[b], ws += p[b];
        }
        for (int j = 0; j < K; j++) {
            bad_ids += sel[(size_t)t * K + j] != ids[j];
            double wv = norm ? want[j] / ws : want[j];
            werr = fmax(werr, fabs(w[(size_t)t * K + j] - wv) / fmax(wv, 1e-30));
        }
    }
    EXPECT(bad_ids == 0);
    EXPECT(werr <= 1e-5);
    if (test_failed_here) fprintf(stderr, "  %d ids differ, weights' max relative error %g\n", bad_ids, werr);
    free(l), free(sel), free(w), free(p), free(used);
}

/* T K H shared: out = resid + Σ_j w·ys[row] + sigmoid(sg)·shared (shared 0 none, 1 gated, 2 ungated), in place,
 * against double */
static void combine_cpu_check(const kc_case *c)
{
    const int T = c->p[0], K = c->p[1], H = c->p[2], shared = c->p[3], ldr = H + 8, ldy = H, lds = H + 16, ldsg = 5;
    float *r = rnd_floats((size_t)T * ldr, 2.0), *ys = rnd_floats((size_t)T * K * ldy, 2.0);
    float *sh = rnd_floats((size_t)T * lds, 2.0), *sg = rnd_floats((size_t)T * ldsg, 3.0);
    int32_t *row = xmalloc(sizeof(int32_t) * (size_t)T * K);
    float *w = xmalloc(sizeof(float) * (size_t)T * K);
    for (int i = 0; i < T * K; i++) row[i] = (i * 7 + 3) % (T * K), w[i] = (float)(0.5 * (rnd_uniform() + 1.0));
    float *out = dup_floats(r, (size_t)T * ldr);
    moe_combine_cpu(out, ldr, out, ldr, ys, ldy, row, w, T, K, H, shared ? sh : NULL, lds, shared == 1 ? sg + 2 : NULL,
                    ldsg);
    double *ref = xmalloc(sizeof(double) * (size_t)T * H);
    float *got = xmalloc(sizeof(float) * (size_t)T * H);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < H; h++) {
            double v = r[(size_t)t * ldr + h];
            for (int j = 0; j < K; j++) v += (double)w[t * K + j] * ys[(size_t)row[t * K + j] * ldy + h];
            if (shared) v += (shared == 1 ? 1.0 / (1.0 + exp(-(double)sg[(size_t)t * ldsg + 2])) : 1.0) * sh[(size_t)t * lds + h];
            ref[(size_t)t * H + h] = v, got[(size_t)t * H + h] = out[(size_t)t * ldr + h];
        }
        for (int h = H; h < ldr; h++) EXPECT(out[(size_t)t * ldr + h] == r[(size_t)t * ldr + h]);
    }
    EXPECT(rel_err(got, ref, (size_t)T * H) <= 1e-5);
    free(r), free(ys), free(sh), free(sg), free(row), free(w), free(out), free(ref), free(got);
}

/* T tokens' K distinct picks of E experts, expert `empty` never picked, expert 0 favoured (a group of many tiles) */
static int32_t *moe_picks(int T, int K, int E, int empty)
{
    int32_t *sel = xmalloc(sizeof(int32_t) * (size_t)T * K);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            int e, dup;
            do {
                e = rnd_uniform() < -0.5 ? 0 : (int)((rnd_uniform() + 1.0) * 0.5 * E) % E;
                dup = e == empty;
                for (int i = 0; i < j; i++) dup |= sel[t * K + i] == e;
            } while (dup);
            sel[t * K + j] = e;
        }
    return sel;
}

/* T K E shared: the groups, rows, slots and tiles against a grouping written here from the contract (groups in
 * expert order, rows in (token, pick) order, an id out of range grouped with expert 0, the shared group last, tiles of
 * at most MOE_GEMM_BM rows of one group) */
static void group_cpu_check(const kc_case *c)
{
    const int T = c->p[0], K = c->p[1], E = c->p[2], shared = c->p[3];
    const int TK = T * K, S = shared ? T : 0, mt = moe_group_max_tiles(TK, E, S, MOE_GEMM_BM);
    int32_t *sel = moe_picks(T, K, E, E / 2);
    if (T > 3) sel[3 * K] = -1; /* out of range: grouped with expert 0 */
    int32_t *off = xmalloc(sizeof(int32_t) * (size_t)(E + 2)), *rt = xmalloc(sizeof(int32_t) * (size_t)(TK + S + 1));
    int32_t *sr = xmalloc(sizeof(int32_t) * (size_t)(TK + 1)), *tl = xmalloc(sizeof(int32_t) * 3 * (size_t)(mt + 1));
    const int nt = moe_group_cpu(sel, T, K, E, S, MOE_GEMM_BM, off, rt, sr, tl);
    int32_t *woff = xmalloc(sizeof(int32_t) * (size_t)(E + 2)), *wrt = xmalloc(sizeof(int32_t) * (size_t)(TK + S + 1));
    int32_t *wsr = xmalloc(sizeof(int32_t) * (size_t)(TK + 1)), *wtl = xmalloc(sizeof(int32_t) * 3 * (size_t)(mt + 1));
    int r = 0, n = 0;
    for (int g = 0; g <= E; g++) {
        woff[g] = r;
        if (g < E) {
            for (int t = 0; t < T; t++)
                for (int j = 0; j < K; j++) {
                    int e = sel[t * K + j];
                    if ((e < 0 || e >= E ? 0 : e) == g) wrt[r] = t, wsr[t * K + j] = r, r++;
                }
        } else {
            for (int t = 0; t < S; t++) wrt[r++] = t;
        }
        for (int a = woff[g]; a < r; a += MOE_GEMM_BM, n++)
            wtl[3 * n] = g, wtl[3 * n + 1] = a, wtl[3 * n + 2] = a + MOE_GEMM_BM < r ? a + MOE_GEMM_BM : r;
    }
    woff[E + 1] = r;
    EXPECT(r == TK + S);
    EXPECT(nt == n && nt <= mt);
    EXPECT(memcmp(off, woff, sizeof(int32_t) * (size_t)(E + 2)) == 0);
    EXPECT(memcmp(rt, wrt, sizeof(int32_t) * (size_t)(TK + S)) == 0);
    EXPECT(memcmp(sr, wsr, sizeof(int32_t) * (size_t)TK) == 0);
    EXPECT(nt != n || memcmp(tl, wtl, sizeof(int32_t) * 3 * (size_t)n) == 0);
    free(sel), free(off), free(rt), free(sr), free(tl), free(woff), free(wrt), free(wsr), free(wtl);
}

/* T K E H Im Is tile: moe_gemm_gate_up_cpu and moe_gemm_down_cpu (on its own act) against double sums over
 * moe_group_cpu's rows */
static void moe_gemm_cpu_check(const kc_case *c)
{
    const int T = c->p[0], K = c->p[1], E = c->p[2], H = c->p[3], Im = c->p[4], Is = c->p[5];
    const int TK = T * K, S = Is > 0 ? T : 0, R = TK + S, ldx = H + 16, W = Im > Is ? Im : Is, lda = W + 8;
    const int ldy = H + 8, mt = moe_group_max_tiles(TK, E, S, MOE_GEMM_BM);
    int32_t *sel = moe_picks(T, K, E, E - 1);
    const double aw = 1.0 / sqrt((double)H), ad = 1.0 / sqrt((double)W);
    float *x = rnd_floats((size_t)T * ldx, 2.0), *wgu = rnd_floats((size_t)E * 2 * Im * H, aw);
    float *wd = rnd_floats((size_t)E * H * Im, ad), *sgu = rnd_floats((size_t)2 * Is * H + 1, aw);
    float *sd = rnd_floats((size_t)H * Is + 1, ad);
    int32_t *off = xmalloc(sizeof(int32_t) * (size_t)(E + 2)), *rt = xmalloc(sizeof(int32_t) * (size_t)R);
    int32_t *sr = xmalloc(sizeof(int32_t) * (size_t)TK), *tl = xmalloc(sizeof(int32_t) * 3 * (size_t)mt);
    moe_group_cpu(sel, T, K, E, S, MOE_GEMM_BM, off, rt, sr, tl);
    float *act = xcalloc((size_t)R * lda, sizeof(float)), *ys = xcalloc((size_t)R * ldy, sizeof(float));
    moe_gemm_gate_up_cpu(act, lda, x, ldx, rt, off, E, H, Im, Is, wgu, Is ? sgu : NULL);
    moe_gemm_down_cpu(ys, ldy, act, lda, off, E, H, Im, Is, wd, Is ? sd : NULL);
    double ea = 0, ma = 0, ey = 0, my = 0;
    for (int g = 0; g <= E; g++) {
        const int I = g < E ? Im : Is;
        const float *Wg = g < E ? wgu + (size_t)g * 2 * Im * H : sgu, *Wd = g < E ? wd + (size_t)g * H * Im : sd;
        for (int r = off[g]; r < off[g + 1]; r++) {
            const float *xr = x + (size_t)rt[r] * ldx;
            for (int j = 0; j < I; j++) {
                double gs = 0, us = 0;
                for (int e = 0; e < H; e++) gs += (double)xr[e] * Wg[(size_t)j * H + e], us += (double)xr[e] * Wg[(size_t)(I + j) * H + e];
                double a = gs / (1.0 + exp(-gs)) * us;
                ea = fmax(ea, fabs(act[(size_t)r * lda + j] - a)), ma = fmax(ma, fabs(a));
            }
            for (int n = 0; n < H; n++) {
                double y = 0;
                for (int j = 0; j < I; j++) y += (double)act[(size_t)r * lda + j] * Wd[(size_t)n * I + j];
                ey = fmax(ey, fabs(ys[(size_t)r * ldy + n] - y)), my = fmax(my, fabs(y));
            }
        }
    }
    EXPECT(ea <= 1e-5 * fmax(1.0, ma));
    EXPECT(ey <= 1e-5 * fmax(1.0, my));
    if (test_failed_here) fprintf(stderr, "  act err %g (max %g), y err %g (max %g)\n", ea, ma, ey, my);
    free(sel), free(x), free(wgu), free(wd), free(sgu), free(sd), free(off), free(rt), free(sr), free(tl), free(act), free(ys);
}

/* C K ldx nslots: the state-carrying form, as causal_conv1d_silu's CPU check runs it, on these sequences */
static void conv_state_cpu_check(const kc_case *c) { conv_cpu_check(c); }

#ifdef DFLASH_CUDA
/* device bf16 (n) against ref */
static void cmp_dev(const char *name, const uint16_t *d, const float *ref, size_t n)
{
    uint16_t *h = dev_get(d, n * 2);
    compare_bf16(name, h, ref, n, TOL, TOL);
    free(h);
}

/* device fp32 (n) against ref: max |got - ref| <= tol * max(1, |ref|) */
static void cmp_dev_f32(const char *name, const float *d, const float *ref, size_t n, double tol)
{
    float *h = dev_get(d, n * 4);
    double worst = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)h[i] - ref[i]) / fmax(1.0, fabs(ref[i]));
        if (!(e <= tol)) bad = 1;
        worst = fmax(worst, e);
    }
    printf("%s %s max_rel_err=%.3g (tol %.0e)\n", bad ? "FAIL" : "ok", name, worst, tol);
    if (bad) failures++;
    free(h);
}

static int32_t *cu_of(const int *lens, int nseq, int *T)
{
    int32_t *cu = xmalloc(sizeof(int32_t) * (size_t)(nseq + 1));
    cu[0] = 0;
    for (int s = 0; s < nseq; s++) cu[s + 1] = cu[s] + lens[s];
    *T = cu[nseq];
    return cu;
}

static void conv_cuda_check(const kc_case *c)
{
    const int *lens = c->seqs, NS = c->nseqs, C = c->p[0], K = c->p[1], ldx = c->p[2];
    int T;
    int32_t *cu = cu_of(lens, NS, &T);
    float *xf = xmalloc(sizeof(float) * (size_t)T * ldx), *wf = xmalloc(sizeof(float) * (size_t)C * K);
    float *ref = xmalloc(sizeof(float) * (size_t)T * C);
    uint16_t *xh = rnd_bf16((size_t)T * ldx, 2.0, xf), *wh = rnd_bf16((size_t)C * K, 0.5, wf);
    causal_conv1d_silu_cpu(ref, C, xf, ldx, wf, C, K, cu, NS);
    uint16_t *dx = dev_upload(xh, (size_t)T * ldx * 2), *dw = dev_upload(wh, (size_t)C * K * 2);
    uint16_t *dy = dev_poisoned((size_t)T * C);
    int32_t *dcu = dev_upload(cu, sizeof(int32_t) * (size_t)(NS + 1));
    causal_conv1d_silu_cuda(dy, C, dx, ldx, dw, C, K, dcu, NS, T, stream);
    char name[96];
    snprintf(name, sizeof name, "causal_conv1d_silu T=%d nseq=%d C=%d K=%d ldx=%d", T, NS, C, K, ldx);
    cmp_dev(name, dy, ref, (size_t)T * C);
    CHECK_CUDA(cudaFree(dx)); CHECK_CUDA(cudaFree(dw)); CHECK_CUDA(cudaFree(dy)); CHECK_CUDA(cudaFree(dcu));
    free(cu), free(xf), free(wf), free(ref), free(xh), free(wh);
}

/* Decoding: 4 sequences continuing from carried histories (slots of (K-1, C)): one from a sequence start (slot -1),
 * the others from random histories, with 1, 2 (< K-1: part of the old history stays), 3 and 9 new rows; outputs and
 * the new histories (exact bf16 copies of inputs) against causal_conv1d_silu_state_cpu per sequence. */
static void conv_state_cuda_check(const kc_case *c)
{
    const int *lens = c->seqs, NS = c->nseqs, C = c->p[0], K = c->p[1], ldx = c->p[2], NSL = c->p[3], H1 = (K - 1) * C;
    const int32_t *in = c->aux, *out = c->aux + NS; /* written slots are read by none */
    int T;
    int32_t *cu = cu_of(lens, NS, &T);
    float *xf = xmalloc(sizeof(float) * (size_t)T * ldx), *wf = xmalloc(sizeof(float) * (size_t)C * K);
    float *hf = xmalloc(sizeof(float) * NSL * H1), *ref = xmalloc(sizeof(float) * (size_t)T * C);
    uint16_t *xh = rnd_bf16((size_t)T * ldx, 2.0, xf), *wh = rnd_bf16((size_t)C * K, 0.5, wf);
    uint16_t *hh = rnd_bf16((size_t)NSL * H1, 2.0, hf);
    float *want = xmalloc(sizeof(float) * NSL * H1); /* the slots after the call */
    memcpy(want, hf, sizeof(float) * NSL * H1);
    float *st = xmalloc(sizeof(float) * H1);
    for (int s = 0; s < NS; s++) {
        if (in[s] >= 0) memcpy(st, hf + (size_t)in[s] * H1, sizeof(float) * H1);
        else memset(st, 0, sizeof(float) * H1);
        causal_conv1d_silu_state_cpu(ref + (size_t)cu[s] * C, C, xf + (size_t)cu[s] * ldx, ldx, wf, C, K, lens[s], st);
        memcpy(want + (size_t)out[s] * H1, st, sizeof(float) * H1);
    }
    uint16_t *dx = dev_upload(xh, (size_t)T * ldx * 2), *dw = dev_upload(wh, (size_t)C * K * 2);
    uint16_t *dh = dev_upload(hh, (size_t)NSL * H1 * 2), *dy = dev_poisoned((size_t)T * C);
    int32_t *dcu = dev_upload(cu, sizeof(int32_t) * (NS + 1)), *din = dev_upload(in, sizeof(int32_t) * NS);
    int32_t *dout = dev_upload(out, sizeof(int32_t) * NS);
    causal_conv1d_silu_state_cuda(dy, C, dx, ldx, dw, C, K, dcu, NS, T, dh, din, dout, stream);
    cmp_dev("causal_conv1d_silu_state outputs", dy, ref, (size_t)T * C);
    uint16_t *got = dev_get(dh, (size_t)NSL * H1 * 2);
    size_t wrong = 0;
    for (size_t i = 0; i < (size_t)NSL * H1; i++) wrong += bf16_to_f32(got[i]) != want[i];
    printf("%s causal_conv1d_silu_state new histories in their slots, the other slots untouched: %zu of %d "
           "values differ\n", wrong ? "FAIL" : "ok", wrong, NSL * H1);
    if (wrong) failures++;
    void *dev[] = {dx, dw, dh, dy, dcu, din, dout};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CHECK_CUDA(cudaFree(dev[i]));
    free(cu), free(xf), free(wf), free(hf), free(ref), free(xh), free(wh), free(hh), free(want), free(st), free(got);
}

static void prep_cuda_check(const kc_case *c)
{
    const int T = c->p[0], hk = c->p[1], dk = c->p[2], hv = c->p[3];
    const int ldqk = 2 * hk * dk + 24, ldba = 2 * hv + 6; /* b in columns [0, hv), a in [hv + 3, 2 hv + 3) */
    float *qkf = xmalloc(sizeof(float) * (size_t)T * ldqk), *baf = xmalloc(sizeof(float) * (size_t)T * ldba);
    uint16_t *qkh = rnd_bf16((size_t)T * ldqk, 1.5, qkf), *bah = rnd_bf16((size_t)T * ldba, 4.0, baf);
    float alog[64], dtb[64];
    for (int h = 0; h < hv; h++) alog[h] = (float)log(1.0 + 7.5 * (rnd_uniform() + 1.0)), dtb[h] = (float)rnd_uniform();
    float *beta = xmalloc(sizeof(float) * (size_t)T * hv), *g = xmalloc(sizeof(float) * (size_t)T * hv);
    gated_delta_prep_cpu(qkf, ldqk, T, hk, dk, beta, g, hv, baf, ldba, baf + hv + 3, ldba, alog, dtb, hv);
    uint16_t *dqk = dev_upload(qkh, (size_t)T * ldqk * 2), *dba = dev_upload(bah, (size_t)T * ldba * 2);
    float *dal = dev_upload(alog, sizeof(float) * (size_t)hv), *ddt = dev_upload(dtb, sizeof(float) * (size_t)hv);
    float *dbeta = dev_upload(NULL, sizeof(float) * (size_t)T * hv), *dg = dev_upload(NULL, sizeof(float) * (size_t)T * hv);
    gated_delta_prep_cuda(dqk, ldqk, T, hk, dk, dbeta, dg, hv, dba, ldba, dba + hv + 3, ldba, dal, ddt, hv, stream);
    char name[128];
    snprintf(name, sizeof name, "gated_delta_prep qk T=%d hk=%d dk=%d", T, hk, dk);
    cmp_dev(name, dqk, qkf, (size_t)T * ldqk); /* the padding columns pass through untouched */
    snprintf(name, sizeof name, "gated_delta_prep beta T=%d hv=%d", T, hv);
    cmp_dev_f32(name, dbeta, beta, (size_t)T * hv, 1e-5);
    snprintf(name, sizeof name, "gated_delta_prep g T=%d hv=%d", T, hv);
    cmp_dev_f32(name, dg, g, (size_t)T * hv, 1e-5);
    CHECK_CUDA(cudaFree(dqk)); CHECK_CUDA(cudaFree(dba)); CHECK_CUDA(cudaFree(dal)); CHECK_CUDA(cudaFree(ddt));
    CHECK_CUDA(cudaFree(dbeta)); CHECK_CUDA(cudaFree(dg));
    free(qkf), free(baf), free(qkh), free(bah), free(beta), free(g);
}

static void gated_rmsnorm_cuda_check(const kc_case *c)
{
    const int T = c->p[0], heads = c->p[1], dim = c->p[2];
    const int ld = heads * dim, ldz = ld + 40;
    float *xf = xmalloc(sizeof(float) * (size_t)T * ld), *zf = xmalloc(sizeof(float) * (size_t)T * ldz);
    float *wf = xmalloc(sizeof(float) * (size_t)dim);
    uint16_t *xh = rnd_bf16((size_t)T * ld, 3.0, xf), *zh = rnd_bf16((size_t)T * ldz, 3.0, zf);
    uint16_t *wh = rnd_bf16((size_t)dim, 1.0, wf);
    uint16_t *dx = dev_upload(xh, (size_t)T * ld * 2), *dz = dev_upload(zh, (size_t)T * ldz * 2);
    uint16_t *dw = dev_upload(wh, (size_t)dim * 2);
    gated_rmsnorm_cpu(xf, ld, xf, ld, zf + 40, ldz, wf, T, heads, dim, 1e-6f);
    gated_rmsnorm_cuda(dx, ld, dx, ld, dz + 40, ldz, dw, T, heads, dim, 1e-6f, stream); /* in place, as the model */
    char name[128];
    snprintf(name, sizeof name, "gated_rmsnorm in place T=%d heads=%d dim=%d", T, heads, dim);
    cmp_dev(name, dx, xf, (size_t)T * ld);
    CHECK_CUDA(cudaFree(dx)); CHECK_CUDA(cudaFree(dz)); CHECK_CUDA(cudaFree(dw));
    free(xf), free(zf), free(wf), free(xh), free(zh), free(wh);
}

static void sigmoid_gate_cuda_check(const kc_case *c)
{
    const int rows = c->p[0], dim = c->p[1], ldg = 2 * dim + 8;
    float *xf = xmalloc(sizeof(float) * rows * dim), *gf = xmalloc(sizeof(float) * rows * ldg);
    uint16_t *xh = rnd_bf16((size_t)rows * dim, 2.0, xf), *gh = rnd_bf16((size_t)rows * ldg, 6.0, gf);
    uint16_t *dx = dev_upload(xh, (size_t)rows * dim * 2), *dg = dev_upload(gh, (size_t)rows * ldg * 2);
    sigmoid_gate_cpu(xf, dim, xf, dim, gf + dim, ldg, rows, dim);
    sigmoid_gate_cuda(dx, dim, dx, dim, dg + dim, ldg, rows, dim, stream);
    char name[96];
    snprintf(name, sizeof name, "sigmoid_gate in place rows=%d dim=%d ldg=%d", rows, dim, ldg);
    cmp_dev(name, dx, xf, (size_t)rows * dim);
    CHECK_CUDA(cudaFree(dx)); CHECK_CUDA(cudaFree(dg));
    free(xf), free(gf), free(xh), free(gh);
}

static void router_cuda_check(const kc_case *c)
{
    const int T = c->p[0], E = c->p[1], K = c->p[2], norm = c->p[3];
    const int ldl = E + 3;
    float *lf = xmalloc(sizeof(float) * (size_t)T * ldl);
    for (size_t i = 0; i < (size_t)T * ldl; i++) lf[i] = (float)(4.0 * rnd_uniform());
    int32_t *sel = xmalloc(sizeof(int32_t) * (size_t)T * K);
    float *selw = xmalloc(sizeof(float) * (size_t)T * K);
    moe_router_topk_cpu(sel, selw, lf, ldl, T, E, K, norm);
    float *dl = dev_upload(lf, sizeof(float) * (size_t)T * ldl), *dw = dev_upload(NULL, sizeof(float) * (size_t)T * K);
    int32_t *ds = dev_upload(NULL, sizeof(int32_t) * (size_t)T * K);
    moe_router_topk_cuda(ds, dw, dl, ldl, T, E, K, norm, stream);
    int32_t *gs = dev_get(ds, sizeof(int32_t) * (size_t)T * K);
    int mism = 0;
    for (int i = 0; i < T * K; i++) mism += gs[i] != sel[i];
    printf("%s moe_router_topk ids T=%d E=%d K=%d norm=%d: %d of %d differ\n", mism ? "FAIL" : "ok", T, E, K, norm,
           mism, T * K);
    if (mism) failures++;
    char name[128];
    snprintf(name, sizeof name, "moe_router_topk weights T=%d E=%d K=%d norm=%d", T, E, K, norm);
    cmp_dev_f32(name, dw, selw, (size_t)T * K, 1e-5);
    CHECK_CUDA(cudaFree(dl)); CHECK_CUDA(cudaFree(dw)); CHECK_CUDA(cudaFree(ds));
    free(lf), free(sel), free(selw), free(gs);
}

static void combine_cuda_check(const kc_case *c)
{
    const int T = c->p[0], K = c->p[1], H = c->p[2], shared = c->p[3];
    const int ldr = H + 8, ldy = H, lds = H + 16, ldsg = 5;
    float *rf = xmalloc(sizeof(float) * (size_t)T * ldr), *yf = xmalloc(sizeof(float) * (size_t)T * K * ldy);
    float *sf = xmalloc(sizeof(float) * (size_t)T * lds), *sg = xmalloc(sizeof(float) * (size_t)T * ldsg);
    uint16_t *rh = rnd_bf16((size_t)T * ldr, 2.0, rf), *yh = rnd_bf16((size_t)T * K * ldy, 2.0, yf);
    uint16_t *sh = rnd_bf16((size_t)T * lds, 2.0, sf);
    int32_t *row = xmalloc(sizeof(int32_t) * (size_t)T * K);
    float *w = xmalloc(sizeof(float) * (size_t)T * K);
    for (int i = 0; i < T * K; i++) row[i] = (i * 7 + 3) % (T * K), w[i] = (float)(0.5 * (rnd_uniform() + 1.0));
    for (int i = 0; i < T * ldsg; i++) sg[i] = (float)(3.0 * rnd_uniform());
    uint16_t *dr = dev_upload(rh, (size_t)T * ldr * 2), *dy = dev_upload(yh, (size_t)T * K * ldy * 2);
    uint16_t *dsh = dev_upload(sh, (size_t)T * lds * 2);
    int32_t *drow = dev_upload(row, sizeof(int32_t) * (size_t)T * K);
    float *dw = dev_upload(w, sizeof(float) * (size_t)T * K), *dsg = dev_upload(sg, sizeof(float) * (size_t)T * ldsg);
    /* shared: 0 none, 1 gated, 2 ungated */
    moe_combine_cpu(rf, ldr, rf, ldr, yf, ldy, row, w, T, K, H, shared ? sf : NULL, lds, shared == 1 ? sg + 2 : NULL,
                    ldsg);
    moe_combine_cuda(dr, ldr, dr, ldr, dy, ldy, drow, dw, T, K, H, shared ? dsh : NULL, lds,
                     shared == 1 ? dsg + 2 : NULL, ldsg, stream);
    char name[128];
    snprintf(name, sizeof name, "moe_combine in place T=%d K=%d H=%d shared=%d", T, K, H, shared);
    cmp_dev(name, dr, rf, (size_t)T * ldr);
    CHECK_CUDA(cudaFree(dr)); CHECK_CUDA(cudaFree(dy)); CHECK_CUDA(cudaFree(dsh)); CHECK_CUDA(cudaFree(drow));
    CHECK_CUDA(cudaFree(dw)); CHECK_CUDA(cudaFree(dsg));
    free(rf), free(yf), free(sf), free(sg), free(rh), free(yh), free(sh), free(row), free(w);
}

static void group_cuda_check(const kc_case *c)
{
    const int T = c->p[0], K = c->p[1], E = c->p[2], shared = c->p[3];
    const int TK = T * K, S = shared ? T : 0, mt = moe_group_max_tiles(TK, E, S, MOE_GEMM_BM);
    int32_t *sel = moe_picks(T, K, E, E / 2);
    if (T > 3) sel[3 * K] = -1; /* out of range: grouped with expert 0 */
    int32_t *off = xmalloc(sizeof(int32_t) * (size_t)(E + 2)), *rt = xmalloc(sizeof(int32_t) * (size_t)(TK + S));
    int32_t *sr = xmalloc(sizeof(int32_t) * (size_t)TK), *tl = xmalloc(sizeof(int32_t) * 3 * (size_t)mt);
    const int nt = moe_group_cpu(sel, T, K, E, S, MOE_GEMM_BM, off, rt, sr, tl);
    int32_t *dsel = dev_upload(sel, sizeof(int32_t) * (size_t)TK), *doff = dev_upload(NULL, sizeof(int32_t) * (size_t)(E + 2));
    int32_t *drt = dev_upload(NULL, sizeof(int32_t) * (size_t)(TK + S)), *dsr = dev_upload(NULL, sizeof(int32_t) * (size_t)TK);
    int32_t *dtl = dev_upload(NULL, sizeof(int32_t) * 3 * (size_t)mt), *dnt = dev_upload(NULL, sizeof(int32_t));
    void *work = dev_upload(NULL, moe_group_cuda_workspace(TK, E));
    moe_group_cuda(dsel, T, K, E, S, MOE_GEMM_BM, doff, drt, dsr, dtl, dnt, work, stream);
    int32_t *goff = dev_get(doff, sizeof(int32_t) * (size_t)(E + 2)), *grt = dev_get(drt, sizeof(int32_t) * (size_t)(TK + S));
    int32_t *gsr = dev_get(dsr, sizeof(int32_t) * (size_t)TK), *gnt = dev_get(dnt, sizeof(int32_t));
    int32_t *gtl = dev_get(dtl, sizeof(int32_t) * 3 * (size_t)(nt > 0 ? nt : 1));
    int bad = *gnt != nt;
    bad += memcmp(goff, off, sizeof(int32_t) * (size_t)(E + 2)) != 0;
    bad += memcmp(grt, rt, sizeof(int32_t) * (size_t)(TK + S)) != 0;
    bad += memcmp(gsr, sr, sizeof(int32_t) * (size_t)TK) != 0;
    bad += nt > 0 && memcmp(gtl, tl, sizeof(int32_t) * 3 * (size_t)nt) != 0;
    printf("%s moe_group T=%d K=%d E=%d shared=%d: %d tiles (GPU %d), %d of 5 index arrays differ\n", bad ? "FAIL" : "ok",
           T, K, E, shared, nt, *gnt, bad);
    if (bad) failures++;
    CHECK_CUDA(cudaFree(dsel)); CHECK_CUDA(cudaFree(doff)); CHECK_CUDA(cudaFree(drt)); CHECK_CUDA(cudaFree(dsr));
    CHECK_CUDA(cudaFree(dtl)); CHECK_CUDA(cudaFree(dnt)); CHECK_CUDA(cudaFree(work));
    free(sel), free(off), free(rt), free(sr), free(tl), free(goff), free(grt), free(gsr), free(gnt), free(gtl);
}

/* The grouped GEMMs on the device schedule of random picks (a strided, wider x; act and ys through their own
 * row strides) against moe_gemm_*_cpu on the same bf16 values; the down GEMM takes the GPU's act (bf16) as input. */
static void moe_gemm_cuda_check(const kc_case *c)
{
    const int T = c->p[0], K = c->p[1], E = c->p[2], H = c->p[3], Im = c->p[4], Is = c->p[5], bn = c->p[6];
    moe_gemm_cuda_set_bn(bn);
    const int TK = T * K, S = Is > 0 ? T : 0, R = TK + S, ldx = H + 16, W = Im > Is ? Im : Is, lda = W + 8;
    const int ldy = H + 8, mt = moe_group_max_tiles(TK, E, S, MOE_GEMM_BM);
    int32_t *sel = moe_picks(T, K, E, E - 1);
    float *xf = xmalloc(sizeof(float) * (size_t)T * ldx), *wgu = xmalloc(sizeof(float) * (size_t)E * 2 * Im * H);
    float *wd = xmalloc(sizeof(float) * (size_t)E * H * Im);
    float *sgu = xmalloc(sizeof(float) * (size_t)(2 * Is * H + 1)), *sd = xmalloc(sizeof(float) * (size_t)(H * Is + 1));
    const double aw = 1.0 / sqrt((double)H), ad = 1.0 / sqrt((double)W);
    uint16_t *xh = rnd_bf16((size_t)T * ldx, 2.0, xf), *wguh = rnd_bf16((size_t)E * 2 * Im * H, aw, wgu);
    uint16_t *wdh = rnd_bf16((size_t)E * H * Im, ad, wd), *sguh = rnd_bf16((size_t)2 * Is * H, aw, sgu);
    uint16_t *sdh = rnd_bf16((size_t)H * Is, ad, sd);
    int32_t *off = xmalloc(sizeof(int32_t) * (size_t)(E + 2)), *rt = xmalloc(sizeof(int32_t) * (size_t)R);
    int32_t *sr = xmalloc(sizeof(int32_t) * (size_t)TK), *tl = xmalloc(sizeof(int32_t) * 3 * (size_t)mt);
    moe_group_cpu(sel, T, K, E, S, MOE_GEMM_BM, off, rt, sr, tl);
    float *act = xcalloc((size_t)R * lda, sizeof(float)), *ys = xcalloc((size_t)R * ldy, sizeof(float));
    moe_gemm_gate_up_cpu(act, lda, xf, ldx, rt, off, E, H, Im, Is, wgu, Is ? sgu : NULL);
    int32_t *dsel = dev_upload(sel, sizeof(int32_t) * (size_t)TK), *doff = dev_upload(NULL, sizeof(int32_t) * (size_t)(E + 2));
    int32_t *drt = dev_upload(NULL, sizeof(int32_t) * (size_t)R), *dsr = dev_upload(NULL, sizeof(int32_t) * (size_t)TK);
    int32_t *dtl = dev_upload(NULL, sizeof(int32_t) * 3 * (size_t)mt), *dnt = dev_upload(NULL, sizeof(int32_t));
    void *work = dev_upload(NULL, moe_group_cuda_workspace(TK, E));
    uint16_t *dx = dev_upload(xh, (size_t)T * ldx * 2), *dwgu = dev_upload(wguh, (size_t)E * 2 * Im * H * 2);
    uint16_t *dwd = dev_upload(wdh, (size_t)E * H * Im * 2);
    uint16_t *dsgu = Is ? dev_upload(sguh, (size_t)2 * Is * H * 2) : NULL, *dsd = Is ? dev_upload(sdh, (size_t)H * Is * 2) : NULL;
    uint16_t *dact = dev_poisoned((size_t)R * lda), *dys = dev_poisoned((size_t)R * ldy);
    moe_group_cuda(dsel, T, K, E, S, MOE_GEMM_BM, doff, drt, dsr, dtl, dnt, work, stream);
    moe_gemm_gate_up_cuda(dact, lda, dx, ldx, drt, dtl, dnt, mt, E, H, Im, Is, dwgu, dsgu, stream);
    moe_gemm_down_cuda(dys, ldy, dact, lda, dtl, dnt, mt, E, H, Im, Is, dwd, dsd, stream);
    /* act: the columns each group writes (routed rows Im wide, shared rows Is wide); the rest stays poisoned */
    uint16_t *gact = dev_get(dact, (size_t)R * lda * 2);
    size_t n = 0;
    uint16_t *ga = xmalloc(sizeof(uint16_t) * (size_t)R * W);
    float *ra = xmalloc(sizeof(float) * (size_t)R * W), *gaf = xmalloc(sizeof(float) * (size_t)R * lda);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < (r < TK ? Im : Is); j++, n++) ga[n] = gact[(size_t)r * lda + j], ra[n] = act[(size_t)r * lda + j];
    char name[160];
    snprintf(name, sizeof name, "moe_gemm_gate_up T=%d K=%d E=%d H=%d Im=%d Is=%d tile=%d", T, K, E, H, Im, Is, bn);
    compare_bf16(name, ga, ra, n, TOL, TOL);
    for (size_t i = 0; i < (size_t)R * lda; i++) gaf[i] = bf16_to_f32(gact[i]);
    moe_gemm_down_cpu(ys, ldy, gaf, lda, off, E, H, Im, Is, wd, Is ? sd : NULL);
    uint16_t *gys = dev_get(dys, (size_t)R * ldy * 2), *gy = xmalloc(sizeof(uint16_t) * (size_t)R * H);
    float *ry = xmalloc(sizeof(float) * (size_t)R * H);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < H; c++) gy[(size_t)r * H + c] = gys[(size_t)r * ldy + c], ry[(size_t)r * H + c] = ys[(size_t)r * ldy + c];
    snprintf(name, sizeof name, "moe_gemm_down T=%d K=%d E=%d H=%d Im=%d Is=%d tile=%d", T, K, E, H, Im, Is, bn);
    compare_bf16(name, gy, ry, (size_t)R * H, TOL, TOL);
    /* deterministic: the same launches again give the same bits */
    moe_gemm_gate_up_cuda(dact, lda, dx, ldx, drt, dtl, dnt, mt, E, H, Im, Is, dwgu, dsgu, stream);
    moe_gemm_down_cuda(dys, ldy, dact, lda, dtl, dnt, mt, E, H, Im, Is, dwd, dsd, stream);
    uint16_t *gys2 = dev_get(dys, (size_t)R * ldy * 2);
    const int same = !memcmp(gys, gys2, (size_t)R * ldy * 2);
    printf("%s moe_gemm repeat T=%d E=%d tile=%d: %s\n", same ? "ok" : "FAIL", T, E, bn,
           same ? "bit-identical" : "differs");
    moe_gemm_cuda_set_bn(128);
    if (!same) failures++;
    void *d[] = {dsel, doff, drt, dsr, dtl, dnt, work, dx, dwgu, dwd, dsgu, dsd, dact, dys};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) CHECK_CUDA(cudaFree(d[i]));
    free(sel), free(xf), free(wgu), free(wd), free(sgu), free(sd), free(xh), free(wguh), free(wdh), free(sguh), free(sdh);
    free(off), free(rt), free(sr), free(tl), free(act), free(ys), free(gact), free(ga), free(ra), free(gaf), free(gys);
    free(gy), free(ry), free(gys2);
}

#endif

const kc_op kc_causal_conv1d = {"causal_conv1d_silu", "bf16", "C K ldx", conv_cpu_check, KC_CUDA(conv_cuda_check)};
const kc_op kc_causal_conv1d_state = {"causal_conv1d_silu_state", "bf16", "C K ldx nslots", conv_state_cpu_check,
                                      KC_CUDA(conv_state_cuda_check)};
const kc_op kc_gated_delta_prep = {"gated_delta_prep", "bf16 (beta, g f32)", "T hk dk hv", prep_cpu_check,
                                   KC_CUDA(prep_cuda_check)};
const kc_op kc_gated_rmsnorm = {"gated_rmsnorm", "bf16", "T heads dim", gated_rmsnorm_cpu_check,
                                 KC_CUDA(gated_rmsnorm_cuda_check)};
const kc_op kc_sigmoid_gate = {"sigmoid_gate", "bf16", "rows dim", sigmoid_gate_cpu_check,
                                KC_CUDA(sigmoid_gate_cuda_check)};
const kc_op kc_moe_router_topk = {"moe_router_topk", "f32->i32,f32", "T E K norm", router_cpu_check,
                                  KC_CUDA(router_cuda_check)};
const kc_op kc_moe_combine = {"moe_combine", "bf16", "T K H shared", combine_cpu_check,
                              KC_CUDA(combine_cuda_check)};
const kc_op kc_moe_group = {"moe_group", "i32", "T K E shared", group_cpu_check, KC_CUDA(group_cuda_check)};
const kc_op kc_moe_gemm = {"moe_gemm", "bf16", "T K E H Im Is tile", moe_gemm_cpu_check,
                           KC_CUDA(moe_gemm_cuda_check)};
