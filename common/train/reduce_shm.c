#include "reduce_shm.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "job_state.h"
#include "keeper_proto.h"
#include "log.h"
#include "train_init.h"

#define REDUCE_SHM_MAGIC 0x52445348u /* "RDSH" */
#define CHUNK 16384                  /* elements of the summed gradient made at a time in apply */

typedef struct train_header {
    uint32_t magic, nranks;
    uint64_t numel;
    double sq[JOB_MAX_DRAFTERS];     /* rank r's share of Σ g² of the step being reduced */
} train_header;

typedef struct reduce_shm {
    reducer base;
    const drafter_layout *L;
    uint32_t rank, nranks;
    size_t numel, lo, hi, bytes;
    void *map;
    train_header *h;
    float *state[2];                 /* w, m, v */
    float *grads;                    /* nranks x numel */
    float *chunk;                    /* CHUNK floats: the summed gradient of part of this rank's range */
} reduce_shm;

static size_t align64(size_t n) { return (n + 63) / 64 * 64; }

size_t reduce_shm_bytes(size_t numel, uint32_t nranks)
{
    return align64(sizeof(train_header)) + (6 + (size_t)nranks) * numel * sizeof(float);
}

static optim_state state_of(reduce_shm *s, uint64_t step)
{
    float *b = s->state[step & 1];
    return (optim_state){b, b + s->numel, b + 2 * s->numel};
}

static const void *shm_weights(reducer *r, uint64_t step) { return state_of((reduce_shm *)r, step).w; }

static float *shm_grads(reducer *r, uint64_t step)
{
    reduce_shm *s = (reduce_shm *)r;
    (void)step;
    return s->grads + (size_t)s->rank * s->numel;
}

/* The summed gradient of elements [a, e) into out: Σ_i grads[i] in rank order, times inv. */
static void sum_grads(const reduce_shm *s, size_t a, size_t e, float inv, float *out)
{
    for (size_t j = a; j < e; j++) {
        float g = 0;
        for (uint32_t i = 0; i < s->nranks; i++) g += s->grads[(size_t)i * s->numel + j];
        out[j - a] = g * inv;
    }
}

static float inv_weight(double weight_sum) { return weight_sum > 0 ? (float)(1.0 / weight_sum) : 0.0f; }

static void shm_reduce(reducer *r, uint64_t step, double weight_sum)
{
    reduce_shm *s = (reduce_shm *)r;
    const float inv = inv_weight(weight_sum);
    double sq = 0;
    for (size_t a = s->lo; a < s->hi; a += CHUNK) {
        size_t e = a + CHUNK < s->hi ? a + CHUNK : s->hi;
        sum_grads(s, a, e, inv, s->chunk);
        for (size_t j = 0; j < e - a; j++) sq += (double)s->chunk[j] * s->chunk[j];
    }
    s->h->sq[s->rank] = sq;
    (void)step;
}

static double shm_apply(reducer *r, uint64_t step, double weight_sum, const adamw_params *ap, float clip, int apply,
                        int *applied)
{
    reduce_shm *s = (reduce_shm *)r;
    double sq = 0;
    for (uint32_t i = 0; i < s->nranks; i++) sq += s->h->sq[i];
    const double norm = sqrt(sq);
    const int ok = apply && isfinite(norm);
    const float coef = grad_clip_coef(norm, clip), inv = inv_weight(weight_sum);
    optim_state src = state_of(s, step), dst = state_of(s, step + 1);
    for (size_t a = s->lo; a < s->hi; a += CHUNK) {
        size_t e = a + CHUNK < s->hi ? a + CHUNK : s->hi;
        if (ok) sum_grads(s, a, e, inv, s->chunk);
        optim_apply_range(s->L, a, e, s->chunk, src, dst, ap, (long)step + 1, coef, ok);
    }
    *applied = ok;
    return norm;
}

static int shm_export(reducer *r, uint64_t step, optim_state *host, errbuf *err)
{
    *host = state_of((reduce_shm *)r, step);
    (void)err;
    return 0;
}

static void shm_destroy(reducer *r)
{
    reduce_shm *s = (reduce_shm *)r;
    if (s->map) munmap(s->map, s->bytes);
    free(s->chunk);
    free(s);
}

static const reducer_ops shm_ops = {.weights = shm_weights, .grads = shm_grads, .reduce = shm_reduce,
                                    .apply = shm_apply, .export_state = shm_export, .destroy = shm_destroy};

static int map_state(reduce_shm *s, int fd, int create, errbuf *err)
{
    s->map = mmap(NULL, s->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        return errbuf_set(err, errno, "training state: mmap of %zu bytes: %s", s->bytes, strerror(errno));
    }
    s->h = s->map;
    if (create) {
        s->h->magic = REDUCE_SHM_MAGIC;
        s->h->nranks = s->nranks;
        s->h->numel = s->numel;
    } else if (s->h->magic != REDUCE_SHM_MAGIC || s->h->nranks != s->nranks || s->h->numel != s->numel) {
        return errbuf_set(err, EINVAL, "training state: made for %u ranks and %llu parameters, this job has %u and "
                          "%zu (magic %#x)", s->h->nranks, (unsigned long long)s->h->numel, s->nranks, s->numel,
                          s->h->magic);
    }
    float *base = (float *)((char *)s->map + align64(sizeof(train_header)));
    s->state[0] = base;
    s->state[1] = base + 3 * s->numel;
    s->grads = base + 6 * s->numel;
    return 0;
}

/* Drafter 0 at the run's first start: a memfd with the state of `step`, deposited with dflashd. */
static int make_state(reduce_shm *s, worker_ctx *w, uint64_t step, errbuf *err)
{
    int fd = memfd_create("dflash-train-state", MFD_CLOEXEC);
    if (fd < 0) return errbuf_set(err, errno, "training state: memfd_create: %s", strerror(errno));
    int rc = 0;
    if (ftruncate(fd, (off_t)s->bytes) != 0)
        rc = errbuf_set(err, errno, "training state: %zu bytes: %s", s->bytes, strerror(errno));
    if (!rc) rc = map_state(s, fd, 1, err);
    if (!rc) rc = train_init_state(&w->plan, step, state_of(s, step), err);
    if (!rc) {
        double t0 = now_seconds();
        rc = keeper_deposit_memory(w->plan.keeper_socket, KEEPER_DEPOSIT_TRAIN_STATE, w->index, w->epoch, fd, NULL,
                                   s->bytes, 30.0, err);
        if (!rc) log_info("made and deposited the training state of step %llu: %zu bytes (%.2f s)",
                          (unsigned long long)step, s->bytes, now_seconds() - t0);
    }
    close(fd);
    return rc;
}

int reduce_shm_open(reducer **out, worker_ctx *w, const drafter_layout *L, uint64_t step, errbuf *err)
{
    reduce_shm *s = xcalloc(1, sizeof *s);
    s->base.ops = &shm_ops;
    s->L = L;
    s->rank = (uint32_t)w->index;
    s->nranks = (uint32_t)w->plan.cfg.workers.drafters;
    s->numel = L->numel;
    s->lo = s->numel * s->rank / s->nranks;
    s->hi = s->numel * (s->rank + 1) / s->nranks;
    s->bytes = reduce_shm_bytes(s->numel, s->nranks);
    s->chunk = xmalloc(sizeof(float) * CHUNK);
    int rc;
    if (w->train_fd >= 0) rc = map_state(s, w->train_fd, 0, err);
    else if (w->index == 0) rc = make_state(s, w, step, err);
    else rc = errbuf_set(err, EPROTO, "drafter-%d registered without a training state", w->index);
    if (rc) {
        shm_destroy(&s->base);
        return rc;
    }
    *out = &s->base;
    return 0;
}
