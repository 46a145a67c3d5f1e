/* What the kernel case drivers share (tests/kernel_cases.h): row names and seeds, random inputs, and on the device
 * side the stream, device copies and the record of every download that the twice-bitwise check compares. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/compare_bf16.h"
#include "tests/kernel_cases.h"
#include "util.h"

int test_failed_here; /* the EXPECT()s of tests/test.h in the CPU checks */

const char *kc_case_name(const kc_case *c, char *buf, size_t n)
{
    size_t at = 0;
#define PUT(...)                                                                \
    do {                                                                        \
        int w_ = snprintf(buf + at, at < n ? n - at : 0, __VA_ARGS__);          \
        if (w_ > 0) at += (size_t)w_;                                           \
    } while (0)
    PUT("%s %s", c->op->name, c->op->dtype);
    const char *p = c->op->params;
    for (int i = 0; p && *p && i < KC_NP; i++) {
        while (*p == ' ') p++;
        const char *e = p;
        while (*e && *e != ' ') e++;
        if (e > p) PUT(" %.*s=%d", (int)(e - p), p, c->p[i]);
        p = e;
    }
    if (c->seqs) {
        PUT(" seqs=[");
        for (int i = 0; i < c->nseqs && i < 12; i++) PUT("%s%d", i ? "," : "", c->seqs[i]);
        if (c->nseqs > 12) PUT(",... %d seqs", c->nseqs);
        PUT("]");
    }
    if (c->aux) {
        PUT(" aux=[");
        for (int i = 0; i < c->naux && i < 12; i++) PUT("%s%d", i ? "," : "", c->aux[i]);
        if (c->naux > 12) PUT(",...");
        PUT("]");
    }
#undef PUT
    return buf;
}

uint64_t kc_case_seed(const kc_case *c)
{
    char name[1024];
    kc_case_name(c, name, sizeof name);
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const char *s = name; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h ? h : 0x9e3779b97f4a7c15ull; /* xorshift needs a non-zero state */
}

uint64_t rng_state = 0x9e3779b97f4a7c15ull;

uint64_t rnd_u64(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

double rnd_uniform(void)
{
    return (double)(rnd_u64() >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

float *rnd_floats(size_t n, double amp)
{
    float *p = xmalloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = (float)(amp * rnd_uniform());
    return p;
}

float *dup_floats(const float *src, size_t n)
{
    float *p = xmalloc((n ? n : 1) * sizeof *p);
    memcpy(p, src, n * sizeof *p);
    return p;
}

uint16_t *rnd_bf16(size_t n, double amp, float *f)
{
    uint16_t *h = xmalloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        h[i] = f32_to_bf16((float)(amp * rnd_uniform()));
        if (f) f[i] = bf16_to_f32(h[i]);
    }
    return h;
}

float *rnd_f32(size_t n, double amp, double bias)
{
    float *h = xmalloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = (float)(bias + amp * rnd_uniform());
    return h;
}

double kc_max_abs(const float *a, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
    return m;
}

double kc_dot_loss(const float *dy, const float *y, int rows, int cols, int ld)
{
    double s = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) s += (double)dy[(size_t)r * ld + c] * y[(size_t)r * ld + c];
    return s;
}

void kc_check_grad(const char *what, float *p, int rows, int cols, int ld, const float *an, int an_ld,
                   double (*loss)(void *ctx), void *ctx)
{
    const float h = 1e-3f;
    double amax = 0, err = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) amax = fmax(amax, fabs(an[(size_t)r * an_ld + c]));
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float *e = &p[(size_t)r * ld + c];
            float keep = *e;
            *e = keep + h;
            double lp = loss(ctx);
            *e = keep - h;
            double lm = loss(ctx);
            *e = keep;
            double fd = (lp - lm) / (2.0 * h);
            err = fmax(err, fabs(fd - an[(size_t)r * an_ld + c]));
        }
    double tol = 1e-2 * fmax(amax, 1e-2);
    if (!(err <= tol)) {
        fprintf(stderr, "  %s: max |fd - analytic| = %g > tol %g (max |analytic| %g)\n", what, err, tol, amax);
        test_failed_here = 1;
    }
}

#ifdef DFLASH_CUDA
int failures;
cudaStream_t stream;

/* The downloads of a row's first run (kept), compared one by one with the second run's. */
static struct {
    int run;          /* 0: keep, 1: compare, -1: neither */
    void **data;
    size_t *bytes;
    int n, cap, next;
    size_t differing; /* second run: downloads whose bytes or size differ */
    size_t total;
} rec = {.run = -1};

static char skip_why[256]; /* kc_skip's reason in the current run */

void kc_skip(const char *why) { snprintf(skip_why, sizeof skip_why, "%s", why && *why ? why : "skipped"); }

const char *kc_skipped(void) { return skip_why[0] ? skip_why : NULL; }

void kc_record_begin(int run)
{
    skip_why[0] = 0;
    if (run == 0) {
        for (int i = 0; i < rec.n; i++) free(rec.data[i]);
        rec.n = 0, rec.total = 0;
    }
    rec.run = run, rec.next = 0, rec.differing = 0;
}

/* After the second run: the downloads of run 0 (count and bytes), and how many of run 1's differed. */
size_t kc_record_end(int *ndownloads, size_t *bytes)
{
    size_t diff = rec.differing + (size_t)(rec.next != rec.n ? 1 : 0);
    *ndownloads = rec.n, *bytes = rec.total;
    rec.run = -1;
    return diff;
}

static void record(const void *h, size_t bytes)
{
    if (rec.run == 0) {
        if (rec.n == rec.cap) {
            rec.cap = rec.cap ? 2 * rec.cap : 64;
            rec.data = xrealloc(rec.data, sizeof *rec.data * (size_t)rec.cap);
            rec.bytes = xrealloc(rec.bytes, sizeof *rec.bytes * (size_t)rec.cap);
        }
        rec.data[rec.n] = xmalloc(bytes ? bytes : 1);
        memcpy(rec.data[rec.n], h, bytes);
        rec.bytes[rec.n++] = bytes, rec.total += bytes;
    } else if (rec.run == 1) {
        int i = rec.next++;
        if (i >= rec.n || rec.bytes[i] != bytes || memcmp(rec.data[i], h, bytes)) rec.differing++;
    }
}

void *dev_upload(const void *src, size_t bytes)
{
    void *d = NULL;
    CHECK_CUDA(cudaMalloc(&d, bytes ? bytes : 16));
    if (bytes && src) CHECK_CUDA(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
    return d;
}

uint16_t *dev_poisoned(size_t n)
{
    uint16_t *d = dev_upload(NULL, n * 2 + 16);
    CHECK_CUDA(cudaMemset(d, 0xff, n * 2 + 16));
    return d;
}

void dev_put(void *d, const void *src, size_t bytes)
{
    CHECK_CUDA(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
}

void *dev_get(const void *d, size_t bytes)
{
    void *h = xmalloc(bytes ? bytes : 1);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaDeviceSynchronize()); /* launches on the legacy stream (NULL) too */
    if (bytes) CHECK_CUDA(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    record(h, bytes);
    return h;
}

void compare_bf16(const char *name, const uint16_t *got, const float *ref, size_t n, double tol_norm, double tol_max)
{
    if (!compare_bf16_line(name, got, ref, n, tol_norm, tol_max)) failures++;
}

int kc_reporting(void) { return rec.run != 1; }

void kc_report(const char *name, double err, double tol)
{
    int ok = err <= tol;
    printf("%s %s max_err=%.3g tol=%.3g\n", ok ? "ok" : "FAIL", name, err, tol);
    fflush(stdout);
    if (!ok) failures++;
}

void report_same_bits(const char *name, const void *a, const void *b, size_t bytes, int is_f32)
{
    double err = 0;
    if (memcmp(a, b, bytes)) {
        err = INFINITY; /* bits differ; say by how much where the type allows */
        if (is_f32) {
            err = 0;
            for (size_t i = 0; i < bytes / 4; i++) err = fmax(err, fabs(((const float *)a)[i] - ((const float *)b)[i]));
            if (err == 0) err = INFINITY;
        }
    }
    char full[256];
    snprintf(full, sizeof full, "determinism %s (two runs, bitwise)", name);
    kc_report(full, err, 0.0);
}

double err_bf16(const uint16_t *got, int ldg, const float *ref, int ldr, int rows, int cols, double *mx)
{
    double e = 0, m = 0;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < cols; i++) {
            double g = bf16_to_f32(got[(size_t)r * ldg + i]), w = ref[(size_t)r * ldr + i];
            if (isnan(g)) return INFINITY;
            e = fmax(e, fabs(g - w)), m = fmax(m, fabs(w));
        }
    if (mx) *mx = m;
    return e;
}

double err_f32(const float *got, const float *ref, size_t n, double *mx)
{
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i])) return INFINITY;
        e = fmax(e, fabs((double)got[i] - ref[i])), m = fmax(m, fabs(ref[i]));
    }
    if (mx) *mx = m;
    return e;
}

double err_vs_max(const uint16_t *got, int ldg, const float *ref, int ldr, int rows, int cols, double *norm_rel)
{
    double mx = 0, e = 0, se = 0, sr = 0;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < cols; i++) mx = fmax(mx, fabs(ref[(size_t)r * ldr + i]));
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < cols; i++) {
            double g = bf16_to_f32(got[(size_t)r * ldg + i]), w = ref[(size_t)r * ldr + i];
            if (isnan(g)) return INFINITY;
            e = fmax(e, fabs(g - w));
            se += (g - w) * (g - w), sr += w * w;
        }
    if (norm_rel) *norm_rel = sr > 0 ? sqrt(se / sr) : sqrt(se);
    return mx > 0 ? e / mx : e;
}

float *abs_copy(const float *a, size_t n)
{
    float *b = xmalloc((n ? n : 1) * 4);
    for (size_t i = 0; i < n; i++) b[i] = fabsf(a[i]);
    return b;
}

double max_of(const float *a, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, a[i]);
    return m;
}

float elapsed_ms(cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0;
    CHECK_CUDA(cudaEventSynchronize(b));
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    return ms;
}
#endif
