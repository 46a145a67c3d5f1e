/* The hidden-state pools as a batch source (common/train/step.h): batch b is leased from whichever pool holds it;
 * READY slots of batches already committed (re-deliveries after crashes) are dropped while waiting. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "slot_pool.h"
#include "step.h"
#include "step_plan.h"

typedef struct pools_source {
    batch_source base;
    pool_access acc;
    worker_ctx *w;
    const job_plan *p;
    struct slot_pool *pools[JOB_MAX_TARGETS];
    int npools;
    uint16_t owner;
    struct slot_pool_shape shape;
    int held_pool, held_slot;      /* the batch leased, -1 when none */
    uint64_t held_batch;
    uint64_t dropped;
} pools_source;

static void nap_ms(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void pools_release(batch_source *bs)
{
    pools_source *s = (pools_source *)bs;
    if (s->held_slot < 0) return;
    slot_pool_release(s->pools[s->held_pool], s->held_slot, s->owner, s->w->epoch);
    s->held_slot = -1;
}

static uint64_t pools_held(batch_source *bs)
{
    pools_source *s = (pools_source *)bs;
    return s->held_slot >= 0 ? s->held_batch : UINT64_MAX;
}

/* Drop READY slots whose batch was already committed (re-deliveries after crashes). */
static void drop_stale(pools_source *s, uint64_t frontier)
{
    for (int i = 0; i < s->npools; i++) {
        uint64_t ids[64];
        int n = slot_pool_find_ready(s->pools[i], ids, 64);
        for (int j = 0; j < n && j < 64; j++) {
            if (ids[j] >= frontier) continue;
            int slot = slot_pool_lease_batch(s->pools[i], ids[j], s->owner, s->w->epoch, 0);
            if (slot >= 0) {
                slot_pool_release(s->pools[i], slot, s->owner, s->w->epoch);
                s->dropped++;
                log_info("batch %llu re-delivered after it was committed: dropped", (unsigned long long)ids[j]);
            }
        }
    }
}

/* Host pools (memfd mapped here): the batch is read in place. */
static int host_attach(void *ctx, int i, const char *name, int fd, struct slot_pool **pool, errbuf *err)
{
    return slot_pool_attach(name, fd, pool, err);
}

static int host_fill(void *ctx, const job_plan *p, struct slot_pool *pool, int i, int slot, drafter_batch *bt,
                     errbuf *err)
{
    const hidden_slot_layout *L = &p->slot;
    char *data = slot_pool_data(pool, slot);
    bt->aux = data + L->aux;
    bt->input_ids = (const int32_t *)(data + L->input_ids);
    bt->positions = (const int32_t *)(data + L->positions);
    bt->cu_seqlens = (const int32_t *)(data + L->cu_seqlens);
    bt->loss_mask = (const uint8_t *)(data + L->loss_mask);
    return 0;
}

static const pool_access host_access = {.attach = host_attach, .fill = host_fill};

static int fill(pools_source *s, drafter_batch *bt, errbuf *err)
{
    const struct slot_pool_desc *desc = slot_pool_desc(s->pools[s->held_pool], s->held_slot);
    *bt = (drafter_batch){.id = s->held_batch, .ntok = (int)desc->ntok, .nseq = (int)desc->nseq};
    return s->acc.fill(s->acc.ctx, s->p, s->pools[s->held_pool], s->held_pool, s->held_slot, bt, err);
}

static int pools_lease(batch_source *bs, uint64_t b, uint64_t k, drafter_batch *bt, errbuf *err)
{
    pools_source *s = (pools_source *)bs;
    job_state *js = &s->w->js;
    if (s->held_slot >= 0 && s->held_batch == b) return fill(s, bt, err);
    pools_release(bs);
    for (int spins = 0;; spins++) {
        worker_tick(s->w);
        /* k past the last step: a drain lowered it to the committed step (dflashd's save_and_end); that step is not
         * trained, and rank 0 goes back to the top to checkpoint */
        if (atomic_load(&js->h->committed_step) != k || worker_job_finished(s->w) || k >= job_state_last_step(js))
            return 1;
        for (int i = 0; i < s->npools; i++) {
            int slot = slot_pool_lease_batch(s->pools[i], b, s->owner, s->w->epoch, 0);
            if (slot < 0) continue;
            s->held_pool = i;
            s->held_slot = slot;
            s->held_batch = b;
            int rc = slot_pool_slot_check(s->pools[i], slot, &s->shape, err);
            return rc ? rc : fill(s, bt, err);
        }
        if (spins % 16 == 0) drop_stale(s, step_plan_first_batch(&js->h->plan, k));
        nap_ms(2);
    }
}

static void pools_destroy(batch_source *bs)
{
    pools_source *s = (pools_source *)bs;
    pools_release(bs);
    if (s->dropped) log_info("%llu re-delivered batches dropped", (unsigned long long)s->dropped);
    for (int i = 0; i < s->npools; i++) slot_pool_destroy(&s->pools[i]);
    if (s->acc.destroy) s->acc.destroy(s->acc.ctx);
    free(s);
}

static const batch_source_ops pools_ops = {.lease = pools_lease, .release = pools_release, .held = pools_held,
                                           .destroy = pools_destroy};

int batch_source_pools_create(batch_source **out, worker_ctx *w, const pool_access *acc, errbuf *err)
{
    pools_source *s = xcalloc(1, sizeof *s);
    s->base.ops = &pools_ops;
    s->acc = acc ? *acc : host_access;
    s->w = w;
    s->p = &w->plan;
    s->owner = (uint16_t)(100 + w->index);
    s->held_slot = -1;
    s->shape = (struct slot_pool_shape){.max_tokens = s->p->ring.max_tokens, .max_seqs = s->p->ring.max_seqs,
                                        .cu_seqlens = s->p->slot.cu_seqlens};
    s->npools = w->nfds;
    for (int i = 0; i < s->npools; i++) {
        char name[128];
        job_plan_pool_name(s->p, i, name, sizeof name);
        int rc = s->acc.attach(s->acc.ctx, i, name, w->fds[i], &s->pools[i], err);
        if (rc) {
            pools_destroy(&s->base);
            return rc;
        }
    }
    *out = &s->base;
    return 0;
}
