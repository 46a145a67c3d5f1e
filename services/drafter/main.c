/* dflash-drafter: one data-parallel rank of drafter training on the CPU backend. The model state (fp32 weights and
 * AdamW moments) lives once, in the job state segment, double-buffered by step parity. Step k, on every rank r:
 *   1. lease batch k*D + r from whichever pool holds it, forward + backward against state[k % 2], publish the
 *      gradients in grads[r] and the step record;                                     (grad_step[r] = k+1)
 *   2. when all gradients are in: reduce this rank's parameter range in rank order, divided by the summed loss
 *      weights, and its share of the squared norm;                                    (reduce_step[r] = k+1)
 *   3. when all ranges are reduced: the global norm, clip, AdamW on this rank's range from state[k % 2] into
 *      state[(k+1) % 2];                                                               (apply_step[r] = k+1)
 *   4. when all ranges are applied: CAS committed_step k -> k+1 (whoever comes first), release the batch.
 * Every phase reads only what no one writes during step k, so a rank killed anywhere redoes its phase from the
 * progress words and the result is bitwise the same: the batches of step k are fixed by (seed, k), reductions run
 * in a fixed order, and the step is committed exactly once. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include "anchors.h"
#include "checkpoint.h"
#include "drafter_model.h"
#include "log.h"
#include "slot_pool.h"
#include "target_model.h"
#include "worker.h"

typedef struct drafter_rank {
    worker_ctx w;
    job_plan *p;
    job_state *js;
    struct slot_pool *pools[64];
    int npools;
    drafter_model *dm;
    drafter_frozen fz;
    uint16_t owner;
    int rank, nranks;
    size_t lo, hi;                 /* this rank's parameter range */
    int held_pool, held_slot;      /* the batch leased for the current step, -1 when none */
    uint64_t held_batch;
    uint64_t dropped;
    double t_start;
    uint64_t steps_seen, tokens_seen, first_step, reported;
} drafter_rank;

static void nap_ms(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* Wait until every rank's progress word for this step reads k+1. Returns 0, or 1 when the step was committed
 * meanwhile (or the job finished), so the caller goes back to the top. */
static int wait_all(drafter_rank *d, _Atomic uint64_t *progress, uint64_t k)
{
    for (;;) {
        worker_tick(&d->w);
        uint32_t seen = atomic_load(&d->js->h->gen);
        if (atomic_load(&d->js->h->committed_step) != k || worker_job_finished(&d->w)) return 1;
        int all = 1;
        for (int i = 0; i < d->nranks && all; i++) all = atomic_load(&progress[i]) == k + 1;
        if (all) return 0;
        job_state_wait(d->js, seen, 200);
    }
}

/* Drop READY slots whose batch was already committed (re-deliveries after crashes). */
static void drop_stale(drafter_rank *d, uint64_t frontier)
{
    for (int i = 0; i < d->npools; i++) {
        uint64_t ids[64];
        int n = slot_pool_find_ready(d->pools[i], ids, 64);
        for (int j = 0; j < n && j < 64; j++) {
            if (ids[j] >= frontier) continue;
            int s = slot_pool_lease_batch(d->pools[i], ids[j], d->owner, d->w.epoch, 0);
            if (s >= 0) {
                slot_pool_release(d->pools[i], s, d->owner, d->w.epoch);
                d->dropped++;
                log_info("batch %llu re-delivered after it was committed: dropped", (unsigned long long)ids[j]);
            }
        }
    }
}

/* Lease the slot holding batch b from any pool. Returns 0, or 1 when the step moved on / the job finished. */
static int lease_batch(drafter_rank *d, uint64_t b, uint64_t k)
{
    for (int spins = 0;; spins++) {
        worker_tick(&d->w);
        if (atomic_load(&d->js->h->committed_step) != k || worker_job_finished(&d->w)) return 1;
        for (int i = 0; i < d->npools; i++) {
            int s = slot_pool_lease_batch(d->pools[i], b, d->owner, d->w.epoch, 0);
            if (s >= 0) {
                d->held_pool = i;
                d->held_slot = s;
                d->held_batch = b;
                return 0;
            }
        }
        if (spins % 16 == 0) drop_stale(d, k * (uint64_t)d->nranks);
        nap_ms(2);
    }
}

static void release_held(drafter_rank *d)
{
    if (d->held_slot < 0) return;
    slot_pool_release(d->pools[d->held_pool], d->held_slot, d->owner, d->w.epoch);
    d->held_slot = -1;
}

/* Phase 1: gradients of batch k*D + r into grads[r], and this rank's step record. */
static int compute_gradients(drafter_rank *d, uint64_t k)
{
    const job_plan *p = d->p;
    job_state_header *h = d->js->h;
    /* the ledger writer must have consumed the record slot we are about to overwrite */
    while (atomic_load(&h->ledger_frontier) + JOB_RECORD_RING <= k) {
        worker_tick(&d->w);
        uint32_t seen = atomic_load(&h->gen);
        job_state_wait(d->js, seen, 200);
    }
    uint64_t b = k * (uint64_t)d->nranks + (uint64_t)d->rank;
    if (d->held_slot < 0 || d->held_batch != b) {
        release_held(d);
        if (lease_batch(d, b, k)) return 1;
    }
    char *slot = slot_pool_data(d->pools[d->held_pool], d->held_slot);
    const struct slot_pool_desc *desc = slot_pool_desc(d->pools[d->held_pool], d->held_slot);
    const int T = (int)desc->ntok, S = (int)desc->nseq;
    const int32_t *ids = (const int32_t *)(slot + p->slot.input_ids), *pos = (const int32_t *)(slot + p->slot.positions);
    const int32_t *cu = (const int32_t *)(slot + p->slot.cu_seqlens);
    const uint8_t *lm = (const uint8_t *)(slot + p->slot.loss_mask);
    int32_t *anchors = NULL, *anchor_seq = NULL;
    int N = anchors_sample(cu, S, lm, p->cfg.drafter.max_anchors, (uint64_t)p->cfg.job.seed, 0, b, &anchors,
                           &anchor_seq);
    drafter_blocks blk;
    drafter_blocks_build(&blk, ids, cu, lm, anchors, anchor_seq, N, p->drafter.block_size, p->drafter.mask_token_id,
                         p->gamma);
    memcpy(drafter_weights(d->dm), job_state_weights(d->js, k), sizeof(float) * p->numel);
    drafter_grads_zero(d->dm);
    drafter_metrics mt = {0};
    drafter_forward_backward(d->dm, &d->fz, (const float *)(slot + p->slot.aux), T, pos, &blk, 1, 1.0f, &mt, NULL);
    memcpy(d->js->grads + (size_t)d->rank * p->numel, drafter_grads(d->dm), sizeof(float) * p->numel);
    h->wsum[d->rank] = mt.weight_sum;
    job_rank_record *rec = &h->records[k % JOB_RECORD_RING][d->rank];
    *rec = (job_rank_record){.step_plus1 = k + 1, .batch_id = b, .tokens = (uint64_t)T, .loss_sum = mt.loss_sum,
                             .weight_sum = mt.weight_sum, .accept_sum = mt.accept_sum,
                             .lr = lr_schedule((long)k, p->cfg.train.warmup_steps, p->cfg.train.steps, (float)p->cfg.train.lr, (float)p->cfg.train.min_lr), .nblocks = (uint64_t)mt.nblocks};
    for (int s = 1; s < DRAFTER_MAX_BLOCK; s++) {
        rec->slot_total += (uint64_t)mt.slot_total[s];
        rec->slot_correct += (uint64_t)mt.slot_correct[s];
        rec->per_slot_total[s] = (uint32_t)mt.slot_total[s];
        rec->per_slot_correct[s] = (uint32_t)mt.slot_correct[s];
    }
    drafter_blocks_free(&blk);
    free(anchors);
    free(anchor_seq);
    atomic_store(&h->grad_step[d->rank], k + 1);
    job_state_wake(d->js);
    worker_count_batch(&d->w, (uint64_t)T);
    return 0;
}

/* Phase 2: this rank's range of the summed gradient, in rank order, over the summed loss weights. */
static void reduce_range(drafter_rank *d, uint64_t k)
{
    job_state_header *h = d->js->h;
    const size_t numel = d->p->numel;
    double W = 0, sq = 0;
    for (int i = 0; i < d->nranks; i++) W += h->wsum[i];
    const float inv = W > 0 ? (float)(1.0 / W) : 0.0f;
    for (size_t j = d->lo; j < d->hi; j++) {
        float g = 0;
        for (int i = 0; i < d->nranks; i++) g += d->js->grads[(size_t)i * numel + j];
        g *= inv;
        d->js->reduced[j] = g;
        sq += (double)g * g;
    }
    h->sq[d->rank] = sq;
    atomic_store(&h->reduce_step[d->rank], k + 1);
    job_state_wake(d->js);
}

/* Phase 3: clip and AdamW on this rank's range, state[k % 2] -> state[(k+1) % 2]. */
static void apply_range(drafter_rank *d, uint64_t k)
{
    job_state_header *h = d->js->h;
    const job_config *c = &d->p->cfg;
    double sq = 0;
    for (int i = 0; i < d->nranks; i++) sq += h->sq[i];
    double norm = sqrt(sq);
    h->norm_of_step[k % JOB_RECORD_RING] = norm;
    float coef = grad_clip_coef(norm, (float)c->train.clip);
    adamw_params ap = {.lr = lr_schedule((long)k, c->train.warmup_steps, c->train.steps, (float)c->train.lr,
                                         (float)c->train.min_lr),
                       .beta1 = (float)c->train.beta1, .beta2 = (float)c->train.beta2, .eps = (float)c->train.eps,
                       .weight_decay = (float)c->train.weight_decay};
    float *sw = job_state_weights(d->js, k), *sm = job_state_adam_m(d->js, k), *sv = job_state_adam_v(d->js, k);
    float *dw = job_state_weights(d->js, k + 1), *dmv = job_state_adam_m(d->js, k + 1);
    float *dv = job_state_adam_v(d->js, k + 1);
    size_t n = d->hi - d->lo;
    memcpy(dw + d->lo, sw + d->lo, sizeof(float) * n);
    memcpy(dmv + d->lo, sm + d->lo, sizeof(float) * n);
    memcpy(dv + d->lo, sv + d->lo, sizeof(float) * n);
    for (int i = 0; i < drafter_param_count(d->dm); i++) {
        const drafter_param *q = drafter_param_at(d->dm, i);
        size_t a = q->offset > d->lo ? q->offset : d->lo, e = q->offset + q->numel < d->hi ? q->offset + q->numel : d->hi;
        if (a >= e) continue;
        adamw_step_cpu(dw + a, d->js->reduced + a, dmv + a, dv + a, e - a, &ap, (long)k + 1, coef, q->decay);
    }
    atomic_store(&h->apply_step[d->rank], k + 1);
    job_state_wake(d->js);
}

/* Rank 0 writes the checkpoints of committed steps (its peers cannot get past step c+1's reduction meanwhile, so
 * state[c % 2] stays put while it is written). */
static void maybe_checkpoint(drafter_rank *d, uint64_t c)
{
    const job_config *cfg = &d->p->cfg;
    if (d->rank != 0 || c == 0) return;
    if (!(c == job_state_last_step(d->js) || (cfg->train.checkpoint_every > 0 && c % (uint64_t)cfg->train.checkpoint_every == 0)))
        return;
    char root[4096];
    job_config_path(cfg, "ckpt", root, sizeof root);
    if (checkpoint_exists(root, c)) return;
    /* a checkpoint promises that the ledger holds every step before it: wait for dflashd's ledger writer */
    while (atomic_load(&d->js->h->ledger_frontier) < c) {
        worker_tick(&d->w);
        uint32_t seen = atomic_load(&d->js->h->gen);
        job_state_wait(d->js, seen, 200);
    }
    checkpoint_state st = {.step = c, .batches_committed = c * (uint64_t)d->nranks, .seed = cfg->job.seed};
    errbuf err = {{0}};
    double t0 = now_seconds();
    if (checkpoint_write(root, &d->p->drafter, job_state_weights(d->js, c), job_state_adam_m(d->js, c),
                         job_state_adam_v(d->js, c), d->p->numel, &st, &err)) {
        log_error("checkpoint of step %llu: %s", (unsigned long long)c, err.msg);
        exit(1);
    }
    log_info("checkpoint: %s/step-%08llu (%.2f s)", root, (unsigned long long)c, now_seconds() - t0);
}

static void report_progress(drafter_rank *d, uint64_t k)
{
    const job_rank_record *rec = d->js->h->records[k % JOB_RECORD_RING];
    double loss = 0, w = 0, acc = 0, blocks = 0;
    uint64_t tot = 0, cor = 0, tokens = 0;
    for (int i = 0; i < d->nranks; i++) {
        loss += rec[i].loss_sum;
        w += rec[i].weight_sum;
        acc += rec[i].accept_sum;
        blocks += (double)rec[i].nblocks;
        tot += rec[i].slot_total;
        cor += rec[i].slot_correct;
        tokens += rec[i].tokens;
    }
    if (d->steps_seen++ == 0) {
        d->t_start = now_seconds();
        d->first_step = k;
    } else {
        d->tokens_seen += tokens;
    }
    double el = now_seconds() - d->t_start, steps_done = (double)(k - d->first_step);
    double tps = el > 0 ? (double)d->tokens_seen / el : 0, per_step = steps_done > 0 ? el / steps_done : 0;
    double eta = per_step * (double)((uint64_t)d->p->cfg.train.steps - k - 1);
    sd_notifyf(0, "STATUS=step %llu/%d  loss %.4f  slot acc %.3f  accept %.3f  %.0f tok/s  ETA %02d:%02d",
               (unsigned long long)(k + 1), d->p->cfg.train.steps, w > 0 ? loss / w : 0.0,
               tot ? (double)cor / (double)tot : 0.0, blocks > 0 ? acc / blocks : 0.0, tps, (int)(eta / 60),
               (int)fmod(eta, 60.0));
}

/* Whether any rank has started the step after the committed one: then every rank must take part in it. */
static int step_started(void *ctx)
{
    drafter_rank *d = ctx;
    job_state_header *h = d->js->h;
    uint64_t k = atomic_load(&h->committed_step);
    for (int i = 0; i < d->nranks; i++)
        if (atomic_load(&h->grad_step[i]) == k + 1) return 1;
    return 0;
}

/* A pause holds the ranks between steps; a step that any rank has started runs to its end first, also when a peer
 * starts it while this rank already holds (checked at every wake-up, or the two would wait for each other). */
static void hold_while_paused(drafter_rank *d) { worker_hold_while_paused_unless(&d->w, step_started, d); }

int main(int argc, char **argv)
{
    static drafter_rank d;
    int done;
    int rc = worker_start(&d.w, JOB_ROLE_DRAFTER, argc, argv,
                          "Trains the drafter (one data-parallel rank) on published hidden-state slots.", &done);
    if (rc || done) return rc;
    d.p = &d.w.plan;
    d.js = &d.w.js;
    d.rank = d.w.index;
    d.nranks = d.p->cfg.workers.drafters;
    d.owner = (uint16_t)(100 + d.rank);
    d.held_slot = -1;
    errbuf err = {{0}};
    d.npools = d.w.nfds;
    for (int i = 0; i < d.npools; i++) {
        char name[128];
        job_plan_pool_name(d.p, i, name, sizeof name);
        if (slot_pool_attach(name, d.w.fds[i], &d.pools[i], &err)) {
            log_error("%s", err.msg);
            return 1;
        }
    }
    target_model *tm = NULL;
    if (target_model_load(&tm, d.p->cfg.target.model, 0, &err)) {
        log_error("%s", err.msg);
        return 1;
    }
    d.fz = (drafter_frozen){.embed = target_model_embedding(tm), .lm_head = target_model_lm_head(tm),
                            .vocab = d.p->vocab};
    d.dm = drafter_model_create(&d.p->drafter, 0);
    const size_t numel = d.p->numel;
    d.lo = numel * (size_t)d.rank / (size_t)d.nranks;
    d.hi = numel * (size_t)(d.rank + 1) / (size_t)d.nranks;
    job_state_header *h = d.js->h;
    d.reported = atomic_load(&h->committed_step);
    log_info("rank %d of %d: %zu parameters (range %zu..%zu), %d pools; at step %llu", d.rank, d.nranks, numel, d.lo,
             d.hi, d.npools, (unsigned long long)atomic_load(&h->committed_step));
    worker_ready(&d.w, "training");
    while (!worker_job_finished(&d.w)) {
        worker_tick(&d.w);
        hold_while_paused(&d);   /* between steps: a pause lets the step in flight finish */
        if (worker_restart_requested(&d.w)) {
            log_info("restart requested by dflashd");
            release_held(&d);
            return JOB_EXIT_RESTART;
        }
        const uint64_t steps = job_state_last_step(d.js);
        uint64_t k = atomic_load(&h->committed_step);
        if (d.rank == 0 && k > d.reported) { /* whoever committed it, rank 0 reports each step once */
            if (d.reported + 1 == k || d.steps_seen == 0) report_progress(&d, k - 1);
            d.reported = k;
        }
        if (d.held_slot >= 0 && d.held_batch < k * (uint64_t)d.nranks) release_held(&d);
        maybe_checkpoint(&d, k);
        if (k >= steps) {
            if (d.rank == 0) {
                atomic_store(&h->finished, 1);
                job_state_wake(d.js);
            } else {
                uint32_t seen = atomic_load(&h->gen);
                job_state_wait(d.js, seen, 200);
            }
            continue;
        }
        if (atomic_load(&h->grad_step[d.rank]) != k + 1 && compute_gradients(&d, k)) continue;
        if (wait_all(&d, h->grad_step, k)) continue;
        if (atomic_load(&h->reduce_step[d.rank]) != k + 1) reduce_range(&d, k);
        if (wait_all(&d, h->reduce_step, k)) continue;
        if (atomic_load(&h->apply_step[d.rank]) != k + 1) apply_range(&d, k);
        if (wait_all(&d, h->apply_step, k)) continue;
        uint64_t expect = k;
        if (atomic_compare_exchange_strong(&h->committed_step, &expect, k + 1)) job_state_wake(d.js);
        release_held(&d);
    }
    log_info("job finished (%llu re-delivered batches dropped)", (unsigned long long)d.dropped);
    release_held(&d);
    drafter_model_destroy(&d.dm);
    target_model_destroy(&tm);
    for (int i = 0; i < d.npools; i++) slot_pool_destroy(&d.pools[i]);
    worker_stop(&d.w);
    return 0;
}
