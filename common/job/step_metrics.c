#include "step_metrics.h"

#include <string.h>

void step_metrics_sum(step_summary *s, const job_rank_record *rec, uint32_t nranks, uint64_t step)
{
    memset(s, 0, sizeof *s);
    for (uint32_t r = 0; r < nranks; r++) {
        const job_rank_record *x = &rec[r];
        if (x->step_plus1 != step + 1) continue;
        if (s->nranks++ == 0) {
            s->grad_norm = x->grad_norm;
            s->lr = x->lr;
        }
        s->tokens += x->tokens;
        s->loss_sum += x->loss_sum;
        s->weight_sum += x->weight_sum;
        s->accept_sum += x->accept_sum;
        s->nblocks += x->nblocks;
        s->slot_total += x->slot_total;
        s->slot_correct += x->slot_correct;
        if (x->skipped) s->skipped = x->skipped;
        for (int i = 0; i < DFLASH_MAX_BLOCK; i++) {
            s->per_slot_total[i] += x->per_slot_total[i];
            s->per_slot_correct[i] += x->per_slot_correct[i];
        }
    }
    s->loss = s->weight_sum > 0 ? s->loss_sum / s->weight_sum : 0.0;
    s->slot_accuracy = s->slot_total ? (double)s->slot_correct / (double)s->slot_total : 0.0;
    s->acceptance = s->nblocks ? s->accept_sum / (double)s->nblocks : 0.0;
}

double step_metrics_slot_accuracy(const step_summary *s, int slot)
{
    if (slot < 0 || slot >= DFLASH_MAX_BLOCK || !s->per_slot_total[slot]) return 0.0;
    return (double)s->per_slot_correct[slot] / (double)s->per_slot_total[slot];
}
