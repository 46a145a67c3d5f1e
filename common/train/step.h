/* step: the data-parallel step protocol of drafter training, with no backend code in it. Step k, on every rank r
 * of D (progress words in the job state; every phase may be redone by a restarted rank with the same result):
 *   1. lease batch step_plan_batch(plan, k, r) from the batch source, forward + backward with the model backend
 *      against the reducer's weights of step k into the reducer's gradient buffer, publish the rank's record
 *      (tokens, loss, accuracy, weight sum);                                            (grad_step[r] = k+1)
 *   2. when all gradients are in: reducer->reduce with the summed weight of the step;   (reduce_step[r] = k+1)
 *   3. when all shares are reduced: reducer->apply (global norm, clip, AdamW into state k+1, or a skipped step
 *      when the loss or the norm is not finite — the NaN guard); the record gets the norm, lr and skip reason;
 *                                                                                        (apply_step[r] = k+1)
 *   4. when all ranks applied: CAS committed_step k -> k+1 (whoever comes first), release the batch.
 * Rank 0 reports progress and writes checkpoints of committed steps; the loop holds while the job is paused,
 * exits for a restart dflashd asked for, and ends when the job is finished. One step_ctx per rank (thread). */
#ifndef DFLASH_STEP_H
#define DFLASH_STEP_H

#include <stdint.h>

#include "drafter.h"
#include "job_plan.h"
#include "job_state.h"
#include "reducer.h"
#include "worker.h"

/* Where a rank's batches come from. */
typedef struct batch_source batch_source;
typedef struct batch_source_ops {
    /* Lease batch b (of step k): 0 with *batch filled; 1 when the step was committed meanwhile or the job finished
     * (the caller goes back to the top); -errno with err when the batch cannot be read (a malformed slot). */
    int (*lease)(batch_source *s, uint64_t b, uint64_t k, drafter_batch *batch, errbuf *err);
    /* Release the batch held, if any (after its step is committed, or to give it up). */
    void (*release)(batch_source *s);
    /* The batch id held, or UINT64_MAX. */
    uint64_t (*held)(batch_source *s);
    void (*destroy)(batch_source *s);
} batch_source_ops;
struct batch_source {
    const batch_source_ops *ops;
};

/* How a batch source reaches the pools' data: host pools are mapped and read in place (acc NULL); GPU pools are
 * imported by the CUDA build (batch_source_pools_cuda.c), the tokens copied to the host. */
struct slot_pool;
typedef struct pool_access {
    int (*attach)(void *ctx, int i, const char *name, int fd, struct slot_pool **pool, errbuf *err);
    /* batch (id, ntok, nseq set) of the leased slot: aux in the backend's memory, tokens on the host */
    int (*fill)(void *ctx, const job_plan *p, struct slot_pool *pool, int i, int slot, drafter_batch *batch,
                errbuf *err);
    void (*destroy)(void *ctx);
    void *ctx;
} pool_access;

/* The hidden-state pools of a job (dflashd passed their fds at registration), leased by batch id; re-delivered
 * batches of committed steps are dropped; a slot whose shape does not fit the job's layout is an error. */
int batch_source_pools_create(batch_source **out, worker_ctx *w, const pool_access *acc, errbuf *err);
void batch_source_destroy(batch_source **s);

/* Phases, for tests that stop a rank between them. */
enum step_phase { STEP_PHASE_GRADIENTS = 1, STEP_PHASE_REDUCE, STEP_PHASE_APPLY, STEP_PHASE_COMMIT };

typedef struct step_ctx {
    const job_plan *plan;
    job_state *js;
    worker_ctx *w;             /* heartbeat, pause and restart requests, job end (NULL in tests) */
    drafter_backend *model;
    reducer *red;
    batch_source *src;
    int rank, nranks;
    /* tests: called after each phase of step k; nonzero makes step_run_one return -EINTR there (a crash) */
    int (*after_phase)(void *ctx, uint64_t k, enum step_phase phase);
    void *after_phase_ctx;
    /* progress line (rank 0) */
    double t_start;
    uint64_t steps_seen, tokens_seen, first_step, reported;
    int disk_said;                  /* the checkpoints' disk use was said (retain_checkpoints) */
} step_ctx;

/* Run (or finish) committed step k's phases on this rank. 0 when step k is committed (by anyone), 1 when the step
 * moved on or the job finished meanwhile, -errno on error, -EINTR when after_phase stopped it. */
int step_run_one(step_ctx *s, uint64_t k, errbuf *err);
/* A time left for the progress line: "4:05" under an hour, "7h21m", "3d04h". */
void step_format_eta(double sec, char *out, size_t n);
/* The rank's training loop until the job is finished: 0, JOB_EXIT_RESTART when dflashd asked for a restart, 1 on
 * error (logged). */
int step_train(step_ctx *s);

#endif
