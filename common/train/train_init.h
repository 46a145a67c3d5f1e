/* train_init: where the training state of a run starts, the one owner of that choice: at step 0 the drafter of
 * drafter.init (fp32 weights, zero moments) or a fresh one from job.seed; at a later step (a resume: dflashd set
 * committed_step from <run_dir>/ckpt/latest) the checkpoint's master weights and moments, whose step must match. */
#ifndef DFLASH_TRAIN_INIT_H
#define DFLASH_TRAIN_INIT_H

#include <stdint.h>

#include "job_plan.h"
#include "optim.h"
#include "util.h"

/* Fill s (host, numel floats each) with the state of step `step`. */
int train_init_state(const job_plan *p, uint64_t step, optim_state s, errbuf *err);

#endif
