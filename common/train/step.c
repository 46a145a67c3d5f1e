#include "step.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include "checkpoint.h"
#include "log.h"
#include "optim.h"
#include "step_metrics.h"
#include "step_plan.h"

static void tick(step_ctx *s)
{
    if (s->w) worker_tick(s->w);
}

static int finished(step_ctx *s)
{
    return s->w ? worker_job_finished(s->w) : (int)atomic_load(&s->js->h->finished);
}

/* Wait until every rank's progress word for step k reads k+1. 0, or 1 when the step was committed meanwhile (or
 * the job finished), so the caller goes back to the top. */
static int wait_all(step_ctx *s, _Atomic uint64_t *progress, uint64_t k)
{
    for (;;) {
        tick(s);
        uint32_t seen = atomic_load(&s->js->h->gen);
        if (atomic_load(&s->js->h->committed_step) != k || finished(s)) return 1;
        /* gradients of a step past the last one (a drain lowered it to the committed step: a rank gave up its lease)
         * never all come in: back to the top, where rank 0 checkpoints. Once they are all in, the step completes. */
        if (progress == s->js->h->grad_step && k >= job_state_last_step(s->js)) {
            int all_in = 1;
            for (int i = 0; i < s->nranks && all_in; i++) all_in = atomic_load(&progress[i]) == k + 1;
            if (!all_in) return 1;
        }
        int all = 1;
        for (int i = 0; i < s->nranks && all; i++) all = atomic_load(&progress[i]) == k + 1;
        if (all) return 0;
        job_state_wait(s->js, seen, 200);
    }
}

static void publish(step_ctx *s, _Atomic uint64_t *progress, uint64_t k)
{
    atomic_store(&progress[s->rank], k + 1);
    job_state_wake(s->js);
}

/* Test-only fault hook: with DFLASH_FAULT_HANG_BATCH=<batch id>, the rank whose step trains that batch hangs after
 * its forward and backward, for real: the main thread blocks and makes no progress (common/base/progress.h), so
 * the liveness thread stops its signs of life and the watchdog or dflashd must kill it, every instance again. */
static void fault_hang(uint64_t batch)
{
    const char *f = getenv("DFLASH_FAULT_HANG_BATCH");
    if (!f || !*f || strtoull(f, NULL, 10) != batch) return;
    log_warn("fault hook DFLASH_FAULT_HANG_BATCH=%s: the step of batch %llu hangs", f, (unsigned long long)batch);
    for (;;) pause();
}

/* Phase 1: gradients of this rank's batch of step k, and its record. */
static int phase_gradients(step_ctx *s, uint64_t k, errbuf *err)
{
    job_state_header *h = s->js->h;
    /* the ledger writer must have consumed the record slot we are about to overwrite */
    while (atomic_load(&h->ledger_frontier) + JOB_RECORD_RING <= k) {
        tick(s);
        uint32_t seen = atomic_load(&h->gen);
        if (atomic_load(&h->committed_step) != k || finished(s)) return 1;
        job_state_wait(s->js, seen, 200);
    }
    const uint64_t b = step_plan_batch(&s->js->h->plan, k, (uint32_t)s->rank);
    drafter_batch batch;
    int rc = s->src->ops->lease(s->src, b, k, &batch, err);
    if (rc) return rc;
    drafter_metrics mt;
    float *grads = s->red->ops->grads(s->red, k);
    if ((rc = s->model->ops->forward_backward(s->model, s->red->ops->weights(s->red, k), grads, &batch, &mt, err)))
        return rc;
    fault_hang(b);
    job_rank_record *rec = &h->records[k % JOB_RECORD_RING][s->rank];
    *rec = (job_rank_record){.step_plus1 = k + 1, .batch_id = b, .tokens = (uint64_t)batch.ntok,
                             .loss_sum = mt.loss_sum, .weight_sum = mt.weight_sum, .accept_sum = mt.accept_sum,
                             .nblocks = (uint64_t)mt.nblocks};
    for (int i = 1; i < DRAFTER_MAX_BLOCK; i++) {
        rec->slot_total += (uint64_t)mt.slot_total[i];
        rec->slot_correct += (uint64_t)mt.slot_correct[i];
        rec->per_slot_total[i] = (uint32_t)mt.slot_total[i];
        rec->per_slot_correct[i] = (uint32_t)mt.slot_correct[i];
    }
    publish(s, h->grad_step, k);
    if (s->w) worker_count_batch(s->w, (uint64_t)batch.ntok);
    return 0;
}

/* Σ over ranks of the step's loss weights (rank order). */
static double step_weight_sum(step_ctx *s, uint64_t k, double *loss_sum)
{
    const job_rank_record *rec = s->js->h->records[k % JOB_RECORD_RING];
    double w = 0, l = 0;
    for (int i = 0; i < s->nranks; i++) {
        w += rec[i].weight_sum;
        l += rec[i].loss_sum;
    }
    if (loss_sum) *loss_sum = l;
    return w;
}

/* Phase 3: norm, clip, AdamW (or the NaN guard's skip) on this rank's share; the record gets the outcome. */
static void phase_apply(step_ctx *s, uint64_t k)
{
    optim_config oc;
    optim_config_from_job(&oc, &s->plan->cfg);
    double loss_sum;
    const double W = step_weight_sum(s, k, &loss_sum);
    const int loss_ok = isfinite(loss_sum);
    adamw_params ap = optim_adamw_params(&oc, k);
    int applied = 0;
    double norm = s->red->ops->apply(s->red, k, W, &ap, oc.clip, loss_ok, &applied);
    job_rank_record *rec = &s->js->h->records[k % JOB_RECORD_RING][s->rank];
    rec->grad_norm = norm;
    rec->lr = ap.lr;
    rec->skipped = applied ? STEP_APPLIED : !loss_ok ? STEP_SKIPPED_LOSS_NOT_FINITE : STEP_SKIPPED_NORM_NOT_FINITE;
    if (!applied && s->rank == 0)
        log_warn("step %llu not applied: %s (weights unchanged)", (unsigned long long)k,
                 step_skip_reason(rec->skipped));
    publish(s, s->js->h->apply_step, k);
}

static int stop_here(step_ctx *s, uint64_t k, enum step_phase ph)
{
    return s->after_phase && s->after_phase(s->after_phase_ctx, k, ph);
}

int step_run_one(step_ctx *s, uint64_t k, errbuf *err)
{
    job_state_header *h = s->js->h;
    int rc;
    if (atomic_load(&h->grad_step[s->rank]) != k + 1 && (rc = phase_gradients(s, k, err))) return rc;
    if (stop_here(s, k, STEP_PHASE_GRADIENTS)) return -EINTR;
    if (wait_all(s, h->grad_step, k)) return 1;
    if (atomic_load(&h->reduce_step[s->rank]) != k + 1) {
        s->red->ops->reduce(s->red, k, step_weight_sum(s, k, NULL));
        publish(s, h->reduce_step, k);
    }
    if (stop_here(s, k, STEP_PHASE_REDUCE)) return -EINTR;
    if (wait_all(s, h->reduce_step, k)) return 1;
    if (atomic_load(&h->apply_step[s->rank]) != k + 1) phase_apply(s, k);
    if (stop_here(s, k, STEP_PHASE_APPLY)) return -EINTR;
    if (wait_all(s, h->apply_step, k)) return 1;
    uint64_t expect = k;
    if (atomic_compare_exchange_strong(&h->committed_step, &expect, k + 1)) {
        if (h->records[k % JOB_RECORD_RING][0].skipped) atomic_fetch_add(&h->skipped_steps, 1);
        job_state_wake(s->js);
    }
    s->src->ops->release(s->src);
    if (stop_here(s, k, STEP_PHASE_COMMIT)) return -EINTR;
    return 0;
}

/* Export state c and write it as checkpoint c under root. 0 or -errno with err. */
static int checkpoint_try(step_ctx *s, const char *root, uint64_t c, errbuf *err)
{
    const job_config *cfg = &s->plan->cfg;
    checkpoint_state st = {.step = c, .batches_committed = step_plan_first_batch(&s->js->h->plan, c),
                           .seed = cfg->job.seed};
    optim_state host;
    int rc = s->red->ops->export_state(s->red, c, &host, err);
    if (!rc) rc = checkpoint_write(root, &s->plan->drafter, host.w, host.m, host.v, s->plan->numel, &st, err);
    return rc;
}

/* A checkpoint that failed for a reason no restart cures (job_write_error_persistent): hold the job at step c (the
 * peers wait for rank 0 in step c+1), say why in the job state (dflashd reports it) and on the progress line, and
 * retry every train.checkpoint_retry_sec. 0 once written (or the job ended meanwhile), 1 when the operator drained
 * the job: it then ends at step c without that checkpoint (write_block.abandoned), -errno for another error. */
static int checkpoint_hold(step_ctx *s, const char *root, uint64_t c, int rc, errbuf *err)
{
    job_state_header *h = s->js->h;
    job_write_block *b = &h->write_block;
    const double every = s->plan->cfg.train.checkpoint_retry_sec;
    snprintf(b->msg, sizeof b->msg, "%.*s", (int)sizeof b->msg - 1, err->msg);
    atomic_store(&b->step, c);
    atomic_store(&b->attempts, 1);
    atomic_store(&b->abandoned, 0);
    atomic_store_explicit(&b->err, (uint32_t)-rc, memory_order_release);
    job_state_wake(s->js);
    log_error("checkpoint of step %llu: %s: the job holds at step %llu (nothing is lost) and retries every %g s "
              "until it can write, or until drained",
              (unsigned long long)c, err->msg, (unsigned long long)c, every);
    sd_notifyf(0, "STATUS=holding at step %llu: checkpoint cannot be written (%s), retrying every %g s",
               (unsigned long long)c, strerror(-rc), every);
    for (;;) {
        double until = now_seconds() + every;
        while (now_seconds() < until && !finished(s) && !atomic_load(&h->stop_step)) {
            tick(s);
            uint32_t seen = atomic_load(&h->gen);
            job_state_wait(s->js, seen, 200);
        }
        if (finished(s)) break;
        errbuf e2 = {{0}};
        rc = checkpoint_try(s, root, c, &e2);
        atomic_fetch_add(&b->attempts, 1);
        if (!rc) {
            log_info("checkpoint: %s/step-%08llu written after %llu attempts: the job goes on", root,
                     (unsigned long long)c, (unsigned long long)atomic_load(&b->attempts));
            break;
        }
        if (!job_write_error_persistent(-rc)) {
            *err = e2;
            atomic_store(&b->err, 0);
            return rc;
        }
        if (atomic_load(&h->stop_step)) { /* drained: train no further, end without this checkpoint */
            atomic_store(&h->stop_step, c);
            atomic_store(&b->abandoned, 1);
            job_state_wake(s->js);
            log_error("drained while the checkpoint of step %llu cannot be written (%s): the job ends at step %llu "
                      "without it; --resume starts from the last checkpoint written and repeats the steps after it",
                      (unsigned long long)c, e2.msg, (unsigned long long)c);
            return 1;
        }
    }
    atomic_store(&b->err, 0);
    job_state_wake(s->js);
    return 0;
}

/* After checkpoint c: remove the ones beyond train.keep_checkpoints / keep_every (checkpoint_prune), and say once
 * per process how much disk the checkpoints take. A failed prune is said and the job goes on (nothing of the
 * training depends on it; the next checkpoint tries again). */
static void retain_checkpoints(step_ctx *s, const char *root, uint64_t c)
{
    const job_config *cfg = &s->plan->cfg;
    checkpoint_retention keep = {.keep_checkpoints = cfg->train.keep_checkpoints, .keep_every = cfg->train.keep_every};
    checkpoint_disk disk;
    errbuf err = {{0}};
    if (checkpoint_prune(root, &keep, c, &disk, &err)) {
        log_warn("checkpoint retention after step %llu: %s", (unsigned long long)c, err.msg);
        return;
    }
    if (disk.busy)
        log_info("checkpoint retention: %d checkpoint(s) beyond train.keep_checkpoints are being read: removed later",
                 disk.busy);
    if (s->disk_said) return;
    s->disk_said = 1;
    const double mib = (double)disk.bytes / (1024.0 * 1024.0);
    if (keep.keep_checkpoints > 0)
        log_info("checkpoints: %d kept, %.1f MiB on disk (%.1f MiB each); train.keep_checkpoints = %d%s removes older ones",
                 disk.kept, mib, disk.kept ? mib / disk.kept : 0.0, keep.keep_checkpoints,
                 keep.keep_every > 0 ? " except every keep_every-th step's" : "");
    else
        log_info("checkpoints: %d on disk, %.1f MiB (%.1f MiB each), all kept: train.keep_checkpoints = N keeps "
                 "the newest N", disk.kept, mib, disk.kept ? mib / disk.kept : 0.0);
}

/* Rank 0 writes the checkpoints of committed steps (its peers cannot get past step c+1's reduction meanwhile, so
 * state c stays put while it is written). */
static int maybe_checkpoint(step_ctx *s, uint64_t c)
{
    const job_config *cfg = &s->plan->cfg;
    if (s->rank != 0 || c == 0) return 0;
    job_write_block *b = &s->js->h->write_block;
    if (atomic_load(&b->abandoned) && atomic_load(&b->step) == c) return 0; /* drained without it (checkpoint_hold) */
    /* c can pass the last step when a drain lowered it while step c-1 was being applied */
    if (!(c >= job_state_last_step(s->js) || (cfg->train.checkpoint_every > 0 && c % (uint64_t)cfg->train.checkpoint_every == 0)))
        return 0;
    char root[4096];
    job_config_path(cfg, "ckpt", root, sizeof root);
    if (checkpoint_exists(root, c)) return 0;
    /* a checkpoint promises that the ledger holds every step before it: wait for dflashd's ledger writer */
    while (atomic_load(&s->js->h->ledger_frontier) < c) {
        tick(s);
        uint32_t seen = atomic_load(&s->js->h->gen);
        job_state_wait(s->js, seen, 200);
    }
    errbuf err = {{0}};
    double t0 = now_seconds();
    int rc = checkpoint_try(s, root, c, &err);
    if (rc && job_write_error_persistent(-rc)) {
        rc = checkpoint_hold(s, root, c, rc, &err);
        if (rc >= 0) return 0;
    }
    if (rc) {
        log_error("checkpoint of step %llu: %s", (unsigned long long)c, err.msg);
        return rc;
    }
    log_info("checkpoint: %s/step-%08llu (%.2f s)", root, (unsigned long long)c, now_seconds() - t0);
    retain_checkpoints(s, root, c);
    return 0;
}

void step_format_eta(double sec, char *out, size_t n)
{
    long t = sec > 0 && sec < 1e9 ? lround(sec) : 0;
    if (t < 3600) snprintf(out, n, "%ld:%02ld", t / 60, t % 60);
    else if (t < 86400) snprintf(out, n, "%ldh%02ldm", t / 3600, t % 3600 / 60);
    else snprintf(out, n, "%ldd%02ldh", t / 86400, t % 86400 / 3600);
}

/* The progress line of committed step k (the STATUS= that `dflash run` shows). Rate and ETA need two steps seen by
 * this instance: until then (after a start or a restart) they read "-", never a made-up 0. */
static void report_progress(step_ctx *s, uint64_t k)
{
    step_summary sm;
    step_metrics_sum(&sm, s->js->h->records[k % JOB_RECORD_RING], (uint32_t)s->nranks, k);
    if (s->steps_seen++ == 0) {
        s->t_start = now_seconds();
        s->first_step = k;
    } else {
        s->tokens_seen += sm.tokens;
    }
    double el = now_seconds() - s->t_start, steps_done = (double)(k - s->first_step);
    char eta_text[32] = "-", tps_text[32] = "-";
    if (steps_done > 0 && el > 0) {
        step_format_eta(el / steps_done * (double)((uint64_t)s->plan->cfg.train.steps - k - 1), eta_text,
                        sizeof eta_text);
        snprintf(tps_text, sizeof tps_text, "%.0f", (double)s->tokens_seen / el);
    }
    /* the ETA first: a terminal line is cut at its width (80 columns with the "drafter-0: " prefix) */
    sd_notifyf(0, "STATUS=step %llu/%d  ETA %s  loss %.4f  slot acc %.3f  accept %.3f  %s tok/s",
               (unsigned long long)(k + 1), s->plan->cfg.train.steps, eta_text, sm.loss, sm.slot_accuracy,
               sm.acceptance, tps_text);
}

/* The last progress line, once the job ends at committed step c: how it ended, without an ETA. */
static void report_end(step_ctx *s, uint64_t c)
{
    const int drained = c < (uint64_t)s->plan->cfg.train.steps;
    if (c == 0 || s->js->h->records[(c - 1) % JOB_RECORD_RING][0].step_plus1 != c) { /* no step's record here */
        sd_notifyf(0, "STATUS=%s at step %llu/%d", drained ? "drained" : "finished", (unsigned long long)c,
                   s->plan->cfg.train.steps);
        return;
    }
    step_summary sm;
    step_metrics_sum(&sm, s->js->h->records[(c - 1) % JOB_RECORD_RING], (uint32_t)s->nranks, c - 1);
    sd_notifyf(0, "STATUS=%s at step %llu/%d  loss %.4f  slot acc %.3f  accept %.3f", drained ? "drained" : "finished",
               (unsigned long long)c, s->plan->cfg.train.steps, sm.loss, sm.slot_accuracy, sm.acceptance);
}

/* train.max_skipped_in_a_row = N: when the N steps before k were all not applied (this instance's records; a resume
 * counts afresh), rank 0 writes why into the job state and ends the job at step k: a drain, so k is checkpointed and
 * the job finishes; dflashd then reports the reason and exits JOB_EXIT_FATAL. 1 when it did. */
static int skip_limit(step_ctx *s, uint64_t k)
{
    job_state_header *h = s->js->h;
    const int N = s->plan->cfg.train.max_skipped_in_a_row;
    if (s->rank != 0 || N <= 0 || k < (uint64_t)N || h->end_reason[0]) return 0;
    for (uint64_t j = k - (uint64_t)N; j < k; j++) {
        const job_rank_record *rec = &h->records[j % JOB_RECORD_RING][0];
        if (rec->step_plus1 != j + 1 || !rec->skipped) return 0;
    }
    snprintf(h->end_reason, sizeof h->end_reason,
             "train.max_skipped_in_a_row = %d: steps %llu to %llu were all not applied (the last: %s): the drafter's "
             "loss or gradients are not finite (NaN in drafter.init's weights, too high a train.lr, bad data?); the "
             "job ends at step %llu", N, (unsigned long long)(k - (uint64_t)N), (unsigned long long)(k - 1),
             step_skip_reason(h->records[(k - 1) % JOB_RECORD_RING][0].skipped), (unsigned long long)k);
    log_error("%s", h->end_reason);
    uint64_t stop = atomic_load(&h->stop_step);
    if (!stop || stop > k) atomic_store(&h->stop_step, k); /* after end_reason: whoever sees the drain sees why */
    job_state_wake(s->js);
    return 1;
}

/* Whether any rank has started the step after the committed one: then every rank must take part in it. */
static int step_started(void *ctx)
{
    step_ctx *s = ctx;
    job_state_header *h = s->js->h;
    uint64_t k = atomic_load(&h->committed_step);
    for (int i = 0; i < s->nranks; i++)
        if (atomic_load(&h->grad_step[i]) == k + 1) return 1;
    return 0;
}

int step_train(step_ctx *s)
{
    job_state_header *h = s->js->h;
    s->reported = atomic_load(&h->committed_step);
    while (!finished(s)) {
        tick(s);
        /* between steps: a pause lets the step in flight finish; a step any rank started runs to its end first */
        if (s->w) worker_hold_while_paused_unless(s->w, step_started, s);
        if (s->w && worker_restart_requested(s->w)) {
            log_info("restart requested by dflashd");
            s->src->ops->release(s->src);
            return JOB_EXIT_RESTART;
        }
        uint64_t k = atomic_load(&h->committed_step);
        if (s->rank == 0 && k > s->reported) { /* whoever committed it, rank 0 reports each step once */
            if (s->reported + 1 == k || s->steps_seen == 0) report_progress(s, k - 1);
            s->reported = k;
        }
        skip_limit(s, k); /* before the checkpoint below: it ends the job at k */
        uint64_t held = s->src->ops->held(s->src);
        if (held != UINT64_MAX && held < step_plan_first_batch(&s->js->h->plan, k)) s->src->ops->release(s->src);
        if (maybe_checkpoint(s, k)) return 1;
        if (k >= job_state_last_step(s->js)) { /* after the checkpoint: a drain while it could not write ends here */
            if (s->rank == 0) {
                report_end(s, k);
                atomic_store(&h->finished, 1);
                job_state_wake(s->js);
            } else {
                uint32_t seen = atomic_load(&h->gen);
                job_state_wait(s->js, seen, 200);
            }
            continue;
        }
        errbuf err = {{0}};
        int rc = step_run_one(s, k, &err);
        if (rc < 0) {
            log_error("step %llu: %s", (unsigned long long)k, err.msg);
            return 1;
        }
    }
    s->src->ops->release(s->src);
    return 0;
}

void batch_source_destroy(batch_source **s)
{
    if (*s) (*s)->ops->destroy(*s);
    *s = NULL;
}
