/* summary: what `dflash run` prints when a job has finished, read from the job's ledger (<run_dir>/ledger.jsonl):
 * steps and batches committed, throughput, and the simulated acceptance length of the untrained drafter (the
 * first steps) against the trained one (the last steps), with the checkpoint to use. Errors name the ledger file. */
#ifndef DFLASH_RUN_SUMMARY_H
#define DFLASH_RUN_SUMMARY_H

#include <stdio.h>

#include "job_config.h"
#include "util.h"

/* Print the summary of a finished job; seconds is the wall time of the run (0: not shown), which trained the steps
 * from first_step on (a resumed run: the checkpoint's step; throughput counts only those). */
int run_summary_print(const job_config *cfg, double seconds, long long first_step, FILE *out, errbuf *err);
/* The step of <run_dir>/ckpt/latest (where --resume starts), 0 when there is none. */
long long run_summary_resume_step(const job_config *cfg);

#endif
