/* worker: what every worker process does the same way: parse the common command line (-c CONFIG, --set, --index,
 * --help), derive the job plan, register with dflashd (epoch + pool fds), map the job state, and keep its
 * heartbeat in the worker table and the service manager's watchdog fed (WATCHDOG=1 when WATCHDOG_USEC is set).
 * Liveness does not depend on how long a step takes: a liveness thread feeds both every period while the process
 * makes progress (common/base/progress.h: the main thread's ticks and its computations bump the counter), and stops
 * as soon as the main thread is stuck, so that the watchdog or dflashd kills a hung worker, never a busy one.
 * One worker_ctx per process, used from its main thread (the liveness thread reads only entry and watchdog_usec). */
#ifndef DFLASH_WORKER_H
#define DFLASH_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "job_plan.h"
#include "job_state.h"
#include "keeper_proto.h"

struct ctl_client;

typedef struct worker_ctx {
    job_plan plan;
    job_state js;
    enum job_role role;
    int index;
    uint64_t epoch;
    job_worker *entry;
    int fds[KEEPER_MAX_FDS]; /* pool data fds from the keeper (targets: their pool at [0]; drafters: pool i at [i]) */
    int nfds;
    int train_fd;          /* drafters: the training state deposited with dflashd (-1: none yet, rank 0 makes it) */
    int train_index;       /* whose training state train_fd is (common/job/keeper_proto.h) */
    int weights_fd;        /* cuda targets: their device weights deposited with dflashd (-1: none yet) */
    uint64_t watchdog_usec;
    double liveness_period;        /* seconds between two signs of life (a quarter of the tighter timeout) */
    pthread_t liveness;
    int liveness_on;
    _Atomic int liveness_stop;
    char name[32];         /* "target-1" */
    struct ctl_client *ctl; /* control-plane connection to dflashd (common/ctl_client.h) */
} worker_ctx;

/* Parse argv, load the plan, register and map the job state. Returns 0, or the exit status to use (after printing
 * the reason): 0 for --help (with *done set), 2 for usage errors, 1 otherwise. */
int worker_start(worker_ctx *w, enum job_role role, int argc, char **argv, const char *what, int *done);
/* The main thread is alive (a progress bump) and the control connection is served (cheap; call from every loop and
 * wait). */
void worker_tick(worker_ctx *w);
/* Hold while dflashd has paused the job (feeding the heartbeat). */
void worker_hold_while_paused(worker_ctx *w);
/* The same, but also stop holding as soon as release(ctx) says so (re-checked at every wake-up). */
void worker_hold_while_paused_unless(worker_ctx *w, int (*release)(void *ctx), void *ctx);
/* Whether dflashd asked this worker to restart (it then finishes what it holds and exits JOB_EXIT_RESTART). */
int worker_restart_requested(const worker_ctx *w);
/* Mark the worker ready in the worker table and tell the service manager (READY=1 + STATUS). */
void worker_ready(worker_ctx *w, const char *status);
/* Whether the job is finished (every worker then exits 0). */
int worker_job_finished(const worker_ctx *w);
/* Count work done in the worker table (status display). */
void worker_count_batch(worker_ctx *w, uint64_t tokens);
void worker_stop(worker_ctx *w);

#endif
