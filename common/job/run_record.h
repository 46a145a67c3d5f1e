/* run_record: what a job's batches are a pure function of, recorded when the job starts from scratch, so that a
 * resume (and every start of the prefetcher) refuses what would train batches twice or on other data. Two parts:
 * the step-plan settings (run_record_plan_keys: which batches make a step and what a batch holds) and the data set's
 * identity (per shard: its file name, size and a digest of its 64-byte header, which holds the checksum of the rest).
 * dflashd writes <run_dir>/ckpt/run.json at a start from scratch (beside identity.json, which records the target) and
 * compares at --resume; the prefetcher compares the data at each start. run_record_data_check is what a job checks of
 * its data before anything starts. Errors: 0 / -errno with an errbuf naming the setting or shard, both values and
 * what to do. Single-threaded. */
#ifndef DFLASH_RUN_RECORD_H
#define DFLASH_RUN_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "job_plan.h"
#include "shard.h"
#include "step_plan.h"
#include "util.h"

/* The settings of job_config_table that decide which batches make a step or what a batch holds; NULL-terminated. */
extern const char *const run_record_plan_keys[];

typedef struct run_record_shard {
    char name[256];     /* the file name, without the folder (data.path may move) */
    uint64_t bytes;
    char header_digest[17];
    char path[4096];    /* where it is now (run_record_compute; "" when read from a record): messages name it */
} run_record_shard;

typedef struct run_record {
    int nkeys;
    char values[16][CONFIG_STRING_MAX]; /* run_record_plan_keys[i] = values[i], as config_get formats them */
    size_t nshards;
    run_record_shard *shards;           /* xmalloc'd */
    char data_path[CONFIG_STRING_MAX];  /* data.path (run_record_compute), for messages */
    step_plan plan;                     /* which batches make each step: one segment per number of drafters the run
                                         * has had (a resume onto another number appends one, run_record_resume) */
} run_record;

/* This job's record: the settings of p, the identity of ds (the data set at p->cfg.data.path). */
void run_record_compute(run_record *r, const job_plan *p, const dataset *ds);
void run_record_free(run_record *r);
/* <run_dir>/ckpt/run.json */
void run_record_path(const job_plan *p, char *out, size_t n);
int run_record_write(const run_record *r, const char *path, errbuf *err);
/* Read path into *r: -ENOENT when there is none. */
int run_record_read(run_record *r, const char *path, errbuf *err);
/* 0 when the settings of `now` keep the step plan of `was`; -EINVAL naming the first setting that differs, both
 * values and what may change on a resume. */
int run_record_check_settings(const run_record *was, const run_record *now, const char *path, errbuf *err);
/* A resume of the run recorded in `was` from checkpoint step `step` (its trainer_state's batches_committed) with
 * the drafters and targets of `now`: now->plan becomes was's plan cut at `step` plus, when the number of drafters or
 * targets changed, a segment from `step` (1 returned: a reshard; 0: none). -EINVAL naming the record when the
 * checkpoint's frontier disagrees with the recorded plan, -E2BIG when the plan has no room for another segment. */
int run_record_resume(const run_record *was, run_record *now, uint64_t step, uint64_t batches_committed,
                      const char *path, errbuf *err);
/* 0 when `now` holds the data set of `was`; -EINVAL naming the first shard added, missing or changed. `who` starts
 * the message ("--resume", "prefetch"). */
int run_record_check_data(const run_record *was, const run_record *now, const char *path, const char *who,
                          errbuf *err);
/* What a job checks of its data at start: some sample (its first data.max_batch_tokens tokens: what a batch keeps)
 * has a trained token, every id is below the target's vocabulary. -EINVAL or -ERANGE naming the shard, sample and id;
 * 0 otherwise, with *cut the samples longer than a batch (training sees their first data.max_batch_tokens tokens) and
 * *longest the longest sample. */
int run_record_data_check(const job_plan *p, const dataset *ds, uint64_t *cut, uint64_t *longest, errbuf *err);

#endif
