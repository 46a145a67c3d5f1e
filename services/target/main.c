/* dflash-target: runs the frozen target forward over packed token batches and writes the tapped layers straight
 * into a hidden-state slot of its pool (plus a copy of the batch's tokens, so the drafter needs nothing else), then
 * publishes the slot. A pool slot is claimed before a token batch is leased, so a target never holds a batch while
 * it waits for room; batches already committed (re-deliveries after a crash) are dropped. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <systemd/sd-daemon.h>

#include "log.h"
#include "slot_pool.h"
#include "target_model.h"
#include "token_ring.h"
#include "worker.h"

/* Lease the next token batch, feeding the heartbeat; -1 when the job finished first. */
static int lease_batch(worker_ctx *w, struct token_ring *ring, uint16_t owner)
{
    while (!worker_job_finished(w)) {
        worker_tick(w);
        int i = token_ring_lease(ring, owner, w->epoch, 200);
        if (i >= 0) return i;
    }
    return -1;
}

static int claim_slot(worker_ctx *w, struct slot_pool *pool, uint16_t owner)
{
    while (!worker_job_finished(w)) {
        worker_tick(w);
        int i = slot_pool_claim(pool, owner, w->epoch, 200);
        if (i >= 0) return i;
    }
    return -1;
}

int main(int argc, char **argv)
{
    worker_ctx w;
    int done;
    int rc = worker_start(&w, JOB_ROLE_TARGET, argc, argv,
                          "Runs the frozen target forward and publishes tapped hidden states.", &done);
    if (rc || done) return rc;
    const job_plan *p = &w.plan;
    const uint16_t owner = (uint16_t)(1 + w.index);
    errbuf err = {{0}};
    char pool_name[128];
    job_plan_pool_name(p, w.index, pool_name, sizeof pool_name);
    struct slot_pool *pool = NULL;
    struct token_ring *ring = NULL;
    target_model *tm = NULL;
    int deepest = 0;
    for (int i = 0; i < p->ntaps; i++)
        if (p->drafter.taps[i] > deepest) deepest = p->drafter.taps[i];
    if (w.nfds != 1 || slot_pool_attach(pool_name, w.fds[0], &pool, &err) ||
        token_ring_open(p->ring_name, &p->ring, &ring, &err) ||
        target_model_load(&tm, p->cfg.target.model, deepest, &err)) {
        log_error("%s", w.nfds != 1 ? "keeper passed no pool fd" : err.msg);
        return 1;
    }
    if (slot_pool_slot_bytes(pool) < p->slot.bytes) {
        log_error("%s: slots of %llu bytes, %zu needed", pool_name, (unsigned long long)slot_pool_slot_bytes(pool),
                  p->slot.bytes);
        return 1;
    }
    log_info("target %s loaded up to layer %d; taps %d", p->cfg.target.model, deepest, p->ntaps);
    worker_ready(&w, "running");
    const uint64_t D = (uint64_t)p->cfg.workers.drafters;
    while (!worker_job_finished(&w)) {
        if (worker_restart_requested(&w)) {
            log_info("restart requested by dflashd");
            return JOB_EXIT_RESTART;
        }
        int s = claim_slot(&w, pool, owner);
        if (s < 0) break;
        int t = lease_batch(&w, ring, owner);
        if (t < 0) {
            slot_pool_abandon(pool, s, owner, w.epoch);
            break;
        }
        struct token_batch b = token_ring_batch(ring, t);
        uint64_t id = b.meta->batch_id;
        if (job_state_batch_held(&w.js, id, (uint32_t)D)) { /* paused (beyond the step in flight) or drained */
            token_ring_unlease(ring, t, owner, w.epoch);
            slot_pool_abandon(pool, s, owner, w.epoch);
            uint32_t seen = atomic_load(&w.js.h->gen);
            job_state_wait(&w.js, seen, 200);
            continue;
        }
        if (id < atomic_load(&w.js.h->committed_step) * D) { /* re-delivered after a crash, already trained */
            log_info("batch %llu already committed: dropped", (unsigned long long)id);
            token_ring_release(ring, t, owner, w.epoch);
            slot_pool_abandon(pool, s, owner, w.epoch);
            continue;
        }
        char *slot = slot_pool_data(pool, s);
        int T = (int)b.meta->ntok, S = (int)b.meta->nseq;
        int32_t *ids = (int32_t *)(slot + p->slot.input_ids), *pos = (int32_t *)(slot + p->slot.positions);
        int32_t *cu = (int32_t *)(slot + p->slot.cu_seqlens);
        memcpy(ids, b.input_ids, sizeof(int32_t) * (size_t)T);
        memcpy(cu, b.cu_seqlens, sizeof(int32_t) * (size_t)(S + 1));
        memcpy(slot + p->slot.loss_mask, b.loss_mask, (size_t)T);
        for (int q = 0; q < S; q++)
            for (int i = cu[q]; i < cu[q + 1]; i++) pos[i] = i - cu[q];
        target_batch tb = {.ntok = T, .nseq = S, .input_ids = ids, .positions = pos, .cu_seqlens = cu};
        if ((rc = target_model_forward(tm, &tb, p->drafter.taps, p->ntaps, (float *)(slot + p->slot.aux), NULL, NULL,
                                       &err))) {
            log_error("batch %llu: %s", (unsigned long long)id, err.msg);
            return 1;
        }
        struct slot_pool_desc *d = slot_pool_desc(pool, s);
        d->batch_id = id;
        d->ntok = (uint32_t)T;
        d->nseq = (uint32_t)S;
        d->bytes_used = p->slot.bytes;
        if ((rc = slot_pool_publish(pool, s, owner, w.epoch)) != 0) {
            log_error("publish of batch %llu: %s (slot reclaimed?)", (unsigned long long)id, strerror(-rc));
            return 1;
        }
        token_ring_release(ring, t, owner, w.epoch);
        worker_count_batch(&w, (uint64_t)T);
        log_debug("batch %llu: %d tokens published in slot %d", (unsigned long long)id, T, s);
    }
    log_info("job finished");
    target_model_destroy(&tm);
    token_ring_destroy(&ring);
    slot_pool_destroy(&pool);
    worker_stop(&w);
    return 0;
}
