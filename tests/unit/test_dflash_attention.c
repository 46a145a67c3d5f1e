/* dflash_attention CPU reference: forward against a naive dense-mask attention built exactly like
 * make_goldens.py builds its (N*B, T+N*B) mask (and make_swa_golden.py for a sliding window: also |q - k| < W in
 * positions); backward against central finite differences of L = Σ dout ⊙ out for every input (q, kc, vc, kb,
 * vb). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dflash_attention.h"
#include "tests/test.h"
#include "util.h"

/* Three packed sequences; blocks anchored inside them. Anchor 0 gives a block with ctx_len 0. */
static const int seq_len[] = {7, 5, 9};
static const int blk_seq[] = {0, 0, 0, 1, 2, 2};
static const int blk_anchor[] = {0, 3, 5, 2, 4, 8};
#define NSEQ 3
#define NBLK 6

typedef struct att_case {
    dflash_attn_shape s;
    int T, NB;
    int32_t ctx_start[NBLK], ctx_len[NBLK];
    int seq_of[32], pos_of[32];
    float *q, *kc, *vc, *kb, *vb, *dout;
} att_case;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

static float *rand_vec(size_t n)
{
    float *x = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) x[i] = frand();
    return x;
}

static void case_init(att_case *c, int nh, int nkv, int B, int window)
{
    memset(c, 0, sizeof *c);
    c->s = (dflash_attn_shape){.nblocks = NBLK, .block_size = B, .nh = nh, .nkv = nkv, .hd = 8, .window = window};
    c->s.scale = 1.0f / sqrtf((float)c->s.hd);
    int start[NSEQ + 1] = {0};
    for (int i = 0; i < NSEQ; i++) {
        start[i + 1] = start[i] + seq_len[i];
        for (int p = 0; p < seq_len[i]; p++) {
            c->seq_of[start[i] + p] = i;
            c->pos_of[start[i] + p] = p;
        }
    }
    c->T = start[NSEQ];
    c->NB = NBLK * B;
    for (int j = 0; j < NBLK; j++) {
        c->ctx_start[j] = start[blk_seq[j]];
        c->ctx_len[j] = blk_anchor[j]; /* positions strictly before the anchor */
    }
    size_t qn = (size_t)c->NB * nh * c->s.hd, cn = (size_t)c->T * nkv * c->s.hd, bn = (size_t)c->NB * nkv * c->s.hd;
    c->q = rand_vec(qn);
    c->kc = rand_vec(cn);
    c->vc = rand_vec(cn);
    c->kb = rand_vec(bn);
    c->vb = rand_vec(bn);
    c->dout = rand_vec(qn);
    /* sharper scores than uniform [-1,1) so the softmax is not nearly flat */
    for (size_t i = 0; i < qn; i++) c->q[i] *= 2.0f;
}

static void case_free(att_case *c)
{
    free(c->q); free(c->kc); free(c->vc); free(c->kb); free(c->vb); free(c->dout);
}

/* Dense reference in double: mask [NB, T+NB] as in make_goldens.py, -inf fill, softmax, weighted sum. */
static void naive_forward(const att_case *c, double *out, double *lse)
{
    const int B = c->s.block_size, nh = c->s.nh, nkv = c->s.nkv, hd = c->s.hd, T = c->T, NB = c->NB;
    const int K = T + NB, g = nh / nkv;
    double *sc = xmalloc(sizeof(double) * K);
    for (int qi = 0; qi < NB; qi++) {
        int qb = qi / B, qa = blk_anchor[qb], qs = blk_seq[qb], qpos = qa + qi % B, W = c->s.window;
        for (int h = 0; h < nh; h++) {
            int kh = h / g;
            double mx = -INFINITY;
            for (int k = 0; k < K; k++) {
                int visible;
                const float *kr;
                int kpos;
                if (k < T) {
                    visible = c->seq_of[k] == qs && c->pos_of[k] < qa;
                    kr = c->kc + ((size_t)k * nkv + kh) * hd;
                    kpos = c->pos_of[k];
                } else {
                    visible = (k - T) / B == qb;
                    kr = c->kb + ((size_t)(k - T) * nkv + kh) * hd;
                    kpos = qa + (k - T) % B;
                }
                if (W > 0 && abs(qpos - kpos) >= W) visible = 0;
                double d = 0;
                for (int e = 0; e < hd; e++) d += (double)c->q[((size_t)qi * nh + h) * hd + e] * kr[e];
                sc[k] = visible ? d * c->s.scale : -INFINITY;
                if (sc[k] > mx) mx = sc[k];
            }
            double sum = 0;
            for (int k = 0; k < K; k++) sum += exp(sc[k] - mx);
            double *o = out + ((size_t)qi * nh + h) * hd;
            for (int e = 0; e < hd; e++) o[e] = 0;
            for (int k = 0; k < K; k++) {
                double p = exp(sc[k] - mx) / sum;
                const float *vr = k < T ? c->vc + ((size_t)k * nkv + kh) * hd
                                        : c->vb + ((size_t)(k - T) * nkv + kh) * hd;
                for (int e = 0; e < hd; e++) o[e] += p * vr[e];
            }
            lse[(size_t)qi * nh + h] = mx + log(sum);
        }
    }
    free(sc);
}

static void check_forward(int nh, int nkv, int B, int window)
{
    att_case c;
    case_init(&c, nh, nkv, B, window);
    size_t qn = (size_t)c.NB * nh * c.s.hd, ln = (size_t)c.NB * nh;
    float *out = xmalloc(sizeof(float) * qn), *lse = xmalloc(sizeof(float) * ln);
    double *rout = xmalloc(sizeof(double) * qn), *rlse = xmalloc(sizeof(double) * ln);
    dflash_attention_forward_cpu(out, lse, c.q, c.kc, c.vc, c.kb, c.vb, c.ctx_start, c.ctx_len, &c.s);
    naive_forward(&c, rout, rlse);
    double emax = 0, lmax = 0;
    for (size_t i = 0; i < qn; i++) emax = fmax(emax, fabs(out[i] - rout[i]));
    for (size_t i = 0; i < ln; i++) lmax = fmax(lmax, fabs(lse[i] - rlse[i]));
    EXPECT(emax <= 2e-6);
    EXPECT(lmax <= 2e-6);
    if (test_failed_here) fprintf(stderr, "  nh=%d nkv=%d B=%d window=%d: max|out err| %g, max|lse err| %g\n", nh,
                                  nkv, B, window, emax, lmax);
    free(out); free(lse); free(rout); free(rlse);
    case_free(&c);
}

TEST(forward_matches_dense_mask)
{
    static const int cfg[][2] = {{2, 2}, {4, 2}, {4, 1}}; /* GQA ratio 1, 2, 4 */
    for (int i = 0; i < 3; i++)
        for (int B = 3; B <= 4; B++) check_forward(cfg[i][0], cfg[i][1], B, 0);
}

/* Sliding windows: shorter than the block (block slots cut, late slots without context), between, longer than
 * every context (nothing cut). */
TEST(forward_window_matches_dense_mask)
{
    static const int win[] = {1, 2, 3, 5, 7, 64};
    for (int w = 0; w < 6; w++) {
        check_forward(4, 2, 4, win[w]);
        check_forward(4, 1, 3, win[w]);
    }
}

/* A window that cuts nothing gives the bits of no window (the same keys in the same order). */
TEST(forward_wide_window_is_full_attention)
{
    att_case c;
    case_init(&c, 4, 2, 4, 0);
    size_t qn = (size_t)c.NB * 4 * c.s.hd, ln = (size_t)c.NB * 4;
    float *o1 = xmalloc(sizeof(float) * qn), *o2 = xmalloc(sizeof(float) * qn);
    float *l1 = xmalloc(sizeof(float) * ln), *l2 = xmalloc(sizeof(float) * ln);
    dflash_attention_forward_cpu(o1, l1, c.q, c.kc, c.vc, c.kb, c.vb, c.ctx_start, c.ctx_len, &c.s);
    c.s.window = 9 + 4; /* longer than the longest context plus the block */
    dflash_attention_forward_cpu(o2, l2, c.q, c.kc, c.vc, c.kb, c.vb, c.ctx_start, c.ctx_len, &c.s);
    EXPECT(memcmp(o1, o2, sizeof(float) * qn) == 0);
    EXPECT(memcmp(l1, l2, sizeof(float) * ln) == 0);
    free(o1); free(o2); free(l1); free(l2);
    case_free(&c);
}

/* A block's own rows are seen in both directions: slot 0's output depends on the last slot's value. */
TEST(forward_block_is_bidirectional)
{
    att_case c;
    case_init(&c, 2, 2, 4, 0);
    size_t qn = (size_t)c.NB * 2 * c.s.hd;
    float *o1 = xmalloc(sizeof(float) * qn), *o2 = xmalloc(sizeof(float) * qn);
    float *lse = xmalloc(sizeof(float) * c.NB * 2);
    dflash_attention_forward_cpu(o1, lse, c.q, c.kc, c.vc, c.kb, c.vb, c.ctx_start, c.ctx_len, &c.s);
    size_t row = 1 * 4 + 3; /* block 1, last slot */
    for (int e = 0; e < 2 * c.s.hd; e++) c.vb[row * 2 * c.s.hd + e] += 1.0f;
    dflash_attention_forward_cpu(o2, lse, c.q, c.kc, c.vc, c.kb, c.vb, c.ctx_start, c.ctx_len, &c.s);
    size_t hd2 = 2 * (size_t)c.s.hd;
    EXPECT(fabsf(o1[4 * hd2] - o2[4 * hd2]) > 1e-3);          /* block 1 slot 0 changed */
    EXPECT(o1[0] == o2[0] && o1[8 * hd2] == o2[8 * hd2]);      /* blocks 0 and 2 untouched */
    free(o1); free(o2); free(lse);
    case_free(&c);
}

static double loss_of(const att_case *c, float *out, float *lse)
{
    dflash_attention_forward_cpu(out, lse, c->q, c->kc, c->vc, c->kb, c->vb, c->ctx_start, c->ctx_len, &c->s);
    size_t qn = (size_t)c->NB * c->s.nh * c->s.hd;
    double L = 0;
    for (size_t i = 0; i < qn; i++) L += (double)c->dout[i] * out[i];
    return L;
}

/* Compare an analytic gradient with central differences of L over every element of x. */
static int check_grad(const char *name, att_case *c, float *x, size_t n, const float *g, float *out, float *lse)
{
    double *fd = xmalloc(sizeof(double) * n);
    const float step = 1e-3f;
    for (size_t i = 0; i < n; i++) {
        float x0 = x[i];
        x[i] = x0 + step;
        float xp = x[i];
        double lp = loss_of(c, out, lse);
        x[i] = x0 - step;
        float xm = x[i];
        double lm = loss_of(c, out, lse);
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

static void check_backward(int nh, int nkv, int B, int window)
{
    att_case c;
    case_init(&c, nh, nkv, B, window);
    const int hd = c.s.hd;
    size_t qn = (size_t)c.NB * nh * hd, cn = (size_t)c.T * nkv * hd, bn = (size_t)c.NB * nkv * hd;
    float *out = xmalloc(sizeof(float) * qn), *lse = xmalloc(sizeof(float) * c.NB * nh);
    float *dq = xmalloc(sizeof(float) * qn);
    float *dkc = xmalloc(sizeof(float) * cn), *dvc = xmalloc(sizeof(float) * cn);
    float *dkb = xmalloc(sizeof(float) * bn), *dvb = xmalloc(sizeof(float) * bn);
    /* dq must be overwritten; the k/v grads accumulate onto what is there (0.25 here, subtracted after) */
    for (size_t i = 0; i < qn; i++) dq[i] = 123.0f;
    for (size_t i = 0; i < cn; i++) dkc[i] = dvc[i] = 0.25f;
    for (size_t i = 0; i < bn; i++) dkb[i] = dvb[i] = 0.25f;
    dflash_attention_forward_cpu(out, lse, c.q, c.kc, c.vc, c.kb, c.vb, c.ctx_start, c.ctx_len, &c.s);
    dflash_attention_backward_cpu(dq, dkc, dvc, dkb, dvb, c.dout, out, lse, c.q, c.kc, c.vc, c.kb, c.vb,
                                  c.ctx_start, c.ctx_len, &c.s);
    for (size_t i = 0; i < cn; i++) { dkc[i] -= 0.25f; dvc[i] -= 0.25f; }
    for (size_t i = 0; i < bn; i++) { dkb[i] -= 0.25f; dvb[i] -= 0.25f; }
    int bad = 0;
    bad |= check_grad("dq", &c, c.q, qn, dq, out, lse);
    bad |= check_grad("dkc", &c, c.kc, cn, dkc, out, lse);
    bad |= check_grad("dvc", &c, c.vc, cn, dvc, out, lse);
    bad |= check_grad("dkb", &c, c.kb, bn, dkb, out, lse);
    bad |= check_grad("dvb", &c, c.vb, bn, dvb, out, lse);
    if (bad) {
        fprintf(stderr, "  (nh=%d nkv=%d B=%d window=%d)\n", nh, nkv, B, window);
        test_failed_here = 1;
    }
    /* context rows after the last anchor of their sequence are seen by no block: zero gradient */
    const int last_row = c.T - 1; /* seq 2 position 8; its largest anchor is 8, so position 8 is unseen */
    for (int e = 0; e < nkv * hd; e++) {
        EXPECT(dkc[(size_t)last_row * nkv * hd + e] == 0.0f);
        EXPECT(dvc[(size_t)last_row * nkv * hd + e] == 0.0f);
    }
    free(out); free(lse); free(dq); free(dkc); free(dvc); free(dkb); free(dvb);
    case_free(&c);
}

TEST(backward_gqa1_b3) { check_backward(2, 2, 3, 0); }
TEST(backward_gqa2_b4) { check_backward(4, 2, 4, 0); }
TEST(backward_gqa4_b3) { check_backward(4, 1, 3, 0); }
TEST(backward_gqa4_b4) { check_backward(4, 1, 4, 0); }
TEST(backward_window2_b4) { check_backward(4, 2, 4, 2); }
TEST(backward_window3_b3) { check_backward(4, 1, 3, 3); }
TEST(backward_window5_b4) { check_backward(2, 2, 4, 5); }

TEST_MAIN
