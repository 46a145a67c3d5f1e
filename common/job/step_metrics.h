/* step_metrics: the one owner of summing what the drafter ranks report for a step (their job_rank_record) into the
 * step's figures: tokens, weighted loss, slot accuracy (overall and per slot), simulated acceptance length,
 * gradient norm, learning rate and whether the step was skipped. The ledger, the status screen and the drafters'
 * progress line all read a step through it. Pure functions. */
#ifndef DFLASH_STEP_METRICS_H
#define DFLASH_STEP_METRICS_H

#include <stdint.h>

#include "job_state.h"

typedef struct step_summary {
    uint32_t nranks;            /* records of this step found */
    uint64_t tokens, nblocks, slot_total, slot_correct;
    double loss_sum, weight_sum, accept_sum;
    double loss;                /* Σ w·CE / Σ w */
    double slot_accuracy;       /* correct / total over slots 1..B-1 */
    double acceptance;          /* mean simulated acceptance length per block */
    double grad_norm, lr;       /* from rank 0's record */
    uint32_t skipped;           /* enum step_skip (any rank's) */
    uint64_t per_slot_total[DFLASH_MAX_BLOCK], per_slot_correct[DFLASH_MAX_BLOCK];
} step_summary;

/* Sum the records rec[0..nranks) of step k; records of another step are left out (s->nranks counts the others). */
void step_metrics_sum(step_summary *s, const job_rank_record *rec, uint32_t nranks, uint64_t step);
/* Accuracy of slot i (NaN-free: 0 when no slot i was trained). */
double step_metrics_slot_accuracy(const step_summary *s, int slot);

#endif
