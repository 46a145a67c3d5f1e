/* The step protocol (common/train/step.c) with a fake reducer, model backend and batch source, over a real job state
 * segment: two ranks (threads) train S steps; a run in which a rank "crashes" after every phase of the protocol in
 * turn (step_run_one stops there and a fresh context of that rank redoes the step from the progress words) ends
 * bitwise equal to one without, with every step committed once; a non-finite loss skips its step. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "step.h"
#include "tests/test.h"

#define N 1003   /* parameters */
#define D 2      /* ranks */
#define S 12     /* steps */

typedef struct shared {
    float state[2][N], grads[D][N];
    double sq[D];
    int grads_calls, nan_step;       /* nan_step: the step whose loss is made NaN (-1: none) */
} shared;

typedef struct fake_reducer { reducer base; shared *sh; int rank; } fake_reducer;
typedef struct fake_model { drafter_backend base; shared *sh; } fake_model;
typedef struct fake_source { batch_source base; uint64_t held; } fake_source;

static size_t lo_of(int r) { return (size_t)N * r / D; }
static const void *fr_weights(reducer *r, uint64_t k) { return ((fake_reducer *)r)->sh->state[k & 1]; }
static float *fr_grads(reducer *r, uint64_t k)
{
    fake_reducer *f = (fake_reducer *)r;
    memset(f->sh->grads[f->rank], 0, sizeof f->sh->grads[f->rank]);
    return f->sh->grads[f->rank];
}
static float summed(shared *sh, size_t j, double W)
{
    float g = 0;
    for (int i = 0; i < D; i++) g += sh->grads[i][j];
    return g * (float)(1.0 / W);
}
static void fr_reduce(reducer *r, uint64_t k, double W)
{
    fake_reducer *f = (fake_reducer *)r;
    double sq = 0;
    for (size_t j = lo_of(f->rank); j < lo_of(f->rank + 1); j++) sq += (double)summed(f->sh, j, W) * summed(f->sh, j, W);
    f->sh->sq[f->rank] = sq;
}
static double fr_apply(reducer *r, uint64_t k, double W, const adamw_params *ap, float clip, int apply, int *applied)
{
    fake_reducer *f = (fake_reducer *)r;
    double norm = sqrt(f->sh->sq[0] + f->sh->sq[1]);
    *applied = apply && isfinite(norm);
    for (size_t j = lo_of(f->rank); j < lo_of(f->rank + 1); j++)
        f->sh->state[(k + 1) & 1][j] = f->sh->state[k & 1][j] - (*applied ? 0.01f * summed(f->sh, j, W) : 0.0f);
    return norm;
}
static int fr_export(reducer *r, uint64_t k, optim_state *h, errbuf *e) { return -ENOTSUP; }
static void fr_destroy(reducer *r) {}
static const reducer_ops fr_ops = {fr_weights, fr_grads, fr_reduce, fr_apply, fr_export, fr_destroy};

static int fm_fb(drafter_backend *b, const void *wv, float *g, const drafter_batch *bt, drafter_metrics *mt, errbuf *e)
{
    fake_model *m = (fake_model *)b;
    const float *w = wv;
    *mt = (drafter_metrics){0};
    for (size_t j = 0; j < N; j++) g[j] += sinf(w[j] * (float)(bt->id + 1) + (float)j);
    mt->loss_sum = (int)(bt->id / D) == m->sh->nan_step ? NAN : 1.0 + (double)bt->id;
    mt->weight_sum = 2.0 + (double)(bt->id % 3);
    mt->nblocks = 1;
    __atomic_add_fetch(&m->sh->grads_calls, 1, __ATOMIC_RELAXED);
    return 0;
}
static void fm_destroy(drafter_backend *b) {}
static const drafter_backend_ops fm_ops = {fm_fb, fm_destroy};

static int fs_lease(batch_source *s, uint64_t b, uint64_t k, drafter_batch *bt, errbuf *e)
{
    ((fake_source *)s)->held = b;
    *bt = (drafter_batch){.id = b, .ntok = 10, .nseq = 1};
    return 0;
}
static void fs_release(batch_source *s) { ((fake_source *)s)->held = UINT64_MAX; }
static uint64_t fs_held(batch_source *s) { return ((fake_source *)s)->held; }
static void fs_destroy(batch_source *s) {}
static const batch_source_ops fs_ops = {fs_lease, fs_release, fs_held, fs_destroy};

typedef struct rank_run {
    job_plan *plan;
    job_state *js;
    shared *sh;
    int rank, crash;   /* crash: stop once after each phase boundary the schedule names */
    int crashes, phases_hit;    /* phases_hit: bit p set when the rank stopped after phase p */
    uint64_t last_crash_step;
} rank_run;

/* Crash schedule: in step k, rank k % D stops after phase (k / D) % 4 + 1, so S = 12 covers every phase of both
 * ranks at least once. */
static int crash_hook(void *ctx, uint64_t k, enum step_phase ph)
{
    rank_run *r = ctx;
    if (!r->crash || (int)(k % D) != r->rank || (int)((k / D) % 4) + 1 != (int)ph || r->last_crash_step == k) return 0;
    r->last_crash_step = k;
    r->crashes++;
    r->phases_hit |= 1 << ph;
    return 1;
}

static void *rank_main(void *arg)
{
    rank_run *r = arg;
    for (;;) {
        uint64_t k = atomic_load(&r->js->h->committed_step);
        if (k >= S) break;
        /* a fresh context every time: nothing survives a crash but the shared state */
        fake_reducer red = {{&fr_ops}, r->sh, r->rank};
        fake_model model = {{&fm_ops}, r->sh};
        fake_source src = {{&fs_ops}, UINT64_MAX};
        step_ctx s = {.plan = r->plan, .js = r->js, .model = &model.base, .red = &red.base, .src = &src.base,
                      .rank = r->rank, .nranks = D, .after_phase = crash_hook, .after_phase_ctx = r};
        errbuf err = {{0}};
        int rc = step_run_one(&s, k, &err);
        if (rc == -EINTR) continue; /* "restarted" */
        if (rc < 0) { fprintf(stderr, "rank %d step %llu: %s\n", r->rank, (unsigned long long)k, err.msg); break; }
    }
    return NULL;
}

static void run(shared *sh, int crash, int nan_step, int *crashes, int phases[D])
{
    static job_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.cfg.train.lr = 1e-3;
    plan.cfg.train.steps = S;
    plan.cfg.train.clip = 1.0;
    plan.cfg.train.beta1 = 0.9;
    plan.cfg.train.beta2 = 0.95;
    plan.cfg.train.eps = 1e-8;
    char seg[96];
    snprintf(seg, sizeof seg, "/dflash-t%d-step-state", (int)getpid());
    job_state js;
    errbuf err = {{0}};
    shm_segment_unlink(seg, NULL);
    REQUIRE(job_state_create(&js, seg, "test", D, N, S, &err) == 0);
    memset(sh, 0, sizeof *sh);
    sh->nan_step = nan_step;
    for (size_t j = 0; j < N; j++) sh->state[0][j] = (float)j / N - 0.5f;
    rank_run rr[D];
    pthread_t th[D];
    for (int r = 0; r < D; r++) {
        rr[r] = (rank_run){.plan = &plan, .js = &js, .sh = sh, .rank = r, .crash = crash, .last_crash_step = UINT64_MAX};
        pthread_create(&th[r], NULL, rank_main, &rr[r]);
    }
    for (int r = 0; r < D; r++) pthread_join(th[r], NULL);
    EXPECT(atomic_load(&js.h->committed_step) == S);
    for (uint64_t k = 0; k < S; k++)
        for (int r = 0; r < D; r++) EXPECT(js.h->records[k][r].batch_id == k * D + (uint64_t)r);
    *crashes = rr[0].crashes + rr[1].crashes;
    for (int r = 0; r < D; r++) phases[r] = rr[r].phases_hit;
    if (nan_step >= 0) {
        EXPECT(js.h->records[nan_step][0].skipped == STEP_SKIPPED_LOSS_NOT_FINITE);
        EXPECT(atomic_load(&js.h->skipped_steps) == 1);
    } else {
        EXPECT(atomic_load(&js.h->skipped_steps) == 0);
    }
    job_state_close(&js);
    shm_segment_unlink(seg, NULL);
}

TEST(crash_at_every_phase_boundary_is_bitwise_identical)
{
    static shared a, b;
    int ca = 0, cb = 0, pa[D], pb[D];
    run(&a, 0, -1, &ca, pa);
    run(&b, 1, -1, &cb, pb);
    EXPECT(ca == 0);
    /* every boundary a rank always reaches (after gradients, reduce, apply) was crashed at by both ranks; after the
     * commit only the rank that committed is sure to reach it */
    for (int r = 0; r < D; r++) EXPECT((pb[r] & 0xe) == 0xe);
    EXPECT(cb >= 3 * D);
    EXPECT(memcmp(a.state[S & 1], b.state[S & 1], sizeof a.state[0]) == 0);
    EXPECT(b.grads_calls == a.grads_calls); /* a phase published before the crash is not redone */
    EXPECT(memcmp(a.state[0], a.state[1], sizeof a.state[0]) != 0);
}

TEST(non_finite_loss_skips_the_step)
{
    static shared a, b;
    int c = 0, ph[D];
    run(&a, 0, 5, &c, ph);
    run(&b, 0, -1, &c, ph);
    /* the skipped step left the weights as they were: after it, the two runs differ by exactly that step */
    EXPECT(memcmp(a.state[S & 1], b.state[S & 1], sizeof a.state[0]) != 0);
    for (size_t j = 0; j < N; j++) EXPECT(isfinite(a.state[S & 1][j]));
}

TEST_MAIN
