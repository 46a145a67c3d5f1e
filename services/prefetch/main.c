/* dflash-prefetch: reads the job's token shards (mmap) and writes packed batches into the token ring in batch-id
 * order; batch b's content is a pure function of (data, seed, b) (batch_plan), so a restarted prefetch simply
 * continues at the ring's next id. A full ring blocks it. Exits 0 when the job is finished. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "batch_plan.h"
#include "log.h"
#include "run_record.h"
#include "shard.h"
#include "slot_state.h"
#include "step_plan.h"
#include "token_ring.h"
#include "worker.h"

/* After a restart: a batch published by our predecessor just before it died may not have advanced the id yet. */
static void skip_published(struct token_ring *ring)
{
    struct token_ring_geometry g = token_ring_geometry_get(ring);
    for (int again = 1; again;) {
        again = 0;
        uint64_t next = token_ring_next_id_peek(ring);
        for (uint32_t i = 0; i < g.nslots; i++) {
            uint64_t w = token_ring_slot_word(ring, (int)i);
            enum slot_state st = slot_word_state(w);
            if ((st == SLOT_STATE_READY || st == SLOT_STATE_LEASED) && token_ring_batch(ring, (int)i).meta->batch_id == next) {
                token_ring_next_id_advance(ring, next);
                again = 1;
                break;
            }
        }
    }
}

/* A shard truncated under its mapping faults when read (SIGBUS): name it and exit 1 (the restart then refuses it)
 * rather than die of a signal that says nothing. Only async-signal-safe calls. */
static const dataset *mapped;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    const char *path = dataset_shard_at(mapped, si->si_addr);
    static const char a[] = "prefetch: ERROR ", b[] = ": the shard was truncated under the running prefetcher (SIGBUS "
                                                      "reading it): the data set changed under the job\n";
    if (write(STDERR_FILENO, a, sizeof a - 1) < 0 || write(STDERR_FILENO, path ? path : "a shard",
                                                          strlen(path ? path : "a shard")) < 0 ||
        write(STDERR_FILENO, b, sizeof b - 1) < 0) {
    }
    (void)sig;
    _exit(1);
}

/* The data set is the one the job started with (<run_dir>/ckpt/run.json, written by dflashd): a shard replaced,
 * rewritten, added or removed between two starts of the prefetcher is refused, naming it. */
static int data_check_recorded(const job_plan *p, const dataset *ds, errbuf *err)
{
    char path[4096];
    run_record_path(p, path, sizeof path);
    run_record was, now;
    int rc = run_record_read(&was, path, err);
    if (rc == -ENOENT) return 0; /* a dflashd that records none (or a run from before records) */
    if (rc) return rc;
    run_record_compute(&now, p, ds);
    rc = run_record_check_data(&was, &now, path, "prefetch", err);
    run_record_free(&was);
    run_record_free(&now);
    return rc;
}

/* Test-only fault hook: with DFLASH_FAULT_HOLD_BATCH=<batch id>, that batch and the ones after it are not produced
 * (the prefetcher waits, alive), so a test knows the job stops at a known step (tests/system/give_up.sh). */
static uint64_t fault_hold_batch(void)
{
    const char *f = getenv("DFLASH_FAULT_HOLD_BATCH");
    return f && *f ? strtoull(f, NULL, 10) : UINT64_MAX;
}

int main(int argc, char **argv)
{
    worker_ctx w;
    int done;
    int rc = worker_start(&w, JOB_ROLE_PREFETCH, argc, argv,
                          "Packs token batches from the job's shards into the token ring.", &done);
    if (rc || done) return rc;
    const job_plan *p = &w.plan;
    errbuf err = {{0}};
    dataset *ds = NULL;
    struct token_ring *ring = NULL;
    if (dataset_open(&ds, p->cfg.data.path, &err) || dataset_check_vocab(ds, (uint32_t)p->vocab, &err) ||
        data_check_recorded(p, ds, &err) || token_ring_open(p->ring_name, &p->ring, &ring, &err)) {
        log_error("%s", err.msg);
        return 1;
    }
    mapped = ds;
    struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
    if (dataset_count(ds) == 0) {
        log_error("%s: no samples", p->cfg.data.path);
        return 1;
    }
    batch_plan *bp = batch_plan_new(ds, (uint64_t)p->cfg.job.seed, p->ring.max_tokens, p->ring.max_seqs);
    const step_plan *plan = &w.js.h->plan;
    const uint64_t total = step_plan_first_batch(plan, (uint64_t)p->cfg.train.steps);
    const uint16_t owner = 0;
    const uint64_t hold = fault_hold_batch();
    skip_published(ring);
    log_info("%llu samples in %zu shards; epoch 0 has %llu batches; producing from batch %llu",
             (unsigned long long)dataset_count(ds), dataset_nshards(ds),
             (unsigned long long)batch_plan_epoch_batches(bp, 0), (unsigned long long)token_ring_next_id_peek(ring));
    uint64_t over = 0, longest = 0; /* batch_plan cuts a sample longer than a batch to its first max_tokens */
    for (uint64_t i = 0; i < dataset_count(ds); i++) {
        uint64_t len = 0;
        dataset_sample(ds, i, NULL, NULL, &len);
        over += len > p->ring.max_tokens;
        longest = len > longest ? len : longest;
    }
    if (over)
        log_warn("%llu of %llu samples are longer than data.max_batch_tokens = %u (the longest: %llu tokens): "
                 "training sees only their first %u tokens",
                 (unsigned long long)over, (unsigned long long)dataset_count(ds), p->ring.max_tokens,
                 (unsigned long long)longest, p->ring.max_tokens);
    worker_ready(&w, "producing");
    while (!worker_job_finished(&w)) {
        worker_tick(&w);
        if (worker_restart_requested(&w)) {
            log_info("restart requested by dflashd");
            return JOB_EXIT_RESTART;
        }
        /* a shard that changed under the mapping (replaced, overwritten in place, truncated, removed): batches from
         * it would not be the job's; say which and exit (the restart compares the data set with the job's record) */
        if (dataset_check_unchanged(ds, &err)) {
            log_error("%s: the data set changed under the running prefetcher", err.msg);
            return 1;
        }
        uint64_t id = token_ring_next_id_peek(ring);
        uint64_t committed = step_plan_first_batch(plan, atomic_load(&w.js.h->committed_step));
        if (id < committed) { /* already trained (e.g. after a resume): no need to produce it */
            token_ring_next_id_advance(ring, id);
            continue;
        }
        if (id >= total || id >= hold || job_state_batch_held(&w.js, id)) {
            uint32_t seen = atomic_load(&w.js.h->gen);
            job_state_wait(&w.js, seen, 200);
            continue;
        }
        int slot = token_ring_claim(ring, owner, w.epoch, 200);
        if (slot == -ETIMEDOUT) continue;
        if (slot < 0) {
            log_error("token ring claim: %s", strerror(-slot));
            return 1;
        }
        struct token_batch b = token_ring_batch(ring, slot);
        uint64_t epoch;
        batch_plan_fill(bp, id, &b, &epoch);
        if (dataset_check_unchanged(ds, &err)) { /* while the batch was filled: it is not published */
            log_error("%s: the data set changed under the running prefetcher (batch %llu not published)", err.msg,
                      (unsigned long long)id);
            return 1;
        }
        if ((rc = token_ring_publish(ring, slot, owner, w.epoch)) != 0) {
            log_error("token ring publish of batch %llu: %s", (unsigned long long)id, strerror(-rc));
            return 1;
        }
        token_ring_next_id_advance(ring, id);
        worker_count_batch(&w, b.meta->ntok);
        log_debug("batch %llu (epoch %llu): %u sequences, %u tokens", (unsigned long long)id,
                  (unsigned long long)epoch, b.meta->nseq, b.meta->ntok);
    }
    log_info("job finished");
    batch_plan_free(&bp);
    token_ring_destroy(&ring);
    dataset_close(&ds);
    worker_stop(&w);
    return 0;
}
