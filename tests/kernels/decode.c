/* The decoding kernels: kv_cache_append + kv_attention (new query rows against a per-sequence KV cache, causal over
 * the cache and the new rows), argmax (ties to the lowest index, NaN never chosen) and block_accept (the drafter's
 * acceptance counts). CPU: against naive double references; CUDA: against the CPU references on the same bf16 values
 * (the cache after the append and every count exactly). kv_attention: seqs = the new rows of each sequence, aux = the
 * rows each sequence's cache held before them (its first new row's position); the rows are interleaved across the
 * sequences. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "argmax.h"
#include "block_accept.h"
#include "kv_attention.h"
#include "tests/kernel_cases.h"
#include "tests/test.h"
#include "util.h"

/* ---- kv_attention: nh nkv hd max_len, seqs = new rows per sequence, aux = cached rows per sequence ---- */

typedef struct kv_rows {
    int T, nseq, max_pos;
    int32_t *seq, *pos;
} kv_rows;

/* The new rows round-robin over the sequences (sequence s's rows at positions aux[s], aux[s] + 1, ...). */
static kv_rows kv_rows_of(const kc_case *c)
{
    kv_rows r = {.nseq = c->nseqs};
    for (int s = 0; s < c->nseqs; s++) r.T += c->seqs[s];
    r.seq = xmalloc(sizeof(int32_t) * (size_t)(r.T + 1)), r.pos = xmalloc(sizeof(int32_t) * (size_t)(r.T + 1));
    int *done = xcalloc((size_t)c->nseqs, sizeof(int)), t = 0;
    while (t < r.T)
        for (int s = 0; s < c->nseqs; s++)
            if (done[s] < c->seqs[s]) {
                r.seq[t] = s, r.pos[t] = c->aux[s] + done[s]++;
                r.max_pos = r.pos[t] > r.max_pos ? r.pos[t] : r.max_pos;
                t++;
            }
    free(done);
    return r;
}

static void kv_attention_cpu_check(const kc_case *c)
{
    const int nh = c->p[0], nkv = c->p[1], hd = c->p[2], max_len = c->p[3], kd = nkv * hd, qd = nh * hd;
    kv_rows r = kv_rows_of(c);
    REQUIRE(r.max_pos < max_len);
    const int T = r.T, ldk = kd + 3, ldq = qd + 5, ldo = qd + 2;
    const size_t stride = (size_t)max_len * kd, ncache = (size_t)r.nseq * stride;
    float *kc = rnd_floats(ncache, 2.0), *vc = rnd_floats(ncache, 1.0), *k0 = dup_floats(kc, ncache);
    float *v0 = dup_floats(vc, ncache);
    float *k = rnd_floats((size_t)T * ldk, 2.0), *v = rnd_floats((size_t)T * ldk, 1.0), *q = rnd_floats((size_t)T * ldq, 1.0);
    float *out = rnd_floats((size_t)T * ldo, 1.0), *out0 = dup_floats(out, (size_t)T * ldo);
    kv_cache_append_cpu(kc, vc, stride, k, ldk, v, ldk, r.seq, r.pos, T, kd);
    /* the new rows at (seq, pos), nothing else changed */
    for (int t = 0; t < T; t++) {
        const size_t at = (size_t)r.seq[t] * stride + (size_t)r.pos[t] * kd;
        memcpy(k0 + at, k + (size_t)t * ldk, sizeof(float) * kd), memcpy(v0 + at, v + (size_t)t * ldk, sizeof(float) * kd);
    }
    EXPECT(memcmp(kc, k0, sizeof(float) * ncache) == 0);
    EXPECT(memcmp(vc, v0, sizeof(float) * ncache) == 0);
    const float scale = 1.0f / sqrtf((float)hd);
    kv_attention_forward_cpu(out, ldo, q, ldq, kc, vc, stride, r.seq, r.pos, T, nh, nkv, hd, scale);
    double worst = 0, *sc = xmalloc(sizeof(double) * (size_t)max_len);
    int pad_changed = 0;
    for (int t = 0; t < T; t++) {
        const float *K = kc + (size_t)r.seq[t] * stride, *V = vc + (size_t)r.seq[t] * stride;
        for (int h = 0; h < nh; h++) {
            const int kh = h / (nh / nkv);
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j <= r.pos[t]; j++) {
                double d = 0;
                for (int e = 0; e < hd; e++) d += (double)q[(size_t)t * ldq + (size_t)h * hd + e] * K[(size_t)j * kd + (size_t)kh * hd + e];
                sc[j] = d * scale, mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j <= r.pos[t]; j++) sum += exp(sc[j] - mx);
            for (int e = 0; e < hd; e++) {
                double o = 0;
                for (int j = 0; j <= r.pos[t]; j++) o += exp(sc[j] - mx) / sum * V[(size_t)j * kd + (size_t)kh * hd + e];
                worst = fmax(worst, fabs(out[(size_t)t * ldo + (size_t)h * hd + e] - o));
            }
        }
        for (int e = qd; e < ldo; e++) pad_changed |= out[(size_t)t * ldo + e] != out0[(size_t)t * ldo + e];
    }
    EXPECT(worst < 1e-5);
    EXPECT(!pad_changed);
    if (test_failed_here) fprintf(stderr, "  max |out - naive| %g\n", worst);
    free(kc), free(vc), free(k0), free(v0), free(k), free(v), free(q), free(out), free(out0), free(sc);
    free(r.seq), free(r.pos);
}

/* ---- argmax: n V ld ---- */

/* Rows of random values with, by row: a unique maximum, a tie (the lowest index wins), the maximum in the last
 * column, every value equal, a NaN at the front and one at the maximum's right (never chosen). */
static void argmax_fill(float *x, int n, int V, int ld)
{
    for (size_t i = 0; i < (size_t)n * ld; i++) x[i] = (float)rnd_uniform();
    for (int r = 0; r < n; r++) {
        float *row = x + (size_t)r * ld;
        int a = (int)((rnd_uniform() + 1.0) * 0.5 * V) % V, b = (int)((rnd_uniform() + 1.0) * 0.5 * V) % V;
        switch (r % 5) {
        case 0: row[a] = 3.0f; break;
        case 1: row[a] = row[b] = 3.0f; break;
        case 2: row[V - 1] = 3.0f; break;
        case 3: for (int i = 0; i < V; i++) row[i] = 0.5f; break;
        case 4: row[0] = NAN, row[a] = 3.0f, row[a + 1 < V ? a + 1 : a] = a + 1 < V ? NAN : 3.0f; break;
        }
        for (int i = V; i < ld; i++) row[i] = 100.0f; /* past V: never chosen */
    }
}

static int argmax_naive(const float *row, int V)
{
    int best = -1;
    for (int i = 0; i < V; i++)
        if (!isnan(row[i]) && (best < 0 || row[i] > row[best])) best = i;
    return best < 0 ? 0 : best;
}

static void argmax_cpu_check(const kc_case *c)
{
    const int n = c->p[0], V = c->p[1], ld = c->p[2];
    float *x = xmalloc(sizeof(float) * (size_t)n * ld);
    argmax_fill(x, n, V, ld);
    int32_t *got = xmalloc(sizeof(int32_t) * (size_t)n);
    argmax_rows_cpu(got, x, ld, n, V);
    for (int r = 0; r < n; r++) EXPECT(got[r] == argmax_naive(x + (size_t)r * ld, V));
    free(x), free(got);
}

/* ---- block_accept: nblocks B vocab ---- */

static void block_accept_inputs(int nblocks, int B, int vocab, int32_t **am, int32_t **lab, float **w)
{
    size_t n = (size_t)nblocks * B;
    *am = xmalloc((n + 1) * 4), *lab = xmalloc((n + 1) * 4), *w = xmalloc((n + 1) * 4);
    for (size_t i = 0; i < n; i++) {
        (*lab)[i] = (int32_t)((rnd_uniform() + 1) * 0.5 * vocab) % vocab;
        (*am)[i] = rnd_uniform() < 0.5 ? (*lab)[i] : (int32_t)((rnd_uniform() + 1) * 0.5 * vocab) % vocab;
        (*w)[i] = (i % B) == 0 || rnd_uniform() > 0.8 ? 0.0f : 1.0f;
    }
}

static void block_accept_cpu_check(const kc_case *c)
{
    const int nblocks = c->p[0], B = c->p[1], vocab = c->p[2];
    int32_t *am, *lab;
    float *w;
    block_accept_inputs(nblocks, B, vocab, &am, &lab, &w);
    int64_t *got = xmalloc(sizeof(int64_t) * (size_t)(B + 1)), *want = xcalloc((size_t)B + 1, sizeof(int64_t));
    for (int k = 0; k <= B; k++) got[k] = -99;
    block_accept_cpu(got, &got[B], am, lab, w, nblocks, B);
    for (int j = 0; j < nblocks; j++) {
        int run = 1;
        for (int k = 1; k < B; k++) {
            size_t i = (size_t)j * B + k;
            int ok = w[i] != 0.0f && am[i] == lab[i];
            want[k] += ok;
            run = run && ok;
            want[B] += run;
        }
    }
    for (int k = 0; k <= B; k++) EXPECT(got[k] == want[k]);
    free(am), free(lab), free(w), free(got), free(want);
}

#ifdef DFLASH_CUDA
static void kv_attention_cuda_check(const kc_case *c)
{
    const int nh = c->p[0], nkv = c->p[1], hd = c->p[2], max_len = c->p[3], kd = nkv * hd, qd = nh * hd;
    kv_rows r = kv_rows_of(c);
    const int T = r.T, ldk = kd + 8, ldq = qd + 8, ldo = qd + 8;
    const size_t stride = (size_t)max_len * kd, ncache = (size_t)r.nseq * stride;
    float *kc = xmalloc(sizeof(float) * ncache), *vc = xmalloc(sizeof(float) * ncache);
    float *k = xmalloc(sizeof(float) * (size_t)T * ldk), *v = xmalloc(sizeof(float) * (size_t)T * ldk);
    float *q = xmalloc(sizeof(float) * (size_t)T * ldq), *ref = xmalloc(sizeof(float) * (size_t)T * ldo);
    uint16_t *hk = rnd_bf16(ncache, 2.0, kc), *hv = rnd_bf16(ncache, 1.0, vc);
    uint16_t *nk = rnd_bf16((size_t)T * ldk, 2.0, k), *nv = rnd_bf16((size_t)T * ldk, 1.0, v);
    uint16_t *hq = rnd_bf16((size_t)T * ldq, 1.0, q);
    const float scale = 1.0f / sqrtf((float)hd);
    kv_cache_append_cpu(kc, vc, stride, k, ldk, v, ldk, r.seq, r.pos, T, kd);
    kv_attention_forward_cpu(ref, ldo, q, ldq, kc, vc, stride, r.seq, r.pos, T, nh, nkv, hd, scale);
    uint16_t *d_kc = dev_upload(hk, ncache * 2), *d_vc = dev_upload(hv, ncache * 2);
    uint16_t *d_k = dev_upload(nk, (size_t)T * ldk * 2), *d_v = dev_upload(nv, (size_t)T * ldk * 2);
    uint16_t *d_q = dev_upload(hq, (size_t)T * ldq * 2), *d_out = dev_poisoned((size_t)T * ldo);
    int32_t *d_seq = dev_upload(r.seq, sizeof(int32_t) * (size_t)T), *d_pos = dev_upload(r.pos, sizeof(int32_t) * (size_t)T);
    const size_t wsb = kv_attention_workspace_bytes(T, nh, hd, r.max_pos);
    float *d_ws = dev_upload(NULL, wsb);
    CHECK_CUDA(cudaMemset(d_ws, 0, wsb)); /* kv_attention's counters start at zero */
    kv_cache_append_cuda(d_kc, d_vc, stride, d_k, ldk, d_v, ldk, d_seq, d_pos, T, kd, stream);
    kv_attention_forward_cuda(d_out, ldo, d_q, ldq, d_kc, d_vc, stride, d_seq, d_pos, T, r.max_pos, nh, nkv, hd, scale,
                              d_ws, stream);
    uint16_t *gk = dev_get(d_kc, ncache * 2), *gv = dev_get(d_vc, ncache * 2), *go = dev_get(d_out, (size_t)T * ldo * 2);
    size_t wrong = 0;
    for (size_t i = 0; i < ncache; i++) wrong += bf16_to_f32(gk[i]) != kc[i] || bf16_to_f32(gv[i]) != vc[i];
    char name[200];
    snprintf(name, sizeof name, "kv_cache_append_cuda T=%d nseq=%d kd=%d: cache values differing from the CPU's (of %zu)",
             T, r.nseq, kd, ncache);
    kc_report(name, (double)wrong, 0.0);
    /* the output's own columns (padding: still the poison) */
    uint16_t *o = xmalloc(sizeof(uint16_t) * (size_t)T * qd);
    float *rf = xmalloc(sizeof(float) * (size_t)T * qd);
    size_t pad_changed = 0;
    for (int t = 0; t < T; t++) {
        memcpy(o + (size_t)t * qd, go + (size_t)t * ldo, sizeof(uint16_t) * qd);
        memcpy(rf + (size_t)t * qd, ref + (size_t)t * ldo, sizeof(float) * qd);
        for (int e = qd; e < ldo; e++) pad_changed += go[(size_t)t * ldo + e] != 0xffff;
    }
    snprintf(name, sizeof name, "kv_attention_forward_cuda T=%d nseq=%d max_pos=%d nh=%d nkv=%d hd=%d", T, r.nseq,
             r.max_pos, nh, nkv, hd);
    compare_bf16(name, o, rf, (size_t)T * qd, 1e-2, 2e-2); /* one bf16 rounding of the output, fp32 sums */
    snprintf(name, sizeof name, "kv_attention_forward_cuda T=%d padding columns changed", T);
    kc_report(name, (double)pad_changed, 0.0);
    void *dev[] = {d_kc, d_vc, d_k, d_v, d_q, d_out, d_seq, d_pos, d_ws};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CHECK_CUDA(cudaFree(dev[i]));
    free(kc), free(vc), free(k), free(v), free(q), free(ref), free(hk), free(hv), free(nk), free(nv), free(hq);
    free(gk), free(gv), free(go), free(o), free(rf), free(r.seq), free(r.pos);
}

static void argmax_cuda_check(const kc_case *c)
{
    const int n = c->p[0], V = c->p[1], ld = c->p[2];
    float *x = xmalloc(sizeof(float) * (size_t)n * ld);
    argmax_fill(x, n, V, ld);
    uint16_t *h = xmalloc(sizeof(uint16_t) * (size_t)n * ld);
    for (size_t i = 0; i < (size_t)n * ld; i++) h[i] = f32_to_bf16(x[i]), x[i] = bf16_to_f32(h[i]);
    int32_t *ref = xmalloc(sizeof(int32_t) * (size_t)n);
    argmax_rows_cpu(ref, x, ld, n, V);
    uint16_t *d = dev_upload(h, sizeof(uint16_t) * (size_t)n * ld);
    int32_t *d_out = dev_upload(NULL, sizeof(int32_t) * (size_t)n);
    argmax_rows_cuda(d_out, d, ld, n, V, stream);
    int32_t *got = dev_get(d_out, sizeof(int32_t) * (size_t)n);
    size_t wrong = 0;
    for (int r = 0; r < n; r++) wrong += got[r] != ref[r];
    char name[160];
    snprintf(name, sizeof name, "argmax_rows_cuda n=%d V=%d ld=%d (rows differing from the CPU: ties, NaN, equal rows)",
             n, V, ld);
    kc_report(name, (double)wrong, 0.0);
    CHECK_CUDA(cudaFree(d)); CHECK_CUDA(cudaFree(d_out));
    free(x), free(h), free(ref), free(got);
}

static void block_accept_cuda_check(const kc_case *c)
{
    const int nblocks = c->p[0], B = c->p[1], vocab = c->p[2];
    size_t n = (size_t)nblocks * B;
    int32_t *am, *lab;
    float *w;
    block_accept_inputs(nblocks, B, vocab, &am, &lab, &w);
    int64_t *ref = xmalloc(sizeof(int64_t) * (size_t)(B + 1));
    block_accept_cpu(ref, &ref[B], am, lab, w, nblocks, B);
    int32_t *d_am = dev_upload(am, n * 4), *d_lab = dev_upload(lab, n * 4);
    float *d_w = dev_upload(w, n * 4);
    int64_t *d_out = dev_upload(NULL, sizeof(int64_t) * (size_t)(B + 1));
    block_accept_cuda(d_out, d_am, d_lab, d_w, nblocks, B, stream);
    int64_t *got = dev_get(d_out, sizeof(int64_t) * (size_t)(B + 1));
    double e = 0;
    for (int k = 0; k <= B; k++) e = fmax(e, fabs((double)(got[k] - ref[k])));
    char name[128];
    snprintf(name, sizeof name, "block_accept_cuda nblocks=%d B=%d (run sum %lld)", nblocks, B, (long long)ref[B]);
    kc_report(name, e, 0.0);
    CHECK_CUDA(cudaFree(d_am)); CHECK_CUDA(cudaFree(d_lab)); CHECK_CUDA(cudaFree(d_w)); CHECK_CUDA(cudaFree(d_out));
    free(am), free(lab), free(w), free(ref), free(got);
}
#endif

const kc_op kc_kv_attention = {"kv_attention", "bf16", "nh nkv hd max_len", kv_attention_cpu_check,
                               KC_CUDA(kv_attention_cuda_check)};
const kc_op kc_argmax = {"argmax_rows", "bf16->i32", "n V ld", argmax_cpu_check, KC_CUDA(argmax_cuda_check)};
const kc_op kc_block_accept = {"block_accept", "i32,f32->i64", "nblocks B vocab", block_accept_cpu_check,
                               KC_CUDA(block_accept_cuda_check)};
