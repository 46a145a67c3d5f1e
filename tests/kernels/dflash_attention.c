/* dflash_attention: the drafter's attention (a block's queries see its context rows [ctx_start, ctx_start + ctx_len)
 * and the whole block, optionally within a sliding window of positions), forward and backward.
 * CPU: the forward against a naive dense-mask attention built exactly like make_goldens.py builds its (N*B, T+N*B)
 * mask (and make_swa_golden.py for a sliding window: also |q - k| < W in positions); the backward against central
 * finite differences of L = Σ dout ⊙ out for every input (q, kc, vc, kb, vb), context rows no block sees getting no
 * gradient; a window that cuts nothing gives the bits of none; a block's rows see each other both ways.
 * CUDA: forward and backward against the CPU reference on the same bf16 values (the CPU backward is given the GPU's
 * out and lse, so the backward is checked on its own). Every tensor lives in a strided device buffer (column blocks
 * of wider tensors, padding columns that must stay untouched); outputs start as NaN so an element the kernels fail
 * to write fails. Errors are max|got - ref| / max|ref| over the tensor (lse: absolute). Large shapes compare a subset
 * of blocks (and the context rows only those blocks see). Two runs must give the same bits; with wide_check a window
 * longer than every context must give the bits of no window; timing: the Qwen3-8B drafter shape's time.
 * Parameters: nh nkv hd B window pad wide_check timing layout N, the blocks by layout:
 *   0: seqs = sequence lengths, aux = (sequence, anchor) per block: context = the sequence's rows before the anchor;
 *   1: seqs = sequence lengths, aux = anchors per sequence, drawn distinct (make_blocks);
 *   2: N arbitrary context intervals (not prefixes, unsorted, overlapping) in seqs[0] rows;
 *   3: N distinct sorted anchors in one sequence of seqs[0] rows, 20 blocks compared on the CPU (the drafter). */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dflash_attention.h"
#include "tests/kernel_cases.h"
#include "tests/test.h"
#include "util.h"

/* bf16 rounding of out / P / dS (2^-9 relative each) plus fp32 order: relative to the tensor's largest value */
#define TOL_OUT 1e-2
#define TOL_GRAD 2e-2
#define TOL_LSE 2e-3 /* absolute, natural log */

static int rnd_int(int n) { return (int)((rnd_uniform() + 1.0) * 0.5 * n) % n; }

typedef struct attn_case {
    const char *name;
    int N, B, nh, nkv, hd, T;
    int32_t *cs, *cl;  /* (N) */
    int nsub, *sub;    /* blocks compared on the CPU (all when sub == NULL) */
    int pad;           /* extra columns on every strided buffer */
    int timing;
    int window;        /* sliding window (0: none) */
    int wide_check;    /* also run with a window longer than every context: the bits of window 0 */
} attn_case;

/* Sequences of the given lengths packed into T rows; per sequence, nanch sorted distinct anchors in
 * [0, len - 1) (block j's context: its sequence's rows before the anchor). */
static void make_blocks(attn_case *k, const int *lens, const int *nanch, int nseq, int B)
{
    int N = 0, T = 0;
    for (int i = 0; i < nseq; i++) N += nanch[i], T += lens[i];
    k->N = N, k->T = T, k->B = B;
    k->cs = xmalloc(sizeof(int32_t) * (size_t)N), k->cl = xmalloc(sizeof(int32_t) * (size_t)N);
    int j = 0, start = 0;
    for (int i = 0; i < nseq; i++) {
        const int span = lens[i] - 1 > nanch[i] ? lens[i] - 1 : nanch[i];
        char *used = xcalloc((size_t)span, 1);
        for (int n = 0; n < nanch[i]; n++) { /* distinct draws */
            int a;
            do a = rnd_int(span); while (used[a]);
            used[a] = 1;
        }
        if (nanch[i] > 1) used[0] = 1, used[1] = 0; /* some block sees no context */
        int got = 0;
        for (int a = 0; a < span && got < nanch[i]; a++)
            if (used[a]) k->cs[j] = start, k->cl[j] = a, j++, got++;
        while (got < nanch[i]) k->cs[j] = start, k->cl[j] = span - 1, j++, got++;
        free(used);
        start += lens[i];
    }
}

static void free_case(attn_case *k) { free(k->cs), free(k->cl), free(k->sub); }

/* The row's blocks (see the header) */
static void build_case(attn_case *k, const kc_case *c)
{
    *k = (attn_case){.name = "dflash_attention", .nh = c->p[0], .nkv = c->p[1], .hd = c->p[2], .window = c->p[4],
                     .pad = c->p[5], .wide_check = c->p[6], .timing = c->p[7]};
    const int B = c->p[3], layout = c->p[8];
    if (layout == 0) {
        int *start = xmalloc(sizeof(int) * (size_t)(c->nseqs + 1));
        start[0] = 0;
        for (int i = 0; i < c->nseqs; i++) start[i + 1] = start[i] + c->seqs[i];
        k->T = start[c->nseqs], k->N = c->naux / 2, k->B = B;
        k->cs = xmalloc(sizeof(int32_t) * (size_t)(k->N + 1)), k->cl = xmalloc(sizeof(int32_t) * (size_t)(k->N + 1));
        for (int j = 0; j < k->N; j++) k->cs[j] = start[c->aux[2 * j]], k->cl[j] = c->aux[2 * j + 1];
        free(start);
    } else if (layout == 1) {
        make_blocks(k, c->seqs, c->aux, c->nseqs, B);
    } else if (layout == 2) {
        const int N = c->p[9], T = c->seqs[0];
        k->N = N, k->B = B, k->T = T;
        k->cs = xmalloc((size_t)N * sizeof(int32_t)), k->cl = xmalloc((size_t)N * sizeof(int32_t));
        for (int j = 0; j < N; j++) {
            k->cs[j] = rnd_int(T);
            k->cl[j] = j % 7 == 3 ? 0 : rnd_int(T - k->cs[j] + 1);
        }
    } else { /* the drafter: N anchors sorted in [0, T - B), one sequence; the CPU compares the first 4, 4 in the
              * middle and the last 12 blocks (the context rows past the last anchors are seen by those only) */
        const int T = c->seqs[0], N = c->p[9];
        k->N = N, k->B = B, k->T = T;
        k->cs = xmalloc(N * sizeof(int32_t)), k->cl = xmalloc(N * sizeof(int32_t));
        char *used = xcalloc(T, 1);
        for (int n = 0; n < N; n++) {
            int a;
            do a = rnd_int(T - B); while (used[a]);
            used[a] = 1;
        }
        for (int a = 0, j = 0; a < T - B; a++)
            if (used[a]) k->cs[j] = 0, k->cl[j] = a, j++;
        free(used);
        k->nsub = 20, k->sub = xmalloc(20 * sizeof(int));
        for (int i = 0; i < 4; i++) k->sub[i] = i, k->sub[4 + i] = N / 2 - 2 + i;
        for (int i = 0; i < 12; i++) k->sub[8 + i] = N - 12 + i;
    }
}

/* ---- CPU ---- */

typedef struct att_data {
    attn_case k;
    dflash_attn_shape s;
    int NB;
    float *q, *kc, *vc, *kb, *vb, *dout;
} att_data;

static float *rand_vec(size_t n)
{
    float *x = xmalloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) x[i] = (float)rnd_uniform();
    return x;
}

static void data_init(att_data *d, const kc_case *c)
{
    memset(d, 0, sizeof *d);
    build_case(&d->k, c);
    const attn_case *k = &d->k;
    d->s = (dflash_attn_shape){.nblocks = k->N, .block_size = k->B, .nh = k->nh, .nkv = k->nkv, .hd = k->hd,
                               .window = k->window};
    d->s.scale = 1.0f / sqrtf((float)k->hd);
    d->NB = k->N * k->B;
    size_t qn = (size_t)d->NB * k->nh * k->hd, cn = (size_t)k->T * k->nkv * k->hd, bn = (size_t)d->NB * k->nkv * k->hd;
    d->q = rand_vec(qn);
    d->kc = rand_vec(cn);
    d->vc = rand_vec(cn);
    d->kb = rand_vec(bn);
    d->vb = rand_vec(bn);
    d->dout = rand_vec(qn);
    /* sharper scores than uniform [-1,1) so the softmax is not nearly flat */
    for (size_t i = 0; i < qn; i++) d->q[i] *= 2.0f;
}

static void data_free(att_data *d)
{
    free(d->q); free(d->kc); free(d->vc); free(d->kb); free(d->vb); free(d->dout);
    free_case(&d->k);
}

/* Dense reference in double: mask [NB, T+NB] (block j's query slot i at position cl_j + i sees context row r of
 * [cs_j, cs_j + cl_j) at position r - cs_j and its block's rows at cl_j + b; with a window W also |q - k| < W),
 * -inf fill, softmax, weighted sum. */
static void naive_forward(const att_data *d, double *out, double *lse)
{
    const attn_case *k = &d->k;
    const int B = k->B, nh = k->nh, nkv = k->nkv, hd = k->hd, T = k->T, NB = d->NB;
    const int K = T + NB, g = nh / nkv, W = k->window;
    double *sc = xmalloc(sizeof(double) * (size_t)(K ? K : 1));
    for (int qi = 0; qi < NB; qi++) {
        int qb = qi / B, cs = k->cs[qb], cl = k->cl[qb], qpos = cl + qi % B;
        for (int h = 0; h < nh; h++) {
            int kh = h / g;
            double mx = -INFINITY;
            for (int kk = 0; kk < K; kk++) {
                int visible, kpos;
                const float *kr;
                if (kk < T) {
                    visible = kk >= cs && kk < cs + cl;
                    kr = d->kc + ((size_t)kk * nkv + kh) * hd;
                    kpos = kk - cs;
                } else {
                    visible = (kk - T) / B == qb;
                    kr = d->kb + ((size_t)(kk - T) * nkv + kh) * hd;
                    kpos = cl + (kk - T) % B;
                }
                if (W > 0 && abs(qpos - kpos) >= W) visible = 0;
                double dd = 0;
                for (int e = 0; e < hd; e++) dd += (double)d->q[((size_t)qi * nh + h) * hd + e] * kr[e];
                sc[kk] = visible ? dd * d->s.scale : -INFINITY;
                if (sc[kk] > mx) mx = sc[kk];
            }
            double sum = 0;
            for (int kk = 0; kk < K; kk++) sum += exp(sc[kk] - mx);
            double *o = out + ((size_t)qi * nh + h) * hd;
            for (int e = 0; e < hd; e++) o[e] = 0;
            for (int kk = 0; kk < K; kk++) {
                double p = exp(sc[kk] - mx) / sum;
                const float *vr = kk < T ? d->vc + ((size_t)kk * nkv + kh) * hd
                                         : d->vb + ((size_t)(kk - T) * nkv + kh) * hd;
                for (int e = 0; e < hd; e++) o[e] += p * vr[e];
            }
            lse[(size_t)qi * nh + h] = mx + log(sum);
        }
    }
    free(sc);
}

static void forward(const att_data *d, float *out, float *lse)
{
    dflash_attention_forward_cpu(out, lse, d->q, d->kc, d->vc, d->kb, d->vb, d->k.cs, d->k.cl, &d->s);
}

static void dflash_forward_cpu_check(const kc_case *c)
{
    att_data d;
    data_init(&d, c);
    size_t qn = (size_t)d.NB * d.k.nh * d.k.hd, ln = (size_t)d.NB * d.k.nh;
    float *out = xmalloc(sizeof(float) * qn), *lse = xmalloc(sizeof(float) * ln);
    double *rout = xmalloc(sizeof(double) * qn), *rlse = xmalloc(sizeof(double) * ln);
    forward(&d, out, lse);
    naive_forward(&d, rout, rlse);
    double emax = 0, lmax = 0;
    for (size_t i = 0; i < qn; i++) emax = fmax(emax, fabs(out[i] - rout[i]));
    for (size_t i = 0; i < ln; i++) lmax = fmax(lmax, fabs(lse[i] - rlse[i]));
    EXPECT(emax <= 2e-6);
    EXPECT(lmax <= 2e-6);
    if (test_failed_here) fprintf(stderr, "  max|out err| %g, max|lse err| %g\n", emax, lmax);
    free(out); free(lse); free(rout); free(rlse);
    data_free(&d);
}

/* A window that cuts nothing gives the bits of no window (the same keys in the same order); a block's own rows are
 * seen in both directions: slot 0's output of block 1 depends on its last slot's value, blocks 0 and 2 do not. */
static void dflash_props_cpu_check(const kc_case *c)
{
    att_data d;
    data_init(&d, c);
    const int nh = d.k.nh, hd = d.k.hd, B = d.k.B;
    size_t qn = (size_t)d.NB * nh * hd, ln = (size_t)d.NB * nh;
    float *o1 = xmalloc(sizeof(float) * qn), *o2 = xmalloc(sizeof(float) * qn);
    float *l1 = xmalloc(sizeof(float) * ln), *l2 = xmalloc(sizeof(float) * ln);
    int maxcl = 0;
    for (int j = 0; j < d.k.N; j++) maxcl = d.k.cl[j] > maxcl ? d.k.cl[j] : maxcl;
    d.s.window = 0;
    forward(&d, o1, l1);
    d.s.window = maxcl + B; /* longer than the longest context plus the block */
    forward(&d, o2, l2);
    EXPECT(memcmp(o1, o2, sizeof(float) * qn) == 0);
    EXPECT(memcmp(l1, l2, sizeof(float) * ln) == 0);
    d.s.window = 0;
    REQUIRE(d.k.N >= 3);
    size_t row = 1 * (size_t)B + (B - 1); /* block 1, last slot */
    for (int e = 0; e < d.k.nkv * hd; e++) d.vb[row * d.k.nkv * hd + e] += 1.0f;
    forward(&d, o2, l2);
    size_t w = (size_t)nh * hd;
    EXPECT(fabsf(o1[B * w] - o2[B * w]) > 1e-3);                       /* block 1 slot 0 changed */
    EXPECT(o1[0] == o2[0] && o1[2 * B * w] == o2[2 * B * w]);          /* blocks 0 and 2 untouched */
    free(o1); free(o2); free(l1); free(l2);
    data_free(&d);
}

static double loss_of(const att_data *d, float *out, float *lse)
{
    forward(d, out, lse);
    size_t qn = (size_t)d->NB * d->k.nh * d->k.hd;
    double L = 0;
    for (size_t i = 0; i < qn; i++) L += (double)d->dout[i] * out[i];
    return L;
}

/* Compare an analytic gradient with central differences of L over every element of x. */
static int check_grad(const char *name, att_data *d, float *x, size_t n, const float *g, float *out, float *lse)
{
    double *fd = xmalloc(sizeof(double) * (n ? n : 1));
    const float step = 1e-3f;
    for (size_t i = 0; i < n; i++) {
        float x0 = x[i];
        x[i] = x0 + step;
        float xp = x[i];
        double lp = loss_of(d, out, lse);
        x[i] = x0 - step;
        float xm = x[i];
        double lm = loss_of(d, out, lse);
        x[i] = x0;
        fd[i] = (lp - lm) / ((double)xp - (double)xm);
    }
    double num = 0, den = 0, fmaxabs = 0;
    for (size_t i = 0; i < n; i++) {
        num += (g[i] - fd[i]) * (g[i] - fd[i]);
        den += fd[i] * fd[i];
        fmaxabs = fmax(fmaxabs, fabs(fd[i]));
    }
    int bad = 0;
    if (!(sqrt(num) <= 1e-2 * sqrt(den)) || den == 0) {
        fprintf(stderr, "  %s: ||g-fd|| %g vs ||fd|| %g\n", name, sqrt(num), sqrt(den));
        bad = 1;
    }
    for (size_t i = 0; i < n; i++)
        if (fabs(g[i] - fd[i]) > 2e-3 * fmaxabs + 2e-2 * fabs(fd[i])) {
            if (!bad) fprintf(stderr, "  %s[%zu]: g %g fd %g\n", name, i, g[i], fd[i]);
            bad = 1;
        }
    free(fd);
    return bad;
}

static void dflash_backward_cpu_check(const kc_case *c)
{
    att_data d;
    data_init(&d, c);
    const int hd = d.k.hd, nh = d.k.nh, nkv = d.k.nkv, T = d.k.T;
    size_t qn = (size_t)d.NB * nh * hd, cn = (size_t)T * nkv * hd, bn = (size_t)d.NB * nkv * hd;
    float *out = xmalloc(sizeof(float) * qn), *lse = xmalloc(sizeof(float) * d.NB * nh);
    float *dq = xmalloc(sizeof(float) * qn);
    float *dkc = xmalloc(sizeof(float) * (cn + 1)), *dvc = xmalloc(sizeof(float) * (cn + 1));
    float *dkb = xmalloc(sizeof(float) * bn), *dvb = xmalloc(sizeof(float) * bn);
    /* dq must be overwritten; the k/v grads accumulate onto what is there (0.25 here, subtracted after) */
    for (size_t i = 0; i < qn; i++) dq[i] = 123.0f;
    for (size_t i = 0; i < cn; i++) dkc[i] = dvc[i] = 0.25f;
    for (size_t i = 0; i < bn; i++) dkb[i] = dvb[i] = 0.25f;
    forward(&d, out, lse);
    dflash_attention_backward_cpu(dq, dkc, dvc, dkb, dvb, d.dout, out, lse, d.q, d.kc, d.vc, d.kb, d.vb, d.k.cs,
                                  d.k.cl, &d.s);
    for (size_t i = 0; i < cn; i++) { dkc[i] -= 0.25f; dvc[i] -= 0.25f; }
    for (size_t i = 0; i < bn; i++) { dkb[i] -= 0.25f; dvb[i] -= 0.25f; }
    int bad = 0;
    bad |= check_grad("dq", &d, d.q, qn, dq, out, lse);
    bad |= check_grad("dkc", &d, d.kc, cn, dkc, out, lse);
    bad |= check_grad("dvc", &d, d.vc, cn, dvc, out, lse);
    bad |= check_grad("dkb", &d, d.kb, bn, dkb, out, lse);
    bad |= check_grad("dvb", &d, d.vb, bn, dvb, out, lse);
    if (bad) test_failed_here = 1;
    /* context rows no block sees (e.g. after the last anchor of their sequence): zero gradient */
    int unseen = 0;
    for (int r = 0; r < T; r++) {
        int seen = 0;
        for (int j = 0; j < d.k.N; j++) seen |= r >= d.k.cs[j] && r < d.k.cs[j] + d.k.cl[j];
        if (seen) continue;
        unseen++;
        for (int e = 0; e < nkv * hd; e++) {
            EXPECT(dkc[(size_t)r * nkv * hd + e] == 0.0f);
            EXPECT(dvc[(size_t)r * nkv * hd + e] == 0.0f);
        }
    }
    EXPECT(unseen > 0); /* the row's layout has such rows (its last one at least) */
    free(out); free(lse); free(dq); free(dkc); free(dvc); free(dkb); free(dvb);
    data_free(&d);
}

#ifdef DFLASH_CUDA
/* n floats of amplitude amp, each exactly a bf16 value */
static float *rnd_f(size_t n, double amp)
{
    float *f = xmalloc((n ? n : 1) * sizeof *f);
    for (size_t i = 0; i < n; i++) f[i] = bf16_to_f32(f32_to_bf16((float)(amp * rnd_uniform())));
    return f;
}

/* rows x cols of src (contiguous) into host bf16 rows of stride ld at column col0 */
static void put_bf16(uint16_t *dst, int ld, int col0, const float *src, int rows, int cols)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) dst[(size_t)r * ld + col0 + c] = f32_to_bf16(src[(size_t)r * cols + c]);
}

static void *dev_alloc(size_t bytes, int poison)
{
    void *d = NULL;
    CHECK_CUDA(cudaMalloc(&d, bytes ? bytes : 16));
    CHECK_CUDA(cudaMemset(d, poison ? 0xff : 0, bytes ? bytes : 16));
    return d;
}

/* Compare: got (bf16, stride ldg, column col0) on the rows where sel is non-zero (NULL: all) against ref (contiguous,
 * cols wide, rows indexed by the ref row map rmap: ref row of got row r is rmap[r], -1 = not compared). */
typedef struct cmp {
    double max_err, max_ref;
    int nan;
} cmp;
static void cmp_rows(cmp *c, const uint16_t *got, int ldg, int col0, const float *ref, int cols, const int *rmap,
                     int rows)
{
    for (int r = 0; r < rows; r++) {
        int rr = rmap ? rmap[r] : r;
        if (rr < 0) continue;
        for (int i = 0; i < cols; i++) {
            double g = bf16_to_f32(got[(size_t)r * ldg + col0 + i]), w = ref[(size_t)rr * cols + i];
            if (isnan(g)) c->nan = 1;
            c->max_err = fmax(c->max_err, fabs(g - w));
            c->max_ref = fmax(c->max_ref, fabs(w));
        }
    }
}

static void report(const char *cname, const char *tensor, cmp c, double tol, int absolute)
{
    double rel = absolute ? c.max_err : (c.max_ref > 0 ? c.max_err / c.max_ref : c.max_err);
    int ok = !c.nan && rel <= tol;
    printf("%s %s %s max_abs_err=%.3g max|ref|=%.3g %s=%.3g tol=%.3g%s\n", ok ? "ok" : "FAIL", cname, tensor, c.max_err,
           c.max_ref, absolute ? "abs" : "rel", rel, tol, !ok && c.nan ? " (NaN: element not written)" : "");
    fflush(stdout);
    if (!ok) failures++;
}

/* padding columns [col0, col0+n) of every row must still hold the poison 0xffff */
static void check_pad(const char *cname, const char *what, const uint16_t *h, int rows, int ld, int col0, int n)
{
    size_t bad = 0;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) bad += h[(size_t)r * ld + col0 + i] != 0xffff;
    printf("%s %s %s padding columns changed=%zu\n", bad ? "FAIL" : "ok", cname, what, bad);
    if (bad) failures++;
}

static void check_same(const char *cname, const char *what, const void *d, const void *h_prev, size_t bytes)
{
    void *h = dev_get(d, bytes);
    int same = memcmp(h, h_prev, bytes) == 0;
    printf("%s %s determinism %s bitwise_identical=%s\n", same ? "ok" : "FAIL", cname, what, same ? "yes" : "no");
    if (!same) failures++;
    free(h);
}

/* The CPU reference one block at a time on up to 16 threads (block i on thread i % nthreads); each thread sums its
 * dkc/dvc in its own buffer, added up at the end. */
typedef struct cpu_job {
    dflash_attn_shape s; /* nblocks = 1 per call */
    int ns, T, nthreads;
    const float *q, *dout, *out, *lse, *kc, *vc, *kb, *vb;
    const int32_t *cs, *cl;
    float *rout, *rlse, *rdq, *rdkb, *rdvb;
} cpu_job;
typedef struct cpu_thread {
    cpu_job *job;
    int t;
    float *dkc, *dvc;
    pthread_t tid;
} cpu_thread;

static void *cpu_thread_main(void *arg)
{
    cpu_thread *th = arg;
    const cpu_job *j = th->job;
    dflash_attn_shape s1 = j->s;
    s1.nblocks = 1;
    const int B = s1.block_size;
    const size_t qd = (size_t)s1.nh * s1.hd, kd = (size_t)s1.nkv * s1.hd, nh = (size_t)s1.nh;
    for (int i = th->t; i < j->ns; i += j->nthreads) {
        const size_t r = (size_t)i * B;
        dflash_attention_forward_cpu(j->rout + r * qd, j->rlse + r * nh, j->q + r * qd, j->kc, j->vc, j->kb + r * kd,
                                     j->vb + r * kd, j->cs + i, j->cl + i, &s1);
        dflash_attention_backward_cpu(j->rdq + r * qd, th->dkc, th->dvc, j->rdkb + r * kd, j->rdvb + r * kd,
                                      j->dout + r * qd, j->out + r * qd, j->lse + r * nh, j->q + r * qd, j->kc, j->vc,
                                      j->kb + r * kd, j->vb + r * kd, j->cs + i, j->cl + i, &s1);
    }
    return NULL;
}

static void cpu_reference(cpu_job *job, float *rdkc, float *rdvc)
{
    const size_t n = (size_t)job->T * job->s.nkv * job->s.hd;
    job->nthreads = job->ns < 16 ? (job->ns > 0 ? job->ns : 1) : 16;
    cpu_thread th[16];
    for (int t = 0; t < job->nthreads; t++) {
        th[t] = (cpu_thread){.job = job, .t = t, .dkc = xcalloc(n + 1, 4), .dvc = xcalloc(n + 1, 4)};
        if (pthread_create(&th[t].tid, NULL, cpu_thread_main, &th[t]) != 0) {
            perror("pthread_create");
            exit(1);
        }
    }
    for (int t = 0; t < job->nthreads; t++) {
        pthread_join(th[t].tid, NULL);
        for (size_t i = 0; i < n; i++) rdkc[i] += th[t].dkc[i], rdvc[i] += th[t].dvc[i];
        free(th[t].dkc), free(th[t].dvc);
    }
}


/* rows x cols of a strided device tensor against the same rows of a host copy taken earlier */
static void check_rows_same(const char *cname, const char *what, const uint16_t *d, const uint16_t *h_prev, int rows,
                            int ld, int cols)
{
    uint16_t *h = dev_get(d, (size_t)rows * ld * 2);
    size_t diff = 0;
    for (int r = 0; r < rows; r++) diff += memcmp(h + (size_t)r * ld, h_prev + (size_t)r * ld, (size_t)cols * 2) != 0;
    printf("%s %s wide_window_as_none %s rows_differing=%zu\n", diff ? "FAIL" : "ok", cname, what, diff);
    if (diff) failures++;
    free(h);
}

/* rows of the device dq (NB x qd of ldo) and dkc|dvc (T x 2 kd of ldkv) whose own columns differ from the host copies
 * of an earlier run (the padding is not compared: the runs poison it differently) */
static size_t dq_dkvc_rows_differing(const uint16_t *d_dq, const uint16_t *gdq, int NB, int ldo, int qd,
                                     const uint16_t *d_dkvc, const uint16_t *gdkvc, int T, int ldkv, int kd)
{
    uint16_t *a2 = dev_get(d_dq, (size_t)NB * ldo * 2), *b2 = dev_get(d_dkvc, (size_t)T * ldkv * 2);
    size_t diff = 0;
    for (int r = 0; r < NB; r++) diff += memcmp(a2 + (size_t)r * ldo, gdq + (size_t)r * ldo, (size_t)qd * 2) != 0;
    for (int r = 0; r < T; r++) diff += memcmp(b2 + (size_t)r * ldkv, gdkvc + (size_t)r * ldkv, (size_t)2 * kd * 2) != 0;
    free(a2), free(b2);
    return diff;
}

/* Before a second backward that must give the first one's bits: the dS workspace (ws_bytes) all 0xff (a tile dq reads
 * that dk/dv did not write gives NaN) and the gradients 0x55 (a row not written shows): dq (NB x ldo), dkc|dvc packed
 * (T x ldkv), dkb and dvb (NB x kd) */
/* One timed call's buffers: the forward writes out and lse; the backward reads them with dout and writes gr, delta. */
typedef struct attn_run {
    const dflash_attn_cuda_in *in;
    const dflash_attn_shape *s;
    uint16_t *out;
    int ldo;
    float *lse;
    const dflash_attn_cuda_grads *gr;
    float *delta;
    const uint16_t *dout;
    int lddo;
    cudaStream_t stream;
} attn_run;

/* ms a call over 20 back-to-back calls of the forward (backward 0) or the backward (1) with the dS workspace ws of
 * ws_bytes (NULL: dq recomputes), the variants as forced now */
static double attn_ms(const attn_run *r, int backward, void *ws, size_t ws_bytes)
{
    enum { kIters = 20 };
    cudaEvent_t e0, e1;
    float ms = 0;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    CHECK_CUDA(cudaEventRecord(e0, r->stream));
    for (int i = 0; i < kIters; i++) {
        if (backward)
            dflash_attention_backward_cuda(r->gr, r->delta, ws, ws_bytes, r->dout, r->lddo, r->out, r->ldo, r->lse,
                                           r->in, r->s, r->stream);
        else
            dflash_attention_forward_cuda(r->out, r->ldo, r->lse, r->in, r->s, r->stream);
    }
    CHECK_CUDA(cudaEventRecord(e1, r->stream));
    CHECK_CUDA(cudaEventSynchronize(e1));
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    return ms / kIters;
}

/* Backward variant v of the list the rows run: v < ndkv the dk/dv CTAs of row v of dflash_attention_dkv_variants
 * forced, then the dq rows after the default ("one") one by one; v = -1: back to the environment's. what (when not
 * NULL) names it as the switch does, e.g. "the wg2_tma dk/dv CTAs (DFLASH_ATTENTION_DKV=wg2_tma)". */
static void force_backward_variant(int v, int ndkv, char *what, size_t what_size)
{
    dflash_attention_dkv_force(v >= 0 && v < ndkv ? v : -1);
    dflash_attention_dq_force(v >= ndkv ? v - ndkv + 1 : -1);
    if (!what) return;
    if (v < ndkv)
        snprintf(what, what_size, "the %s dk/dv CTAs (DFLASH_ATTENTION_DKV=%s)", dflash_attention_dkv_variant(v),
                 dflash_attention_dkv_variant(v));
    else
        snprintf(what, what_size, "the %s dq CTAs (DFLASH_ATTENTION_DQ_WS=%s)", dflash_attention_dq_variant(v - ndkv + 1),
                 dflash_attention_dq_variant(v - ndkv + 1));
}

static void poison_backward_outputs(const dflash_attn_cuda_grads *gr, void *d_ws, size_t ws_bytes, int NB, int T,
                                    int ldo, int ldkv, int kd)
{
    CHECK_CUDA(cudaMemset(d_ws, 0xff, ws_bytes));
    CHECK_CUDA(cudaMemset(gr->dq, 0x55, (size_t)NB * ldo * 2));
    CHECK_CUDA(cudaMemset(gr->dkc, 0x55, (size_t)T * ldkv * 2));
    CHECK_CUDA(cudaMemset(gr->dkb, 0x55, (size_t)NB * kd * 2));
    CHECK_CUDA(cudaMemset(gr->dvb, 0x55, (size_t)NB * kd * 2));
}

static void run_case(const attn_case *k)
{
    const int N = k->N, B = k->B, nh = k->nh, nkv = k->nkv, hd = k->hd, T = k->T, NB = N * B;
    const int qd = nh * hd, kd = nkv * hd, pad = k->pad;
    const dflash_attn_shape s = {.nblocks = N, .block_size = B, .nh = nh, .nkv = nkv, .hd = hd,
                                 .scale = 1.0f / sqrtf((float)hd), .window = k->window};
    /* fp32 inputs (bf16 values) */
    float *q = rnd_f((size_t)NB * qd, 2.0), *kc = rnd_f((size_t)T * kd, 2.0), *vc = rnd_f((size_t)T * kd, 1.0);
    float *kb = rnd_f((size_t)NB * kd, 2.0), *vb = rnd_f((size_t)NB * kd, 1.0), *dout = rnd_f((size_t)NB * qd, 1.0);

    /* device layouts: q (ldq), kc|vc packed in one buffer, kb and vb apart, out and dq padded, dkc|dvc packed */
    const int ldq = qd + pad, ldkv = 2 * kd + pad, ldb = kd + pad, ldo = qd + pad, lddo = qd;
    uint16_t *h = xcalloc((size_t)(NB > T ? NB : T) * (ldkv > ldq ? ldkv : ldq), 2);
    put_bf16(h, ldq, 0, q, NB, qd);
    uint16_t *d_q = dev_upload(h, (size_t)NB * ldq * 2);
    put_bf16(h, ldkv, 0, kc, T, kd), put_bf16(h, ldkv, kd, vc, T, kd);
    uint16_t *d_kvc = dev_upload(h, (size_t)T * ldkv * 2);
    put_bf16(h, ldb, 0, kb, NB, kd);
    uint16_t *d_kb = dev_upload(h, (size_t)NB * ldb * 2);
    put_bf16(h, ldb, 0, vb, NB, kd);
    uint16_t *d_vb = dev_upload(h, (size_t)NB * ldb * 2);
    put_bf16(h, lddo, 0, dout, NB, qd);
    uint16_t *d_dout = dev_upload(h, (size_t)NB * lddo * 2);
    free(h);
    int32_t *d_cs = dev_upload(k->cs, sizeof(int32_t) * (size_t)N), *d_cl = dev_upload(k->cl, sizeof(int32_t) * (size_t)N);
    uint16_t *d_out = dev_alloc((size_t)NB * ldo * 2, 1);
    float *d_lse = dev_alloc((size_t)NB * nh * 4, 1), *d_delta = dev_alloc((size_t)NB * nh * 4, 1);
    uint16_t *d_dq = dev_alloc((size_t)NB * ldo * 2, 1), *d_dkvc = dev_alloc((size_t)T * ldkv * 2, 1);
    uint16_t *d_dkb = dev_alloc((size_t)NB * kd * 2, 1), *d_dvb = dev_alloc((size_t)NB * kd * 2, 1);
    /* the dS workspace (head_dim 128 on Hopper), poisoned: a tile dq reads that dk/dv did not write gives NaN */
    dflash_attn_shape s_nowin = s; /* window 0 needs the most: the wide_check runs take it too */
    s_nowin.window = 0;
    const size_t ws_bytes = dflash_attention_backward_workspace(&s_nowin, T);
    void *d_ws = ws_bytes ? dev_alloc(ws_bytes, 1) : NULL;

    const dflash_attn_cuda_in in = {.q = d_q, .ldq = ldq, .kc = d_kvc, .ldkc = ldkv, .vc = d_kvc + kd, .ldvc = ldkv,
                                    .kb = d_kb, .ldkb = ldb, .vb = d_vb, .ldvb = ldb, .ctx_start = d_cs,
                                    .ctx_len = d_cl, .T = T};
    const dflash_attn_cuda_grads gr = {.dq = d_dq, .lddq = ldo, .dkc = d_dkvc, .lddkc = ldkv, .dvc = d_dkvc + kd,
                                       .lddvc = ldkv, .dkb = d_dkb, .lddkb = kd, .dvb = d_dvb, .lddvb = kd};
    dflash_attention_forward_cuda(d_out, ldo, d_lse, &in, &s, stream);
    dflash_attention_backward_cuda(&gr, d_delta, d_ws, ws_bytes, d_dout, lddo, d_out, ldo, d_lse, &in, &s, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    uint16_t *out = dev_get(d_out, (size_t)NB * ldo * 2);
    float *lse = dev_get(d_lse, (size_t)NB * nh * 4);
    uint16_t *gdq = dev_get(d_dq, (size_t)NB * ldo * 2), *gdkvc = dev_get(d_dkvc, (size_t)T * ldkv * 2);
    uint16_t *gdkb = dev_get(d_dkb, (size_t)NB * kd * 2), *gdvb = dev_get(d_dvb, (size_t)NB * kd * 2);
    float *gdelta = dev_get(d_delta, (size_t)NB * nh * 4);

    /* CPU sub-problem: the compared blocks */
    const int ns = k->sub ? k->nsub : N, nsb = ns * B;
    int *blk = xmalloc(sizeof(int) * (size_t)ns);
    for (int i = 0; i < ns; i++) blk[i] = k->sub ? k->sub[i] : i;
    float *sq = xmalloc((size_t)nsb * qd * 4), *sdo = xmalloc((size_t)nsb * qd * 4), *sout = xmalloc((size_t)nsb * qd * 4);
    float *skb = xmalloc((size_t)nsb * kd * 4), *svb = xmalloc((size_t)nsb * kd * 4), *slse = xmalloc((size_t)nsb * nh * 4);
    int32_t *scs = xmalloc(sizeof(int32_t) * (size_t)ns), *scl = xmalloc(sizeof(int32_t) * (size_t)ns);
    int *qmap = xmalloc(sizeof(int) * (size_t)NB), *cmap = xmalloc(sizeof(int) * (size_t)(T ? T : 1));
    for (int r = 0; r < NB; r++) qmap[r] = -1;
    for (int i = 0; i < ns; i++) {
        const int j = blk[i];
        scs[i] = k->cs[j], scl[i] = k->cl[j];
        for (int b = 0; b < B; b++) {
            const size_t src = (size_t)j * B + b, dst = (size_t)i * B + b;
            qmap[src] = (int)dst;
            memcpy(sq + dst * qd, q + src * qd, (size_t)qd * 4);
            memcpy(sdo + dst * qd, dout + src * qd, (size_t)qd * 4);
            memcpy(skb + dst * kd, kb + src * kd, (size_t)kd * 4);
            memcpy(svb + dst * kd, vb + src * kd, (size_t)kd * 4);
            memcpy(slse + dst * nh, lse + src * nh, (size_t)nh * 4);
            for (int c = 0; c < qd; c++) sout[dst * qd + c] = bf16_to_f32(out[src * ldo + c]);
        }
    }
    /* context rows compared: those no block outside the subset sees */
    char *inset = xcalloc((size_t)N, 1);
    for (int i = 0; i < ns; i++) inset[blk[i]] = 1;
    for (int r = 0; r < T; r++) cmap[r] = r;
    for (int j = 0; j < N; j++)
        if (!inset[j])
            for (int r = k->cs[j]; r < k->cs[j] + k->cl[j]; r++) cmap[r] = -1;
    int ncmp = 0;
    for (int r = 0; r < T; r++) ncmp += cmap[r] >= 0;

    float *rout = xmalloc((size_t)nsb * qd * 4), *rlse = xmalloc((size_t)nsb * nh * 4);
    float *rdq = xmalloc((size_t)nsb * qd * 4), *rdkc = xcalloc((size_t)T * kd + 1, 4), *rdvc = xcalloc((size_t)T * kd + 1, 4);
    float *rdkb = xcalloc((size_t)nsb * kd, 4), *rdvb = xcalloc((size_t)nsb * kd, 4);
    {
        cpu_job job = {.s = s, .ns = ns, .T = T, .q = sq, .dout = sdo, .out = sout, .lse = slse, .kc = kc, .vc = vc,
                       .kb = skb, .vb = svb, .cs = scs, .cl = scl, .rout = rout, .rlse = rlse, .rdq = rdq,
                       .rdkb = rdkb, .rdvb = rdvb};
        cpu_reference(&job, rdkc, rdvc);
    }

    char cname[200];
    snprintf(cname, sizeof cname, "%s[N=%d B=%d nh=%d nkv=%d hd=%d T=%d W=%d, %d blocks / %d ctx rows compared]",
             k->name, N, B, nh, nkv, hd, T, k->window, ns, ncmp);
    cmp c = {0};
    cmp_rows(&c, out, ldo, 0, rout, qd, qmap, NB);
    report(cname, "out", c, TOL_OUT, 0);
    c = (cmp){0};
    for (int r = 0; r < NB; r++)
        if (qmap[r] >= 0)
            for (int h2 = 0; h2 < nh; h2++) {
                double g = lse[(size_t)r * nh + h2], w = rlse[(size_t)qmap[r] * nh + h2];
                if (isnan(g)) c.nan = 1;
                c.max_err = fmax(c.max_err, fabs(g - w)), c.max_ref = fmax(c.max_ref, fabs(w));
            }
    report(cname, "lse", c, TOL_LSE, 1);
    c = (cmp){0}, cmp_rows(&c, gdq, ldo, 0, rdq, qd, qmap, NB), report(cname, "dq", c, TOL_GRAD, 0);
    c = (cmp){0}, cmp_rows(&c, gdkvc, ldkv, 0, rdkc, kd, cmap, T), report(cname, "dkc", c, TOL_GRAD, 0);
    c = (cmp){0}, cmp_rows(&c, gdkvc, ldkv, kd, rdvc, kd, cmap, T), report(cname, "dvc", c, TOL_GRAD, 0);
    c = (cmp){0}, cmp_rows(&c, gdkb, kd, 0, rdkb, kd, qmap, NB), report(cname, "dkb", c, TOL_GRAD, 0);
    c = (cmp){0}, cmp_rows(&c, gdvb, kd, 0, rdvb, kd, qmap, NB), report(cname, "dvb", c, TOL_GRAD, 0);
    if (pad) {
        check_pad(cname, "out", out, NB, ldo, qd, pad);
        check_pad(cname, "dq", gdq, NB, ldo, qd, pad);
        check_pad(cname, "dkc|dvc", gdkvc, T, ldkv, 2 * kd, pad);
    }

    /* a second run must give the same bits, and so must each other forward row (DFLASH_ATTENTION_FWD=<name>; head_dim
     * 128 on wgmma, elsewhere the same kernels again) */
    for (int v = -1; v < dflash_attention_fwd_variants(); v++) { /* v -1: the default, unforced */
        char what_out[64], what_lse[64];
        snprintf(what_out, sizeof what_out, v >= 0 ? "out (forward %s)" : "out", dflash_attention_fwd_variant(v));
        snprintf(what_lse, sizeof what_lse, v >= 0 ? "lse (forward %s)" : "lse", dflash_attention_fwd_variant(v));
        dflash_attention_fwd_force(v);
        dflash_attention_forward_cuda(d_out, ldo, d_lse, &in, &s, stream);
        dflash_attention_fwd_force(-1);
        check_same(cname, what_out, d_out, out, (size_t)NB * ldo * 2);
        check_same(cname, what_lse, d_lse, lse, (size_t)NB * nh * 4);
    }
    dflash_attention_forward_cuda(d_out, ldo, d_lse, &in, &s, stream); /* (the default's, for the backward below) */
    CHECK_CUDA(cudaMemset(d_dq, 0x55, (size_t)NB * ldo * 2));
    CHECK_CUDA(cudaMemset(d_dkvc, 0x55, (size_t)T * ldkv * 2));
    CHECK_CUDA(cudaMemset(d_dkb, 0x55, (size_t)NB * kd * 2));
    CHECK_CUDA(cudaMemset(d_dvb, 0x55, (size_t)NB * kd * 2));
    dflash_attention_backward_cuda(&gr, d_delta, d_ws, ws_bytes, d_dout, lddo, d_out, ldo, d_lse, &in, &s, stream);
    /* the padding was poisoned with 0xff the first time and 0x55 now: compare the tensors' own columns only */
    {
        const size_t diff = dq_dkvc_rows_differing(d_dq, gdq, NB, ldo, qd, d_dkvc, gdkvc, T, ldkv, kd);
        printf("%s %s determinism dq,dkc,dvc rows_differing=%zu\n", diff ? "FAIL" : "ok", cname, diff);
        if (diff) failures++;
    }
    check_same(cname, "dkb", d_dkb, gdkb, (size_t)NB * kd * 2);
    check_same(cname, "dvb", d_dvb, gdvb, (size_t)NB * kd * 2);
    check_same(cname, "delta", d_delta, gdelta, (size_t)NB * nh * 4);

    if (d_ws) { /* the workspace laid out for the longest context (.max_ctx) instead of T, the rest poisoned: the same bits */
        dflash_attn_shape st = s;
        for (int j = 0; j < N; j++) st.max_ctx = k->cl[j] > st.max_ctx ? k->cl[j] : st.max_ctx;
        const size_t tight = dflash_attention_backward_workspace(&st, T);
        poison_backward_outputs(&gr, d_ws, ws_bytes, NB, T, ldo, ldkv, kd);
        dflash_attention_backward_cuda(&gr, d_delta, d_ws, tight, d_dout, lddo, d_out, ldo, d_lse, &in, &st, stream);
        const size_t diff = dq_dkvc_rows_differing(d_dq, gdq, NB, ldo, qd, d_dkvc, gdkvc, T, ldkv, kd);
        printf("%s %s max_ctx %d: workspace %zu of %zu bytes, dq,dkc,dvc rows_differing=%zu\n",
               diff || tight > ws_bytes ? "FAIL" : "ok", cname, st.max_ctx, tight, ws_bytes, diff);
        if (diff || tight > ws_bytes) failures++;
        check_same(cname, "dkb (max_ctx)", d_dkb, gdkb, (size_t)NB * kd * 2);
        check_same(cname, "dvb (max_ctx)", d_dvb, gdvb, (size_t)NB * kd * 2);
    }

    const int ndkv = dflash_attention_dkv_variants(), nvar = ndkv + dflash_attention_dq_variants() - 1;
    for (int v = 0; d_ws && v < nvar; v++) { /* each of the dk/dv CTAs forced: the one-warpgroup ones, those of a
                 * producer and two consumer warpgroups with each schedule (DFLASH_ATTENTION_DKV=<name>); then each dq
                 * row but the default (DFLASH_ATTENTION_DQ_WS=<name>): the first run's bits (each wg2 consumer takes a
                 * one-warpgroup 64-key tile's steps in its order, each dq block its own tiles in its own order; the
                 * dS tiles the same) */
        char what[96];
        force_backward_variant(v, ndkv, what, sizeof what);
        poison_backward_outputs(&gr, d_ws, ws_bytes, NB, T, ldo, ldkv, kd);
        dflash_attention_backward_cuda(&gr, d_delta, d_ws, ws_bytes, d_dout, lddo, d_out, ldo, d_lse, &in, &s, stream);
        force_backward_variant(-1, ndkv, NULL, 0);
        const size_t diff = dq_dkvc_rows_differing(d_dq, gdq, NB, ldo, qd, d_dkvc, gdkvc, T, ldkv, kd);
        printf("%s %s %s: dq,dkc,dvc rows_differing=%zu\n", diff ? "FAIL" : "ok", cname, what, diff);
        if (diff) failures++;
        char dkb_what[128], dvb_what[128];
        snprintf(dkb_what, sizeof dkb_what, "dkb (%s)", what);
        snprintf(dvb_what, sizeof dvb_what, "dvb (%s)", what);
        check_same(cname, dkb_what, d_dkb, gdkb, (size_t)NB * kd * 2);
        check_same(cname, dvb_what, d_dvb, gdvb, (size_t)NB * kd * 2);
    }

    if (d_ws) { /* the recompute path (no workspace), where the kernels took one: dq against the same reference */
        CHECK_CUDA(cudaMemset(d_dq, 0xff, (size_t)NB * ldo * 2));
        dflash_attention_backward_cuda(&gr, d_delta, NULL, 0, d_dout, lddo, d_out, ldo, d_lse, &in, &s, stream);
        uint16_t *rq = dev_get(d_dq, (size_t)NB * ldo * 2);
        c = (cmp){0}, cmp_rows(&c, rq, ldo, 0, rdq, qd, qmap, NB), report(cname, "dq (recompute, no workspace)", c,
                                                                           TOL_GRAD, 0);
        free(rq);
    }

    if (k->wide_check) { /* a window no key is beyond: every result as without one, bit for bit */
        dflash_attn_shape s0 = s, sw = s;
        s0.window = 0, sw.window = T + B + 1;
        dflash_attention_forward_cuda(d_out, ldo, d_lse, &in, &s0, stream);
        dflash_attention_backward_cuda(&gr, d_delta, d_ws, ws_bytes, d_dout, lddo, d_out, ldo, d_lse, &in, &s0, stream);
        CHECK_CUDA(cudaStreamSynchronize(stream));
        uint16_t *o0 = dev_get(d_out, (size_t)NB * ldo * 2), *dq0 = dev_get(d_dq, (size_t)NB * ldo * 2);
        uint16_t *dkvc0 = dev_get(d_dkvc, (size_t)T * ldkv * 2), *dkb0 = dev_get(d_dkb, (size_t)NB * kd * 2);
        uint16_t *dvb0 = dev_get(d_dvb, (size_t)NB * kd * 2);
        float *l0 = dev_get(d_lse, (size_t)NB * nh * 4);
        dflash_attention_forward_cuda(d_out, ldo, d_lse, &in, &sw, stream);
        dflash_attention_backward_cuda(&gr, d_delta, d_ws, ws_bytes, d_dout, lddo, d_out, ldo, d_lse, &in, &sw, stream);
        CHECK_CUDA(cudaStreamSynchronize(stream));
        check_rows_same(cname, "out", d_out, o0, NB, ldo, qd);
        check_rows_same(cname, "dq", d_dq, dq0, NB, ldo, qd);
        check_rows_same(cname, "dkc|dvc", d_dkvc, dkvc0, T, ldkv, 2 * kd);
        check_rows_same(cname, "dkb", d_dkb, dkb0, NB, kd, kd);
        check_rows_same(cname, "dvb", d_dvb, dvb0, NB, kd, kd);
        float *l2 = dev_get(d_lse, (size_t)NB * nh * 4);
        const int same = memcmp(l2, l0, (size_t)NB * nh * 4) == 0;
        printf("%s %s wide_window_as_none lse bitwise_identical=%s\n", same ? "ok" : "FAIL", cname, same ? "yes" : "no");
        if (!same) failures++;
        free(l2), free(l0), free(o0), free(dq0), free(dkvc0), free(dkb0), free(dvb0);
    }

    if (k->timing && kc_reporting()) {
        double keys = 0;
        for (int j = 0; j < N; j++)
            for (int i = 0; i < B; i++) { /* the keys each slot sees (dflash_attn_window) */
                int c0, b0, b1;
                dflash_attn_window(k->cl[j], B, i, k->window, &c0, &b0, &b1);
                keys += (double)(k->cl[j] - c0 + b1 - b0) / B;
            }
        const double fwd_flop = 4.0 * nh * hd * B * keys; /* only the unmasked pairs, as the torch anchor counts */
        const attn_run run = {&in, &s, d_out, ldo, d_lse, &gr, d_delta, d_dout, lddo, stream};
        const double ms_f = attn_ms(&run, 0, NULL, 0), ms_b = attn_ms(&run, 1, d_ws, ws_bytes);
        for (int v = 0; v < dflash_attention_fwd_variants(); v++) { /* each forward row forced */
            dflash_attention_fwd_force(v);
            const double ms_v = attn_ms(&run, 0, NULL, 0);
            dflash_attention_fwd_force(-1);
            printf("timing %s W=%d forward with DFLASH_ATTENTION_FWD=%s %.3f ms\n", k->name, k->window,
                   dflash_attention_fwd_variant(v), ms_v);
        }
        if (d_ws) { /* the backward without a workspace (dq recomputes dS), where it takes one */
            printf("timing %s W=%d backward without the dS workspace (dq recomputes) %.3f ms; workspace %.1f MB\n",
                   k->name, k->window, attn_ms(&run, 1, NULL, 0), ws_bytes / 1e6);
            const int ndkv = dflash_attention_dkv_variants(), nvar = ndkv + dflash_attention_dq_variants() - 1;
            for (int v = 0; v < nvar; v++) { /* each of the dk/dv CTAs forced, each dq row but the default */
                char what[96];
                force_backward_variant(v, ndkv, what, sizeof what);
                const double ms_w = attn_ms(&run, 1, d_ws, ws_bytes);
                force_backward_variant(-1, ndkv, NULL, 0);
                printf("timing %s W=%d backward with %s %.3f ms\n", k->name, k->window, what, ms_w);
            }
        }
        const double tf = fwd_flop / (ms_f * 1e-3) / 1e12, tb = 2 * fwd_flop / (ms_b * 1e-3) / 1e12;
        printf("timing %s W=%d forward %.3f ms %.1f TFLOP/s (%.0f%% of 790) backward %.3f ms %.1f TFLOP/s (%.0f%% of 790) "
               "[useful flops: fwd %.1f G, bwd %.1f G]\n",
               k->name, k->window, ms_f, tf, 100 * tf / 790, ms_b, tb, 100 * tb / 790, fwd_flop / 1e9, 2 * fwd_flop / 1e9);
    }

    CHECK_CUDA(cudaFree(d_q)); CHECK_CUDA(cudaFree(d_kvc)); CHECK_CUDA(cudaFree(d_kb)); CHECK_CUDA(cudaFree(d_vb));
    CHECK_CUDA(cudaFree(d_dout)); CHECK_CUDA(cudaFree(d_cs)); CHECK_CUDA(cudaFree(d_cl)); CHECK_CUDA(cudaFree(d_out));
    CHECK_CUDA(cudaFree(d_lse)); CHECK_CUDA(cudaFree(d_delta)); CHECK_CUDA(cudaFree(d_dq));
    CHECK_CUDA(cudaFree(d_dkvc)); CHECK_CUDA(cudaFree(d_dkb)); CHECK_CUDA(cudaFree(d_dvb));
    if (d_ws) CHECK_CUDA(cudaFree(d_ws));
    free(q), free(kc), free(vc), free(kb), free(vb), free(dout), free(out), free(lse), free(gdq), free(gdkvc);
    free(gdkb), free(gdvb), free(gdelta), free(blk), free(sq), free(sdo), free(sout), free(skb), free(svb);
    free(slse), free(scs), free(scl), free(qmap), free(cmap), free(inset), free(rout), free(rlse), free(rdq);
    free(rdkc), free(rdvc), free(rdkb), free(rdvb);
}

static void dflash_cuda_check(const kc_case *c)
{
    attn_case k;
    build_case(&k, c);
    run_case(&k);
    free_case(&k);
}
#endif

#define DFLASH_PARAMS "nh nkv hd B window pad wide_check timing layout N"
const kc_op kc_dflash_attention = {"dflash_attention", "bf16 (lse f32)", DFLASH_PARAMS, dflash_forward_cpu_check,
                                   KC_CUDA(dflash_cuda_check)};
const kc_op kc_dflash_attention_backward = {"dflash_attention_backward", "bf16", DFLASH_PARAMS,
                                            dflash_backward_cpu_check, KC_CUDA(dflash_cuda_check)};
const kc_op kc_dflash_attention_props = {"dflash_attention_props", "f32", DFLASH_PARAMS, dflash_props_cpu_check, NULL};
