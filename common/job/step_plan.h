/* step_plan: the one owner of "which batches make optimizer step k". A run's plan is a list of segments: from step
 * s_i on, D_i drafter ranks train batches first_batch_i + (k - s_i)*D_i .. + D_i-1 in step k, rank r taking
 * first_batch_i + (k - s_i)*D_i + r. A run that never changed its number of drafters has one segment {0, 0, D}
 * (batches k*D .. k*D + D-1); a resume onto another number of drafters (or targets) appends one at the resumed step,
 * whose first batch is the checkpoint's frontier, so batch ids stay contiguous and no batch is trained twice or
 * skipped. Batch b's content is a pure function of (data, seed, b). The plan is recorded in ckpt/run.json
 * (run_record) and published in the job state (job_state_header.plan) by dflashd before any worker starts; the
 * prefetch numbers its batches with it, dflashd resumes the token ring and judges what a pause holds with it, and the
 * step protocol leases with it. Pure functions over an immutable plan. */
#ifndef DFLASH_STEP_PLAN_H
#define DFLASH_STEP_PLAN_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#define STEP_PLAN_MAX_SEGMENTS 32

typedef struct step_plan_segment {
    uint64_t from_step, first_batch;
    uint32_t drafters, targets;   /* targets: recorded for the ledger and status (batches do not depend on it) */
} step_plan_segment;

typedef struct step_plan {
    uint32_t n;                   /* segments, from_step strictly increasing, seg[0].from_step == 0 */
    step_plan_segment seg[STEP_PLAN_MAX_SEGMENTS];
} step_plan;

/* A plan of one segment: D drafters (and T targets) from step 0. */
static inline void step_plan_init(step_plan *p, uint32_t drafters, uint32_t targets)
{
    p->n = 1;
    p->seg[0] = (step_plan_segment){.from_step = 0, .first_batch = 0, .drafters = drafters, .targets = targets};
}
/* The segment that holds step k. */
static inline const step_plan_segment *step_plan_segment_of(const step_plan *p, uint64_t step)
{
    uint32_t i = p->n - 1;
    while (i > 0 && p->seg[i].from_step > step) i--;
    return &p->seg[i];
}
/* The first batch of step k (= batches committed when k steps are). */
static inline uint64_t step_plan_first_batch(const step_plan *p, uint64_t step)
{
    const step_plan_segment *s = step_plan_segment_of(p, step);
    return s->first_batch + (step - s->from_step) * (uint64_t)s->drafters;
}
/* The batch rank r trains in step k. */
static inline uint64_t step_plan_batch(const step_plan *p, uint64_t step, uint32_t rank)
{
    return step_plan_first_batch(p, step) + rank;
}
/* The drafter ranks of step k. */
static inline uint32_t step_plan_drafters(const step_plan *p, uint64_t step)
{
    return step_plan_segment_of(p, step)->drafters;
}
/* The step a batch belongs to. */
static inline uint64_t step_plan_step_of(const step_plan *p, uint64_t batch)
{
    uint32_t i = p->n - 1;
    while (i > 0 && p->seg[i].first_batch > batch) i--;
    const step_plan_segment *s = &p->seg[i];
    return s->from_step + (batch - s->first_batch) / s->drafters;
}
/* Steps needed to train every batch below nbatches (a drain's stop step). */
static inline uint64_t step_plan_steps_covering(const step_plan *p, uint64_t nbatches)
{
    if (nbatches == 0) return 0;
    const uint64_t k = step_plan_step_of(p, nbatches - 1);
    return k + 1;
}
/* The reshards of p in words, "" when none: "step 20: drafters 2 -> 3; step 40: drafters 3 -> 1, targets 2 -> 1"
 * (dflashctl status and the summary say it). */
void step_plan_describe(const step_plan *p, char *out, size_t n);
/* From step k on, D drafters and T targets: the segments from k on are dropped (a resume from step k cuts the
 * history after it) and, when D or T differ from the plan's at k, a segment starting at k is appended. 1 when one
 * was appended (a reshard), 0 when the plan already runs D and T at k, -E2BIG when the plan is full. */
static inline int step_plan_resume(step_plan *p, uint64_t step, uint32_t drafters, uint32_t targets)
{
    const uint64_t first = step_plan_first_batch(p, step);
    while (p->n > 1 && p->seg[p->n - 1].from_step >= step) p->n--;
    const step_plan_segment *last = &p->seg[p->n - 1];
    if (last->drafters == drafters && last->targets == targets) return 0;
    if (step == 0) { /* nothing trained yet: not a reshard */
        step_plan_init(p, drafters, targets);
        return 0;
    }
    if (p->n == STEP_PLAN_MAX_SEGMENTS) return -E2BIG;
    p->seg[p->n++] = (step_plan_segment){step, first, drafters, targets};
    return 1;
}

#endif
