#include "job_state.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "slot_state.h"
#include "step_plan.h"

#define JOB_STATE_KIND (SHM_KIND_OTHER + 1)

/* Layout after the shm header: the header struct (control words and records only). */
static size_t layout(void) { return SHM_HEADER_BYTES + sizeof(job_state_header); }

int job_state_create(job_state *js, const char *name, const char *run_id, uint32_t ndrafters, uint64_t numel,
                     uint64_t total_steps, errbuf *err)
{
    memset(js, 0, sizeof *js);
    if (ndrafters < 1 || ndrafters > JOB_MAX_DRAFTERS)
        return errbuf_set(err, EINVAL, "%s: %u drafters outside [1, %d]", name, ndrafters, JOB_MAX_DRAFTERS);
    int rc = shm_segment_create(&js->seg, name, JOB_STATE_KIND, layout(), err);
    if (rc) return rc;
    js->h = (job_state_header *)shm_segment_body(&js->seg);
    snprintf(js->h->run_id, sizeof js->h->run_id, "%s", run_id);
    js->h->ndrafters = ndrafters;
    js->h->numel = numel;
    js->h->total_steps = total_steps;
    step_plan_init(&js->h->plan, ndrafters, 0); /* one segment until dflashd publishes the run's plan */
    atomic_store(&js->h->next_epoch, 1);
    return 0;
}

int job_state_open(job_state *js, const char *name, uint32_t ndrafters, uint64_t numel, errbuf *err)
{
    memset(js, 0, sizeof *js);
    int rc = shm_segment_open(&js->seg, name, JOB_STATE_KIND, err);
    if (rc) return rc;
    js->h = (job_state_header *)shm_segment_body(&js->seg);
    if ((ndrafters && js->h->ndrafters != ndrafters) || (numel && js->h->numel != numel) ||
        layout() != js->seg.bytes) {
        rc = errbuf_set(err, EINVAL, "%s: segment made for %u drafters and %llu parameters, expected %u and %llu",
                        name, js->h->ndrafters, (unsigned long long)js->h->numel, ndrafters,
                        (unsigned long long)numel);
        shm_segment_close(&js->seg);
        return rc;
    }
    return 0;
}

void job_state_close(job_state *js)
{
    shm_segment_close(&js->seg);
    js->h = NULL;
}


const enum job_role job_roles[JOB_NROLES] = {JOB_ROLE_PREFETCH, JOB_ROLE_TARGET, JOB_ROLE_DRAFTER, JOB_ROLE_EVAL};

int job_role_workers(const job_config *cfg, enum job_role role)
{
    switch (role) {
    case JOB_ROLE_PREFETCH: return 1;
    case JOB_ROLE_TARGET: return cfg->workers.targets;
    case JOB_ROLE_DRAFTER: return cfg->workers.drafters;
    case JOB_ROLE_EVAL: return cfg->eval.prompts[0] ? 1 : 0;
    default: return 0;
    }
}

job_worker *job_state_worker(job_state *js, enum job_role role, int index)
{
    int slot;
    switch (role) {
    case JOB_ROLE_PREFETCH: slot = 0; break;
    case JOB_ROLE_TARGET: slot = 1 + index; break;
    case JOB_ROLE_DRAFTER: slot = 1 + JOB_MAX_TARGETS + index; break;
    case JOB_ROLE_EVAL: slot = 1 + JOB_MAX_TARGETS + JOB_MAX_DRAFTERS + index; break;
    default: return NULL;
    }
    int max = role == JOB_ROLE_PREFETCH || role == JOB_ROLE_EVAL ? 1
              : role == JOB_ROLE_TARGET                          ? JOB_MAX_TARGETS
                                                                 : JOB_MAX_DRAFTERS;
    if (index < 0 || index >= max || slot >= JOB_MAX_WORKERS) return NULL;
    return &js->h->workers[slot];
}

uint64_t job_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void job_worker_heartbeat(job_worker *w) { atomic_store_explicit(&w->heartbeat_ns, job_now_ns(), memory_order_relaxed); }

void job_state_wake(job_state *js) { slot_gen_wake(&js->h->gen); }

void job_state_wait(job_state *js, uint32_t seen, int timeout_ms) { slot_gen_wait(&js->h->gen, seen, timeout_ms); }

int job_write_error_persistent(int e)
{
    return e == ENOSPC || e == EDQUOT || e == EROFS || e == EACCES || e == EPERM;
}

uint64_t job_state_last_step(const job_state *js)
{
    uint64_t stop = atomic_load(&js->h->stop_step);
    return stop && stop < js->h->total_steps ? stop : js->h->total_steps;
}

int job_state_batch_held(const job_state *js, uint64_t batch_id)
{
    const step_plan *p = &js->h->plan;
    if (batch_id >= step_plan_first_batch(p, job_state_last_step(js))) return 1;
    return atomic_load(&js->h->paused) && batch_id >= step_plan_first_batch(p, atomic_load(&js->h->committed_step) + 1);
}

const char *job_role_name(enum job_role role)
{
    switch (role) {
    case JOB_ROLE_PREFETCH: return "prefetch";
    case JOB_ROLE_TARGET: return "target";
    case JOB_ROLE_DRAFTER: return "drafter";
    case JOB_ROLE_EVAL: return "eval";
    default: return "none";
    }
}

const char *step_skip_reason(uint32_t skip)
{
    switch (skip) {
    case STEP_APPLIED: return "applied";
    case STEP_SKIPPED_LOSS_NOT_FINITE: return "loss not finite";
    case STEP_SKIPPED_NORM_NOT_FINITE: return "gradient norm not finite";
    default: return "unknown";
    }
}

void job_eval_publish(job_state *js, const job_eval *r)
{
    job_eval *e = &js->h->eval;
    uint64_t seq = atomic_load(&e->seq);
    seq += seq & 1; /* odd: a writer died in the middle; its successor writes it whole */
    atomic_store(&e->seq, seq + 1);
    atomic_thread_fence(memory_order_release);
    e->step = r->step;
    e->prompts = r->prompts;
    e->block_size = r->block_size;
    e->tau = r->tau;
    e->speedup = r->speedup;
    e->seconds = r->seconds;
    memcpy(e->per_slot, r->per_slot, sizeof e->per_slot);
    atomic_store(&e->seq, seq + 2);
    atomic_store(&e->done, r->step + 1);
    job_state_wake(js);
}

int job_eval_read(const job_state *js, job_eval *out)
{
    const job_eval *e = &js->h->eval;
    for (int tries = 0; tries < 1000; tries++) {
        uint64_t a = atomic_load(&e->seq);
        if (a == 0) return -EAGAIN;
        if (a & 1) continue;
        out->step = e->step;
        out->prompts = e->prompts;
        out->block_size = e->block_size;
        out->tau = e->tau;
        out->speedup = e->speedup;
        out->seconds = e->seconds;
        memcpy(out->per_slot, e->per_slot, sizeof out->per_slot);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load(&e->seq) == a) {
            out->done = atomic_load(&e->done);
            return 0;
        }
    }
    return -EAGAIN;
}
