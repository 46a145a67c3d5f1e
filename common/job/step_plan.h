/* step_plan: the one owner of "which batches make optimizer step k". With D drafter ranks, step k trains batches
 * k*D .. k*D + D-1, rank r taking batch k*D + r; batch b's content is a pure function of (data, seed, b). The
 * prefetch numbers its batches with it, dflashd resumes the token ring and judges what a pause holds with it, and
 * the step protocol leases with it. Pure integer functions. */
#ifndef DFLASH_STEP_PLAN_H
#define DFLASH_STEP_PLAN_H

#include <stdint.h>

/* The batch rank r trains in step k. */
static inline uint64_t step_plan_batch(uint64_t step, uint32_t ndrafters, uint32_t rank)
{
    return step * (uint64_t)ndrafters + (uint64_t)rank;
}
/* The first batch of step k (= batches committed when k steps are). */
static inline uint64_t step_plan_first_batch(uint64_t step, uint32_t ndrafters) { return step * (uint64_t)ndrafters; }
/* Steps needed to train every batch below nbatches (a drain's stop step). */
static inline uint64_t step_plan_steps_covering(uint64_t nbatches, uint32_t ndrafters)
{
    return (nbatches + ndrafters - 1) / ndrafters;
}
/* The step a batch belongs to, and the rank that trains it. */
static inline uint64_t step_plan_step_of(uint64_t batch, uint32_t ndrafters) { return batch / ndrafters; }
static inline uint32_t step_plan_rank_of(uint64_t batch, uint32_t ndrafters) { return (uint32_t)(batch % ndrafters); }

#endif
