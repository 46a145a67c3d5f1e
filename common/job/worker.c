#include "worker.h"

#include <getopt.h>
#include <signal.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cblas.h>

#include "ctl_client.h"
#include "keeper_proto.h"
#include "log.h"
#include "progress.h"

#define MAX_OVERRIDES 64

static void usage(FILE *f, const char *prog, enum job_role role, const char *what)
{
    fprintf(f, "usage: %s -c CONFIG%s [--set section.key=value]...\n%s\n"
               "  -c, --config FILE   job config (INI; see deploy/demo.ini)\n"
               "%s"
               "  --set KEY=VALUE     override one setting, e.g. --set train.lr=1e-4\n"
               "  -h, --help          this text\n"
               "Registers with dflashd (<run_dir>/keeper.sock) and runs until the job is finished.\n",
            prog, role == JOB_ROLE_PREFETCH ? "" : " --index N", what,
            role == JOB_ROLE_PREFETCH ? "" : "  -i, --index N       which worker of its role this is (0-based)\n");
}

/* The liveness thread: every period, a sign of life (the worker table's heartbeat, which dflashd watches, and
 * WATCHDOG=1) when the progress counter moved since the last one, none otherwise. A step of any length that
 * progresses keeps the worker; a main thread that is stuck (no tick, no computation) is killed by whichever of
 * workers.watchdog_sec and workers.heartbeat_timeout_sec comes first. */
static void *liveness_main(void *arg)
{
    worker_ctx *w = arg;
    uint64_t seen = progress_count() - 1; /* the first round pings: the worker has just registered */
    double next = 0;
    while (!atomic_load(&w->liveness_stop)) {
        double now = now_seconds();
        if (now >= next) {
            next = now + w->liveness_period;
            uint64_t count = progress_count();
            if (count != seen) {
                seen = count;
                job_worker_heartbeat(w->entry);
                if (w->watchdog_usec) sd_notify(0, "WATCHDOG=1");
            }
        }
        struct timespec ts = {0, 20 * 1000 * 1000}; /* short naps: worker_stop joins quickly */
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static int liveness_start(worker_ctx *w)
{
    const job_config *c = &w->plan.cfg;
    double p = c->workers.heartbeat_timeout_sec / 4;
    if (w->watchdog_usec && (double)w->watchdog_usec / 4e6 < p) p = (double)w->watchdog_usec / 4e6;
    w->liveness_period = p < 0.02 ? 0.02 : p > 1.0 ? 1.0 : p;
    atomic_store(&w->liveness_stop, 0);
    int rc = pthread_create(&w->liveness, NULL, liveness_main, w);
    if (rc) {
        log_error("cannot start the liveness thread: %s", strerror(rc));
        return -rc;
    }
    w->liveness_on = 1;
    return 0;
}

static void liveness_stop(worker_ctx *w)
{
    if (!w->liveness_on) return;
    atomic_store(&w->liveness_stop, 1);
    pthread_join(w->liveness, NULL);
    w->liveness_on = 0;
}

int worker_start(worker_ctx *w, enum job_role role, int argc, char **argv, const char *what, int *done)
{
    memset(w, 0, sizeof *w);
    w->train_fd = w->weights_fd = -1;
    *done = 0;
    w->role = role;
    w->index = role == JOB_ROLE_PREFETCH ? 0 : -1;
    const char *config = NULL, *overrides[MAX_OVERRIDES];
    int noverrides = 0, o;
    static const struct option opts[] = {{"config", required_argument, 0, 'c'}, {"index", required_argument, 0, 'i'},
                                         {"set", required_argument, 0, 's'},    {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    while ((o = getopt_long(argc, argv, "c:i:h", opts, NULL)) != -1) {
        switch (o) {
        case 'c': config = optarg; break;
        case 'i': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v < 0 || v > 63) { fprintf(stderr, "%s: --index %s: expected 0..63\n", prog, optarg); return 2; }
            w->index = (int)v;
            break;
        }
        case 's':
            if (noverrides == MAX_OVERRIDES) { fprintf(stderr, "%s: too many --set\n", prog); return 2; }
            if (!config_arg_well_formed(optarg)) {
                fprintf(stderr, "%s: --set \"%s\": expected section.key=value\n", prog, optarg);
                return 2;
            }
            overrides[noverrides++] = optarg;
            break;
        case 'h': usage(stdout, prog, role, what); *done = 1; return 0;
        default: usage(stderr, prog, role, what); return 2;
        }
    }
    if (!config || w->index < 0 || optind != argc) {
        usage(stderr, prog, role, what);
        return 2;
    }
    snprintf(w->name, sizeof w->name, "%s-%d", job_role_name(role), w->index);
    log_init(role == JOB_ROLE_PREFETCH ? "prefetch" : w->name, LOG_LEVEL_INFO);
    signal(SIGPIPE, SIG_IGN);
    /* one BLAS thread per worker: the workers of a job already share the cores, and a fixed thread count keeps
     * every product bitwise reproducible */
    openblas_set_num_threads(1);
    errbuf err = {{0}};
    if (job_plan_load(&w->plan, config, overrides, noverrides, &err)) {
        log_error("%s", err.msg);
        return 1;
    }
    const job_config *c = &w->plan.cfg;
    int limit = job_role_workers(c, role);
    if (w->index >= limit) {
        log_error("%s: --index %d but the job has %d %s workers", config, w->index, limit, job_role_name(role));
        return 2;
    }
    keeper_reply rp;
    if (keeper_register(w->plan.keeper_socket, role, w->index, &rp, w->fds, KEEPER_MAX_FDS, 120.0, &err)) {
        log_error("%s", err.msg);
        return 1;
    }
    w->nfds = (int)rp.npools;
    w->train_fd = rp.ntrain ? w->fds[rp.npools] : -1;
    w->train_index = rp.ntrain ? rp.train_index : -1;
    w->weights_fd = rp.nweights ? w->fds[rp.npools + rp.ntrain] : -1;
    w->epoch = rp.epoch;
    if (job_state_open(&w->js, w->plan.state_name, (uint32_t)c->workers.drafters, w->plan.numel, &err)) {
        log_error("%s", err.msg);
        return 1;
    }
    w->entry = job_state_worker(&w->js, role, w->index);
    char gpu[32] = "none"; /* the CUDA backend maps worker i to device i */
    if (c->job.backend != JOB_BACKEND_CPU && role != JOB_ROLE_PREFETCH) snprintf(gpu, sizeof gpu, "cuda:%d", w->index);
    if (ctl_client_new(&w->ctl, c, role, w->index, w->epoch, rp.ctl_token, gpu, &err)) {
        log_error("%s", err.msg);
        return 1;
    }
    sd_watchdog_enabled(0, &w->watchdog_usec);
    worker_tick(w);
    if (liveness_start(w)) return 1;
    log_info("registered with the keeper: epoch %llu", (unsigned long long)w->epoch);
    return 0;
}

void worker_tick(worker_ctx *w)
{
    progress_bump();
    ctl_client_tick(w->ctl);
}

int worker_job_finished(const worker_ctx *w) { return atomic_load(&w->js.h->finished) != 0; }

void worker_count_batch(worker_ctx *w, uint64_t tokens)
{
    atomic_fetch_add(&w->entry->batches, 1);
    atomic_fetch_add(&w->entry->tokens, tokens);
}

void worker_stop(worker_ctx *w)
{
    sd_notify(0, "STOPPING=1");
    liveness_stop(w);
    ctl_client_destroy(&w->ctl);
    for (int i = 0; i < w->nfds; i++) close(w->fds[i]);
    if (w->train_fd >= 0) close(w->train_fd);
    w->train_fd = -1;
    if (w->weights_fd >= 0) close(w->weights_fd);
    w->weights_fd = -1;
    job_state_close(&w->js);
}

void worker_hold_while_paused(worker_ctx *w) { worker_hold_while_paused_unless(w, NULL, NULL); }

void worker_hold_while_paused_unless(worker_ctx *w, int (*release)(void *ctx), void *ctx)
{
    int said = 0;
    while (atomic_load(&w->js.h->paused) && !worker_job_finished(w) && !worker_restart_requested(w) &&
           !(release && release(ctx))) {
        if (!said++) {
            sd_notify(0, "STATUS=paused");
            ctl_client_set_held(w->ctl, 1);
        }
        worker_tick(w);
        uint32_t seen = atomic_load(&w->js.h->gen);
        job_state_wait(&w->js, seen, 200);
    }
    if (said) {
        sd_notify(0, "STATUS=running");
        ctl_client_set_held(w->ctl, 0);
    }
}

int worker_restart_requested(const worker_ctx *w) { return atomic_load(&w->entry->restart_requested) != 0; }

void worker_ready(worker_ctx *w, const char *status)
{
    atomic_store(&w->entry->ready, 1);
    sd_notifyf(0, "READY=1\nSTATUS=%s", status);
}
