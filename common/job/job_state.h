/* job_state: the keeper's shared segment of one job (its name comes from job_plan), created by dflashd and mapped
 * by every worker. Control words and records only: the epoch counter, the worker table (pid, epoch, heartbeat), the
 * per-rank progress words of the step protocol (common/train/step.c), the descriptors of the training state that the
 * drafters' reducer deposited with dflashd (the state itself lives in the reducer's memory, common/train/reducer.h),
 * and the per-step records from which dflashd appends the ledger. All cross-process fields are atomics; a step is
 * committed by one CAS of committed_step. Errors: 0 / -errno with an errbuf naming the segment. */
#ifndef DFLASH_JOB_STATE_H
#define DFLASH_JOB_STATE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "job_config.h"
#include "step_plan.h"
#include "shm.h"
#include "util.h"

#define JOB_MAX_TARGETS 64      /* workers.targets at most (the config table's bound) */
#define JOB_MAX_DRAFTERS 64     /* workers.drafters at most */
#define JOB_MAX_WORKERS (1 + JOB_MAX_TARGETS + JOB_MAX_DRAFTERS + 7) /* prefetch + targets + drafters + eval + spare */
#define JOB_RECORD_RING 256     /* step records kept for the ledger writer; drafters wait when it lags */
#define JOB_RUN_ID_MAX 64

enum job_role { JOB_ROLE_NONE = 0, JOB_ROLE_PREFETCH, JOB_ROLE_TARGET, JOB_ROLE_DRAFTER, JOB_ROLE_EVAL };
/* Every role, in the order the worker table, the status and `dflash run` list them: the training pipeline's three,
 * then the evaluation worker (eval.prompts set), which no step waits for. */
#define JOB_NROLES 4
extern const enum job_role job_roles[JOB_NROLES];

#define JOB_CTL_TOKEN_BYTES 16

typedef struct job_worker {
    _Atomic uint32_t role;      /* enum job_role; 0 = empty entry */
    int32_t index;
    _Atomic int32_t pid;        /* 0 when not running */
    _Atomic uint64_t epoch;     /* epoch of the current instance */
    _Atomic uint64_t heartbeat_ns; /* CLOCK_MONOTONIC ns of the last heartbeat */
    _Atomic uint64_t starts;    /* instances started */
    _Atomic uint64_t batches, tokens; /* work done, all instances */
    _Atomic uint32_t ready;     /* the current instance finished its start-up (sent READY=1) */
    _Atomic uint32_t restart_requested; /* set by dflashd: finish the unit in hand, then exit JOB_EXIT_RESTART */
    _Atomic uint64_t started_ns;        /* CLOCK_MONOTONIC ns when the current instance registered */
    uint8_t ctl_token[JOB_CTL_TOKEN_BYTES]; /* random, per registration: the current instance's proof on the control
                                             * socket (its routing id is "<name>/<hex token>"); dflashd only */
} job_worker;

/* Exit status of a worker that stops because dflashd asked for its restart: non-zero, so that systemd's
 * Restart=on-failure and `dflash run` both start it again. */
#define JOB_EXIT_RESTART 75
/* Exit status of a process that stops for a reason no restart cures (a target whose outputs are not finite, a job
 * ended by train.max_skipped_in_a_row): `dflash run` gives up on the job with the last error line of its log, and
 * the systemd units do not restart it (RestartPreventExitStatus). */
#define JOB_EXIT_FATAL 76

/* What rank r reported for step k (slot k % JOB_RECORD_RING). */
typedef struct job_rank_record {
    uint64_t step_plus1;        /* k+1 when valid */
    uint64_t batch_id, tokens;
    double loss_sum, weight_sum, accept_sum;
    double lr;                  /* the learning rate the step is applied with */
    double grad_norm;           /* global gradient norm before clipping (the same on every rank) */
    uint32_t skipped;           /* enum step_skip: the step was not applied (weights unchanged) and why */
    uint64_t nblocks, slot_total, slot_correct;
    uint32_t per_slot_total[DFLASH_MAX_BLOCK], per_slot_correct[DFLASH_MAX_BLOCK]; /* by slot k = 1..B-1 */
} job_rank_record;

/* A restart operation of the control plane (dflashctl restart / rolling-restart): workers first .. first+count-1 of
 * a role, one at a time. It lives here, not in dflashd's memory, so that a restarted dflashd carries it on. Only
 * dflashd reads or writes it. Times are CLOCK_MONOTONIC. */
typedef struct job_restart_op {
    uint32_t active, role;      /* role: enum job_role */
    int32_t first, count, cur, done;
    int32_t requested;          /* the current worker has been asked to restart */
    uint64_t old_epoch;         /* its epoch when asked */
    uint64_t healthy_ns;        /* since when its new instance has been ready and current (0: not yet) */
    uint64_t id;                /* request id of the dflashctl request that started it */
    double deadline;            /* now_seconds() by which the current worker must be back */
    char error[256];            /* why it stopped, when it failed */
} job_restart_op;

/* What a step's record says when it was not applied. */
enum step_skip { STEP_APPLIED = 0, STEP_SKIPPED_LOSS_NOT_FINITE, STEP_SKIPPED_NORM_NOT_FINITE };
const char *step_skip_reason(uint32_t skip);

/* The training state a drafter rank's reducer deposited with dflashd (its fd is in dflashd's fd store as
 * "train-<i>"): host memory (a memfd) or GPU memory (a VMM allocation on the GPU with this UUID). Written by dflashd
 * when it accepts the deposit; read by the reducer to re-import it. */
typedef struct job_train_state {
    _Atomic uint32_t deposited;
    uint32_t gpu;
    uint64_t bytes;
    uint8_t device_uuid[16];
} job_train_state;

/* A checkpoint (or a ledger line) that cannot be written for a reason a restart cannot cure (full disk, read-only or
 * forbidden run_dir): drafter rank 0 holds the job at the committed step and retries (dflashd retries the ledger);
 * dflashd reports it. One writer each: msg before err (release), so that a reader that sees err != 0 reads the
 * message of that failure. */
typedef struct job_write_block {
    _Atomic uint32_t err;       /* errno of the failing write; 0: the checkpoints are being written */
    _Atomic uint32_t abandoned; /* drained while failing: the job ended without the checkpoint of `step` */
    _Atomic uint64_t step;      /* the checkpoint that cannot be written */
    _Atomic uint64_t attempts;
    char msg[448];
} job_write_block;

/* The evaluation worker's last result (dflash-eval writes, after its line is in eval.jsonl; one writer): a seqlock
 * (seq odd while written) over the figures; dflashd reads it for metrics.jsonl, TensorBoard and the status. */
typedef struct job_eval {
    _Atomic uint64_t seq;
    _Atomic uint64_t done;          /* the last step evaluated + 1 (0: none yet) */
    _Atomic uint64_t reported;      /* dflashd: the last step written to metrics.jsonl + 1 */
    _Atomic uint32_t ended;         /* the evaluation worker has nothing left to do (it exits 0) */
    uint64_t step;
    uint32_t prompts, block_size;
    double tau, speedup, seconds;
    double per_slot[DFLASH_MAX_BLOCK]; /* slots 1..block_size-1 at [1..] */
} job_eval;

typedef struct job_state_header {
    char run_id[JOB_RUN_ID_MAX];
    _Atomic uint64_t next_epoch;
    _Atomic uint64_t committed_step;   /* steps applied */
    _Atomic uint64_t ledger_frontier;  /* steps written to the ledger by dflashd */
    _Atomic uint32_t finished;         /* set once the final checkpoint is written */
    _Atomic uint32_t gen;              /* futex generation: bumped on every protocol change */
    _Atomic uint32_t paused;           /* set by dflashd: no worker starts new work (a step in flight finishes) */
    _Atomic uint64_t stop_step;        /* drain: train up to this step, checkpoint, finish (0: no drain) */
    uint32_t ndrafters, nworkers;
    uint64_t numel;                    /* drafter parameters */
    step_plan plan;                    /* which batches make each step: set by dflashd before any worker starts
                                        * (from ckpt/run.json on a resume), then read only */
    uint64_t total_steps;
    _Atomic uint64_t grad_step[JOB_MAX_DRAFTERS], reduce_step[JOB_MAX_DRAFTERS], apply_step[JOB_MAX_DRAFTERS];
    _Atomic uint64_t skipped_steps;    /* steps not applied (non-finite loss or gradient norm) */
    job_train_state train_state[JOB_MAX_DRAFTERS];
    job_train_state target_weights[JOB_MAX_TARGETS]; /* the same record for the device weights a cuda target
                                        * deposited (fd store "weights-<i>"; a new deposit replaces it) */
    job_worker workers[JOB_MAX_WORKERS];
    job_restart_op restart_op;
    job_write_block write_block;       /* the checkpoints (written by drafter rank 0) */
    job_write_block ledger_block;      /* the ledger (written by dflashd) */
    char end_reason[448];              /* why the job ends early, a cause no restart cures (train.max_skipped_in_a_row):
                                        * written by drafter rank 0 before it lowers stop_step; dflashd reports it
                                        * when the job is finished and exits JOB_EXIT_FATAL */
    job_eval eval;                     /* the evaluation worker's last result */
    job_rank_record records[JOB_RECORD_RING][JOB_MAX_DRAFTERS];
} job_state_header;

typedef struct job_state {
    struct shm_segment seg;
    job_state_header *h;
} job_state;

/* Create the segment `name` (job_plan's state_name; fails with -EEXIST); the caller sets committed_step. */
int job_state_create(job_state *js, const char *name, const char *run_id, uint32_t ndrafters, uint64_t numel,
                     uint64_t total_steps, errbuf *err);
/* Open the existing segment `name` (job_plan's state_name); checks numel and ndrafters when non-zero. */
int job_state_open(job_state *js, const char *name, uint32_t ndrafters, uint64_t numel, errbuf *err);
void job_state_close(job_state *js);
/* How many workers of a role the job has (prefetch: 1): the one rule every process counts them by. */
int job_role_workers(const job_config *cfg, enum job_role role);
/* Worker table entry of (role, index) (fixed slots: prefetch 0, targets 1.., drafters after). */
job_worker *job_state_worker(job_state *js, enum job_role role, int index);
/* Heartbeat of a worker entry: now. */
void job_worker_heartbeat(job_worker *w);
uint64_t job_now_ns(void);
/* Wake everybody waiting on the state's generation counter; wait for a change (bounded slice). */
void job_state_wake(job_state *js);
void job_state_wait(job_state *js, uint32_t seen, int timeout_ms);
const char *job_role_name(enum job_role role);
/* Publish an evaluation result (the evaluation worker); read the last one consistently (0, or -EAGAIN: none yet). */
void job_eval_publish(job_state *js, const job_eval *r);
int job_eval_read(const job_state *js, job_eval *out);
/* Whether errno e is a write failure that no restart cures (ENOSPC, EDQUOT, EROFS, EACCES, EPERM): the job holds. */
int job_write_error_persistent(int e);
/* Steps this run trains: total_steps, or the drain's stop step when one is set. */
uint64_t job_state_last_step(const job_state *js);
/* While paused, only the step in flight (committed_step) may proceed: whether batch_id (D batches per step) must
 * wait. */
int job_state_batch_held(const job_state *js, uint64_t batch_id);

#endif
