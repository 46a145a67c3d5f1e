/* dflashd: the keeper of one job. It creates and owns every shared-memory segment (job state, token ring, one
 * hidden-state pool per target worker) and the pools' memfds, registers workers (a new epoch per start, fds passed
 * over its unix socket), watches them by pidfd and heartbeat, reclaims what a dead worker held, and appends the
 * batch ledger from the drafters' step records. It keeps the memory the workers deposit (a cuda target's pool and
 * device weights, a drafter reducer's training state) and its pool fds in the service manager's fd store, so its own restart loses
 * nothing: it reattaches to the segments and to the running workers. Touches no GPU and runs no model code. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/random.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "checkpoint.h"
#include "control.h"
#include "fdpass.h"
#include "job_identity.h"
#include "job_plan.h"
#include "job_state.h"
#include "keeper_proto.h"
#include "ledger.h"
#include "log.h"
#include "prompt_file.h"
#include "spec_eval.h"
#include "metrics_http.h"
#include "run_dir.h"
#include "run_lock.h"
#include "run_record.h"
#include "shard.h"
#include "slot_pool.h"
#include "step_plan.h"
#include "token_ring.h"

#define MAX_OVERRIDES 64
#define FDSTORE_NAMES 64                 /* FileDescriptorStoreMax in deploy/systemd/dflashd.service */

typedef struct keeper {
    job_plan plan;
    job_state js;
    struct token_ring *ring;
    struct slot_pool *pools[JOB_MAX_TARGETS];
    int npools;
    int train_fd[JOB_MAX_DRAFTERS];  /* training states deposited by the drafters' reducers, -1 when none */
    int weights_fd[JOB_MAX_TARGETS]; /* device weights deposited by the cuda targets, -1 when none */
    int listen_fd;
    int pidfd[JOB_MAX_WORKERS];      /* watched instance per worker-table entry, -1 when none */
    ledger *ledger;
    control *ctl;                    /* the control plane (services/dflashd/control.h) */
    metrics_http *metrics;           /* control.metrics_listen: Prometheus /metrics (NULL: off) */
    run_lock *lock;                  /* <run_dir>/dflashd.lock: one live dflashd per run_dir */
    char run_id[JOB_RUN_ID_MAX];
    int resume;
    int fresh;                       /* --fresh: a previous run in the run_dir is set aside, not refused */
    step_plan steps;                 /* which batches make each step (data_plan_check): published in the job state */
    char fdstore[FDSTORE_NAMES][64]; /* names of the fds this job has in the service manager's fd store */
    int nfdstore;
} keeper;

/* run()'s result besides 0 (finished or drained) and 1 (failed) */
#define RUN_STOPPED 2

static volatile sig_atomic_t stop_signal; /* SIGTERM or SIGINT received: leave the main loop */

static void on_signal(int sig) { stop_signal = sig; }

/* SIGUSR1: `dflash run` gives up on the job (a worker that cannot start again): the drafters checkpoint the committed
 * state and the job ends there, so that --resume continues from it. */
static volatile sig_atomic_t save_requested;

static void on_save_signal(int sig) { save_requested = 1; }

/* The job ends at the committed step, with its checkpoint (a drain to that step). 0, or 1 when no step is committed
 * (there is nothing to save: the caller stops). */
static int save_and_end(keeper *k)
{
    job_state_header *h = k->js.h;
    uint64_t c = atomic_load(&h->committed_step), stop = atomic_load(&h->stop_step);
    if (c == 0) {
        log_warn("asked to checkpoint the committed state and end the job: no step is committed, nothing to save");
        return 1;
    }
    if (!stop || stop > c) atomic_store(&h->stop_step, c);
    atomic_store(&h->paused, 0);
    job_state_wake(&k->js);
    log_warn("asked to checkpoint the committed state and end the job: the drafters stop after step %llu and "
             "checkpoint it", (unsigned long long)atomic_load(&h->stop_step));
    return 0;
}

static int pidfd_open_pid(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }
static int pidfd_kill(int pidfd, int sig) { return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0); }

static void fdstore_remember(keeper *k, const char *name)
{
    for (int i = 0; i < k->nfdstore; i++)
        if (strcmp(k->fdstore[i], name) == 0) return;
    if (k->nfdstore < FDSTORE_NAMES) snprintf(k->fdstore[k->nfdstore++], sizeof k->fdstore[0], "%s", name);
}

/* Take every fd this job has in the fd store out of it: when the job starts afresh (what a reattach found is
 * stale) and when it is finished. One FDSTOREREMOVE per name: a name removes every fd stored under it. */
static void fdstore_remove_all(keeper *k)
{
    for (int i = 0; i < k->nfdstore; i++) {
        char msg[128];
        snprintf(msg, sizeof msg, "FDSTOREREMOVE=1\nFDNAME=%s", k->fdstore[i]);
        sd_notify(0, msg);
    }
    k->nfdstore = 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: dflashd -c CONFIG [--set section.key=value]... [--resume | --fresh]\n"
               "The keeper of a dflash job: owns the shared memory, registers and watches workers, keeps the\n"
               "batch ledger (<run_dir>/ledger.jsonl). Normally started by `dflash run` or systemd.\n"
               "  -c, --config FILE   job config (INI)\n"
               "  --set KEY=VALUE     override one setting\n"
               "  --resume            start from <run_dir>/ckpt/latest instead of from scratch\n"
               "  --fresh             start from scratch even though the run_dir holds a previous run (its ledger\n"
               "                      and checkpoints move to <run_dir>/previous-<time>/); without it, refused\n"
               "  -h, --help          this text\n"
               "signals: SIGTERM, SIGINT stop dflashd and keep the job's shared memory for the next start;\n"
               "SIGUSR1 ends the job at its committed step after the drafters checkpoint it (`dflash run` sends\n"
               "it when it gives up on a job that was running)\n");
}

/* Reclaim everything the instance with this epoch held: FILLING -> FREE, LEASED -> READY. */
static void reclaim_epoch(keeper *k, uint64_t epoch, const char *who)
{
    int freed = 0, returned = 0, f, r;
    token_ring_reclaim(k->ring, epoch, &f, &r);
    freed += f;
    returned += r;
    for (int i = 0; i < k->npools; i++) {
        slot_pool_reclaim(k->pools[i], epoch, &f, &r);
        freed += f;
        returned += r;
    }
    job_state_wake(&k->js);
    if (freed || returned)
        log_info("%s (epoch %llu) is gone: %d slots freed, %d returned to READY", who, (unsigned long long)epoch,
                 freed, returned);
}

static int worker_slot_index(keeper *k, job_worker *w) { return (int)(w - k->js.h->workers); }

static void worker_label(const job_worker *w, char *out, size_t n)
{
    snprintf(out, n, "%s-%d", job_role_name((enum job_role)atomic_load(&w->role)), w->index);
}

/* The instance in entry w is dead (or must be treated so): forget its pidfd and reclaim its epoch. */
static void worker_gone(keeper *k, job_worker *w)
{
    int i = worker_slot_index(k, w);
    char label[32];
    worker_label(w, label, sizeof label);
    if (k->pidfd[i] >= 0) close(k->pidfd[i]);
    k->pidfd[i] = -1;
    uint64_t epoch = atomic_load(&w->epoch);
    atomic_store(&w->pid, 0);
    if (epoch) reclaim_epoch(k, epoch, label);
}

/* Make sure the previous instance of entry w is dead before a new one takes over (a zombie with a stale epoch
 * must not keep writing). */
static void worker_retire(keeper *k, job_worker *w, pid_t new_pid)
{
    int i = worker_slot_index(k, w);
    pid_t old = atomic_load(&w->pid);
    if (old == 0) return;
    if (old != new_pid && k->pidfd[i] >= 0) {
        struct pollfd p = {.fd = k->pidfd[i], .events = POLLIN};
        if (poll(&p, 1, 0) == 0) {
            char label[32];
            worker_label(w, label, sizeof label);
            log_warn("%s: old instance pid %d still runs while a new one registers: killing it", label, (int)old);
            pidfd_kill(k->pidfd[i], SIGKILL);
            poll(&p, 1, 5000);
        }
    }
    worker_gone(k, w);
}

/* Keep fd in the service manager's fd store under name (remembered for fdstore_remove_all). */
static void fd_store(keeper *k, const char *name, int fd)
{
    char store[96];
    snprintf(store, sizeof store, "FDSTORE=1\nFDNAME=%s", name);
    if (sd_pid_notify_with_fds(0, 0, store, &fd, 1) <= 0)
        log_debug("no fd store (NOTIFY_SOCKET unset): a restart of dflashd will start a new run");
    else
        fdstore_remember(k, name);
}

/* A drafter's reducer deposits its training state (host memfd or GPU VMM allocation): once per index. */
static int accept_train_state(keeper *k, const keeper_deposit *rq, int fd, char *msg, size_t n)
{
    job_train_state *t = &k->js.h->train_state[rq->index];
    if (atomic_load(&t->deposited)) {
        snprintf(msg, n, "training state %d is already deposited", rq->index);
        return -EEXIST;
    }
    static const uint8_t zero[16];
    t->bytes = rq->bytes;
    t->gpu = memcmp(rq->device_uuid, zero, 16) != 0;
    memcpy(t->device_uuid, rq->device_uuid, 16);
    k->train_fd[rq->index] = fd;
    atomic_store(&t->deposited, 1);
    char name[32];
    snprintf(name, sizeof name, "train-%d", rq->index);
    fd_store(k, name, fd);
    log_info("drafter-%d deposited its training state: %llu bytes in %s memory", rq->index,
             (unsigned long long)rq->bytes, t->gpu ? "GPU" : "host");
    return 0;
}

/* A cuda target deposits the VMM allocation of its device weights: a later deposit (weights reloaded into a new
 * allocation: another checkpoint, another layout) replaces the earlier one, whose memory is freed once no process
 * maps it. */
static int accept_weights(keeper *k, const keeper_deposit *rq, int fd, char *msg, size_t n)
{
    static const uint8_t zero[16];
    if (!memcmp(rq->device_uuid, zero, 16)) {
        snprintf(msg, n, "target weights %d: no GPU named (device weights only)", rq->index);
        return -EINVAL;
    }
    job_train_state *t = &k->js.h->target_weights[rq->index];
    char name[32];
    snprintf(name, sizeof name, "weights-%d", rq->index);
    int replaced = k->weights_fd[rq->index] >= 0;
    if (replaced) { /* the fd store holds every fd stored under a name: the old one goes first */
        char rm[64];
        snprintf(rm, sizeof rm, "FDSTOREREMOVE=1\nFDNAME=%s", name);
        sd_notify(0, rm);
        close(k->weights_fd[rq->index]);
    }
    atomic_store(&t->deposited, 0);
    t->bytes = rq->bytes;
    t->gpu = 1;
    memcpy(t->device_uuid, rq->device_uuid, 16);
    k->weights_fd[rq->index] = fd;
    atomic_store(&t->deposited, 1);
    fd_store(k, name, fd);
    log_info("target-%d deposited its device weights: %llu bytes%s", rq->index, (unsigned long long)rq->bytes,
             replaced ? " (replacing the earlier deposit)" : "");
    return 0;
}

/* A worker deposits memory it made: a cuda target its pool's and its weights' VMM allocations, a drafter its
 * training state. Only the registered instance (pid + epoch) of that worker, and only once but for the weights; the
 * fd goes to the fd store. */
static void handle_deposit(keeper *k, int conn, const keeper_deposit *rq, int fd)
{
    keeper_reply rp = {.magic = KEEPER_MAGIC};
    errbuf err = {{0}};
    const int train = rq->kind == KEEPER_DEPOSIT_TRAIN_STATE;
    const int weights = rq->kind == KEEPER_DEPOSIT_WEIGHTS;
    const char *what = train ? "training state" : weights ? "target weights" : "pool";
    job_worker *w = NULL;
    if ((rq->kind == KEEPER_DEPOSIT_POOL || weights) && rq->index >= 0 && rq->index < k->npools)
        w = job_state_worker(&k->js, JOB_ROLE_TARGET, rq->index);
    else if (train && rq->index >= 0 && rq->index < k->plan.cfg.workers.drafters)
        w = job_state_worker(&k->js, JOB_ROLE_DRAFTER, rq->index);
    if (!w || (!train && !k->plan.slot.gpu)) {
        rp.status = -EINVAL;
        snprintf(rp.msg, sizeof rp.msg, "%s deposit for %s-%d: %s", what, train ? "drafter" : "target", rq->index,
                 !w ? "no such worker in this job" : "job.backend is not cuda");
    } else if (atomic_load(&w->pid) != rq->pid || atomic_load(&w->epoch) != rq->epoch) {
        rp.status = -ESTALE;
        snprintf(rp.msg, sizeof rp.msg, "%s deposit for index %d from pid %d epoch %llu: not the registered "
                 "instance", what, rq->index, rq->pid, (unsigned long long)rq->epoch);
    } else if (fd < 0) {
        rp.status = -EINVAL;
        snprintf(rp.msg, sizeof rp.msg, "%s deposit for index %d carries no fd", what, rq->index);
    } else if (train) {
        if ((rp.status = accept_train_state(k, rq, fd, rp.msg, sizeof rp.msg)) == 0) fd = -1;
    } else if (weights) {
        if ((rp.status = accept_weights(k, rq, fd, rp.msg, sizeof rp.msg)) == 0) fd = -1;
    } else if ((rp.status = slot_pool_set_device_data(k->pools[rq->index], fd, rq->device_uuid, rq->bytes, &err))) {
        snprintf(rp.msg, sizeof rp.msg, "pool %d: %.200s", rq->index, err.msg);
    } else {
        char name[32];
        snprintf(name, sizeof name, "pool-%d", rq->index);
        fd_store(k, name, fd);
        fd = -1; /* the pool handle owns it now */
        log_info("target-%d deposited its GPU pool: %llu bytes", rq->index, (unsigned long long)rq->bytes);
    }
    if (fd >= 0) close(fd);
    if (rp.status) log_warn("deposit refused: %s", rp.msg);
    ssize_t sent = fdpass_send(conn, NULL, 0, &rp, sizeof rp);
    if (sent < 0) log_warn("keeper socket: reply to the %s deposit of index %d lost: %s", what, rq->index,
                           strerror((int)-sent));
}

/* The training state a drafter registering as `index` gets: its own, else drafter 0's (shared), else -1. */
static int train_state_for(const keeper *k, int index)
{
    if (k->train_fd[index] >= 0) return index;
    return k->train_fd[0] >= 0 ? 0 : -1;
}

/* The first GPU pool not yet deposited, or -1 (always -1 on the cpu backend). */
static int pool_missing(const keeper *k)
{
    for (int i = 0; i < k->npools; i++)
        if (slot_pool_data_fd(k->pools[i]) < 0) return i;
    return -1;
}

static void handle_register(keeper *k, int conn)
{
    union { keeper_request rq; keeper_deposit dep; } u;
    keeper_request rq;
    keeper_reply rp = {.magic = KEEPER_MAGIC};
    int fds[KEEPER_MAX_FDS], nfds = 0, got = 0, in_fd = -1;
    ssize_t n = fdpass_recv(conn, &in_fd, 1, &got, &u, sizeof u);
    if (n == (ssize_t)sizeof u.dep && u.dep.magic == KEEPER_DEPOSIT_MAGIC) {
        handle_deposit(k, conn, &u.dep, got ? in_fd : -1);
        return;
    }
    if (got) close(in_fd);
    if (n != (ssize_t)sizeof rq || u.rq.magic != KEEPER_MAGIC) {
        log_warn("keeper socket: malformed registration (%zd bytes): connection closed", n);
        return;
    }
    rq = u.rq;
    const job_config *c = &k->plan.cfg;
    int missing = rq.role == JOB_ROLE_DRAFTER ? pool_missing(k) : -1;
    int limit = job_role_workers(c, (enum job_role)rq.role);
    job_worker *w = NULL;
    if (rq.index < 0 || rq.index >= limit || !(w = job_state_worker(&k->js, (enum job_role)rq.role, rq.index))) {
        rp.status = -EINVAL;
        snprintf(rp.msg, sizeof rp.msg, "no worker %s-%d in this job (config %.100s)",
                 job_role_name((enum job_role)rq.role), rq.index, c->job.name);
    } else if (rq.run_id[0] && strcmp(rq.run_id, k->run_id) != 0) {
        rp.status = -ESTALE;
        snprintf(rp.msg, sizeof rp.msg, "worker belongs to run %s, this is run %s", rq.run_id, k->run_id);
    } else if (missing >= 0) { /* retryable: keeper_register asks again */
        rp.status = -EAGAIN;
        snprintf(rp.msg, sizeof rp.msg, "GPU pool %d not deposited by target-%d yet", missing, missing);
    } else if (rq.role == JOB_ROLE_DRAFTER && rq.index > 0 && train_state_for(k, rq.index) < 0) {
        rp.status = -EAGAIN; /* drafter 0 makes the training state (common/train/reducer.h) */
        snprintf(rp.msg, sizeof rp.msg, "no training state deposited by drafter-0 yet");
    } else {
        int pfd = pidfd_open_pid(rq.pid);
        if (pfd < 0) {
            rp.status = -errno;
            snprintf(rp.msg, sizeof rp.msg, "pid %d: %s", rq.pid, strerror(errno));
        } else {
            worker_retire(k, w, rq.pid);
            uint64_t epoch = atomic_fetch_add(&k->js.h->next_epoch, 1);
            /* a new secret per instance: only it can speak for this worker on the control socket */
            if (getrandom(w->ctl_token, sizeof w->ctl_token, 0) != (ssize_t)sizeof w->ctl_token) {
                uint64_t x = epoch ^ job_now_ns() ^ ((uint64_t)rq.pid << 32);
                for (size_t i = 0; i < sizeof w->ctl_token; i++) w->ctl_token[i] ^= (uint8_t)((x >>= 3) ^ i);
            }
            memcpy(rp.ctl_token, w->ctl_token, sizeof rp.ctl_token);
            atomic_store(&w->role, rq.role);
            w->index = rq.index;
            atomic_store(&w->epoch, epoch);
            atomic_store(&w->pid, rq.pid);
            job_worker_heartbeat(w);
            atomic_store(&w->ready, 0);
            atomic_store(&w->restart_requested, 0);
            atomic_store(&w->started_ns, job_now_ns());
            atomic_fetch_add(&w->starts, 1);
            k->pidfd[worker_slot_index(k, w)] = pfd;
            rp.epoch = epoch;
            if (rq.role == JOB_ROLE_TARGET) { /* a GPU pool not deposited yet: none, the target creates it */
                if (slot_pool_data_fd(k->pools[rq.index]) >= 0) fds[nfds++] = slot_pool_data_fd(k->pools[rq.index]);
            } else if (rq.role == JOB_ROLE_DRAFTER) {
                for (int i = 0; i < k->npools; i++) fds[nfds++] = slot_pool_data_fd(k->pools[i]);
            }
            rp.npools = (uint32_t)nfds;
            if (rq.role == JOB_ROLE_TARGET && k->weights_fd[rq.index] >= 0) { /* after the pool fd */
                fds[nfds++] = k->weights_fd[rq.index];
                rp.nweights = 1;
            }
            int ti = rq.role == JOB_ROLE_DRAFTER ? train_state_for(k, rq.index) : -1;
            rp.train_index = ti;
            if (ti >= 0) {
                fds[nfds++] = k->train_fd[ti];
                rp.ntrain = 1;
            }
            char label[32];
            worker_label(w, label, sizeof label);
            log_info("%s registered: pid %d, epoch %llu", label, rq.pid, (unsigned long long)epoch);
        }
    }
    if (rp.status && rp.status != -EAGAIN) log_warn("registration refused: %s", rp.msg);
    ssize_t sent = fdpass_send(conn, fds, nfds, &rp, sizeof rp);
    if (sent < 0) log_warn("keeper socket: reply to the registration of %s-%d (%d fds) lost: %s",
                           job_role_name((enum job_role)rq.role), rq.index, nfds, strerror((int)-sent));
}

static int listen_socket(const char *path, errbuf *err)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) return errbuf_set(err, ENAMETOOLONG, "%s: path too long", path);
    strcpy(addr.sun_path, path);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0) return errbuf_set(err, errno, "socket: %s", strerror(errno));
    unlink(path);
    if (bind(s, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(s, 64) != 0) {
        int e = errno;
        close(s);
        return errbuf_set(err, e, "%s: %s", path, strerror(e));
    }
    chmod(path, 0660);
    return s;
}

static void unlink_segments(const job_plan *p)
{
    char name[128];
    shm_segment_unlink(p->ring_name, NULL);
    shm_segment_unlink(p->state_name, NULL);
    for (int i = 0; i < p->cfg.workers.targets; i++) {
        job_plan_pool_name(p, i, name, sizeof name);
        slot_pool_unlink(name, NULL);
    }
}

/* A warning the operator must see: in the log, and on `dflash run`'s console (X_DFLASH_WARN; systemd ignores it). */
static void console_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void console_warn(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_warn("%s", msg);
    sd_notifyf(0, "X_DFLASH_WARN=%s", msg);
}

/* --resume needs a checkpoint: say so, not that some file of it cannot be opened. */
static int resume_has_checkpoint(keeper *k, errbuf *err)
{
    if (!k->resume) return 0;
    char latest[PATH_MAX];
    struct stat st;
    job_config_path(&k->plan.cfg, "ckpt/latest", latest, sizeof latest);
    if (lstat(latest, &st) == 0) return 0;
    return errbuf_set(err, ENOENT, "--resume: there is no checkpoint in %s/ckpt to resume from (%s does not exist): "
                      "start the job without --resume (it starts from step 0)", k->plan.cfg.job.run_dir, latest);
}

/* --resume with the drafters and targets of this start: the recorded plan cut at the checkpoint's step, plus a segment
 * from there when their numbers changed (said on the console: the ledger marks the step, status and the summary
 * say it). */
static int resume_plan(keeper *k, const run_record *was, run_record *rec, const char *path, errbuf *err)
{
    char root[4096];
    job_config_path(&k->plan.cfg, "ckpt", root, sizeof root);
    checkpoint_state st;
    int rc = checkpoint_read_state(root, NULL, &st, err);
    if (rc) return errbuf_wrap(err, rc, "--resume");
    if ((rc = run_record_resume(was, rec, st.step, st.batches_committed, path, err)) < 0) return rc;
    if (rc == 1) {
        const step_plan_segment *a = step_plan_segment_of(&was->plan, st.step ? st.step - 1 : 0),
                                *b = &rec->plan.seg[rec->plan.n - 1];
        console_warn("--resume: resharded at step %llu: drafters %u -> %u, targets %u -> %u; from step %llu on, each "
                     "step trains %u batches, from batch %llu on (none lost, none trained twice)",
                     (unsigned long long)st.step, a->drafters, b->drafters, a->targets, b->targets,
                     (unsigned long long)st.step, b->drafters, (unsigned long long)b->first_batch);
    }
    return 0;
}

/* The data and the step plan (run_record.h), before anything starts: a data set the job cannot train on is refused
 * (missing, empty, ids outside the target's vocabulary, no sample with a trained token within a batch), samples cut
 * to a batch are warned about; at --resume the settings that decide the batches and the data set must be those the
 * run started with. *rec gets this job's record (written by record_write once the start is decided). */
/* eval.prompts, before anything starts: every line a prompt of the target's vocabulary that fits its positions with
 * eval.max_new_tokens (the error names the file and line), so that a bad file is refused here, not by an
 * evaluation worker failing at every start. */
static int eval_check(keeper *k, errbuf *err)
{
    const job_config *c = &k->plan.cfg;
    if (!c->eval.prompts[0]) return 0;
    prompt_set ps;
    int need, rc = prompt_file_read(&ps, c->eval.prompts, k->plan.vocab, c->eval.limit, err);
    if (!rc)
        rc = spec_eval_check_fit(&ps, c->eval.prompts, 0, c->eval.max_new_tokens,
                                 k->plan.target.max_position > 0 ? k->plan.target.max_position : LONG_MAX,
                                 "the target's max_position_embeddings", &need, err);
    if (!rc) log_info("eval.prompts: %d prompts of %s for the evaluation worker", ps.n, c->eval.prompts);
    prompt_set_free(&ps);
    return rc ? errbuf_wrap(err, rc, "eval.prompts") : 0;
}

static int data_plan_check(keeper *k, run_record *rec, errbuf *err)
{
    const job_plan *p = &k->plan;
    dataset *ds = NULL;
    int rc = dataset_open(&ds, p->cfg.data.path, err);
    if (rc) return errbuf_wrap(err, rc, "data.path");
    uint64_t cut = 0, longest = 0;
    if ((rc = run_record_data_check(p, ds, &cut, &longest, err))) goto done;
    if (cut)
        console_warn("%llu of %llu samples are longer than data.max_batch_tokens = %d (the longest: %llu tokens): "
                     "training sees only their first %d tokens", (unsigned long long)cut,
                     (unsigned long long)dataset_count(ds), p->cfg.data.max_batch_tokens, (unsigned long long)longest,
                     p->cfg.data.max_batch_tokens);
    run_record_compute(rec, p, ds);
    if (!k->resume) goto done;
    char path[PATH_MAX];
    run_record_path(p, path, sizeof path);
    run_record was;
    if ((rc = run_record_read(&was, path, err)) == -ENOENT) {
        log_warn("--resume: %s: the checkpoint does not record its step plan and data set: not checked", path);
        rc = 0;
        goto done;
    }
    if (rc) {
        rc = errbuf_wrap(err, rc, "--resume");
        goto done;
    }
    if (!(rc = run_record_check_settings(&was, rec, path, err)))
        rc = run_record_check_data(&was, rec, path, "--resume", err);
    if (!rc) rc = resume_plan(k, &was, rec, path, err);
    run_record_free(&was);
    if (!rc) log_info("--resume: the batch settings and the data set (%zu shards) are those the run started with",
                      rec->nshards);
done:
    if (!rc) k->steps = rec->plan;
    dataset_close(&ds);
    return rc;
}

/* A start records its step plan and data set beside identity.json (a resume: the plan it goes on with). */
static int record_write(keeper *k, const run_record *rec, errbuf *err)
{
    char path[PATH_MAX];
    run_record_path(&k->plan, path, sizeof path);
    return run_record_write(rec, path, err);
}

/* Where a fresh run starts: step 0, or with --resume the step of <run_dir>/ckpt/latest (the drafters' reducer loads
 * the state itself: dflashd reads only the step). */
static int resume_step(keeper *k, errbuf *err)
{
    if (!k->resume) return 0;
    char root[4096];
    job_config_path(&k->plan.cfg, "ckpt", root, sizeof root);
    checkpoint_state st;
    int rc = checkpoint_read_state(root, NULL, &st, err);
    if (rc) return errbuf_wrap(err, rc, "--resume");
    atomic_store(&k->js.h->committed_step, st.step);
    atomic_store(&k->js.h->ledger_frontier, st.step);
    log_info("resuming from %s/latest: step %llu", root, (unsigned long long)st.step);
    return 0;
}

/* A fresh start (not --resume) over a previous run's ledger or checkpoint: refused, or with --fresh that run is
 * moved aside (never deleted: forgetting --resume must not cost a run). */
static int previous_run_check(keeper *k, errbuf *err)
{
    char what[PATH_MAX + 64], dest[PATH_MAX];
    const char *dir = k->plan.cfg.job.run_dir;
    if (k->resume || !run_dir_previous(dir, what, sizeof what)) return 0;
    if (!k->fresh) return run_dir_refuse(dir, what, err);
    int rc = run_dir_set_aside(dir, 0, dest, sizeof dest, err);
    if (rc) return rc;
    log_info("--fresh: the previous run (%s) is now in %s", what, dest);
    return 0;
}

/* What the checkpoints are trained against (job_identity.h): recorded at a start from scratch, checked at --resume
 * (a checkpoint from before identities were recorded is resumed with a warning). */
static int identity_check(keeper *k, errbuf *err)
{
    char path[PATH_MAX];
    job_config_path(&k->plan.cfg, "ckpt", path, sizeof path);
    if (!k->resume && mkdir(path, 0755) != 0 && errno != EEXIST)
        return errbuf_set(err, errno, "%s: %s", path, strerror(errno));
    strncat(path, "/identity.json", sizeof path - strlen(path) - 1);
    job_identity now, was;
    int rc = job_identity_compute(&now, &k->plan, err);
    if (rc) return rc;
    if (!k->resume) return job_identity_write(&now, path, err);
    if ((rc = job_identity_read(&was, path, err)) == -ENOENT) {
        log_warn("--resume: %s: the checkpoint does not say which target it was trained against: not checked", path);
        return 0;
    }
    if (rc) return errbuf_wrap(err, rc, "--resume");
    if ((rc = job_identity_check(&was, &now, path, err))) return rc;
    log_info("--resume: the checkpoint was trained against this target (weights %s, taps as recorded)",
             now.weights_digest);
    return 0;
}

/* Fresh segments for this run (stale ones from an earlier run are removed first). */
static int create_job(keeper *k, errbuf *err)
{
    const job_plan *p = &k->plan;
    unlink_segments(p);
    int rc = job_state_create(&k->js, p->state_name, k->run_id, (uint32_t)p->cfg.workers.drafters, p->numel,
                              (uint64_t)p->cfg.train.steps, err);
    if (rc) return rc;
    k->js.h->plan = k->steps;
    if ((rc = resume_step(k, err))) return rc;
    if ((rc = token_ring_create(p->ring_name, &p->ring, &k->ring, err))) return rc;
    token_ring_next_id_set(k->ring, step_plan_first_batch(&k->js.h->plan, atomic_load(&k->js.h->committed_step)));
    k->npools = p->cfg.workers.targets;
    for (int i = 0; i < k->npools; i++) {
        char name[128], store[64];
        job_plan_pool_name(p, i, name, sizeof name);
        if (p->slot.gpu) { /* control segment only: the target deposits the VMM allocation (handle_deposit) */
            if ((rc = slot_pool_create_control(name, (uint32_t)p->cfg.ring.pool_slots, p->slot.bytes, &k->pools[i],
                                               err)))
                return rc;
            continue;
        }
        if ((rc = slot_pool_create(name, (uint32_t)p->cfg.ring.pool_slots, p->slot.bytes, &k->pools[i], err)))
            return rc;
        snprintf(store, sizeof store, "pool-%d", i);
        fd_store(k, store, slot_pool_data_fd(k->pools[i]));
    }
    log_info("job %s: created job state (%llu drafter parameters), token ring (%u slots of %u tokens), %d pools of %d "
             "slots (%zu bytes each)", p->cfg.job.name, (unsigned long long)p->numel, p->ring.nslots,
             p->ring.max_tokens, k->npools, p->cfg.ring.pool_slots, p->slot.bytes);
    return 0;
}

/* Reattach after our own restart: the segments by name, the pools' data from the fd store. */
static int reattach_job(keeper *k, int *fds, char **names, int nfds, errbuf *err)
{
    const job_plan *p = &k->plan;
    int rc = job_state_open(&k->js, p->state_name, (uint32_t)p->cfg.workers.drafters, p->numel, err);
    if (rc) return rc;
    if (strcmp(k->js.h->run_id, k->run_id) != 0) {
        job_state_close(&k->js);
        return errbuf_set(err, ESTALE, "state segment belongs to run %s", k->js.h->run_id);
    }
    if ((rc = token_ring_open(p->ring_name, &p->ring, &k->ring, err))) return rc;
    k->npools = p->cfg.workers.targets;
    for (int i = 0; i < k->npools; i++) {
        char want[32], name[128];
        snprintf(want, sizeof want, "pool-%d", i);
        int fd = -1;
        for (int j = 0; j < nfds; j++)
            if (names && names[j] && !strcmp(names[j], want)) fd = fds[j];
        job_plan_pool_name(p, i, name, sizeof name);
        if (p->slot.gpu) { /* a GPU pool: the control segment, plus the deposited fd when there was one */
            uint8_t uuid[16];
            uint64_t bytes = 0;
            if ((rc = slot_pool_attach_control(name, &k->pools[i], err))) return rc;
            int deposited = slot_pool_device(k->pools[i], uuid, &bytes) == 0;
            if (deposited != (fd >= 0))
                return errbuf_set(err, ENOENT, "%s: %s", want, fd < 0 ? "deposited but not in the fd store"
                                                                     : "in the fd store but never deposited");
            if (fd >= 0 && (rc = slot_pool_set_device_data(k->pools[i], fcntl(fd, F_DUPFD_CLOEXEC, 0), uuid, bytes,
                                                           err)))
                return rc;
            continue;
        }
        if (fd < 0) return errbuf_set(err, ENOENT, "fd store has no %s", want);
        if ((rc = slot_pool_attach(name, fd, &k->pools[i], err))) return rc;
    }
    for (int i = 0; i < p->cfg.workers.drafters; i++) { /* training states the drafters deposited */
        char want[32];
        snprintf(want, sizeof want, "train-%d", i);
        int fd = -1;
        for (int j = 0; j < nfds; j++)
            if (names && names[j] && !strcmp(names[j], want)) fd = fds[j];
        if (atomic_load(&k->js.h->train_state[i].deposited) != (fd >= 0))
            return errbuf_set(err, ENOENT, "%s: %s", want, fd < 0 ? "deposited but not in the fd store"
                                                                 : "in the fd store but never deposited");
        if (fd >= 0) k->train_fd[i] = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    }
    for (int i = 0; p->slot.gpu && i < k->npools; i++) { /* device weights the cuda targets deposited */
        char want[32];
        snprintf(want, sizeof want, "weights-%d", i);
        int fd = -1;
        for (int j = 0; j < nfds; j++)
            if (names && names[j] && !strcmp(names[j], want)) fd = fds[j];
        if (atomic_load(&k->js.h->target_weights[i].deposited) != (fd >= 0))
            return errbuf_set(err, ENOENT, "%s: %s", want, fd < 0 ? "deposited but not in the fd store"
                                                                 : "in the fd store but never deposited");
        if (fd >= 0) k->weights_fd[i] = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    }
    /* workers that were registered: watch the live ones, reclaim the dead */
    for (int i = 0; i < JOB_MAX_WORKERS; i++) {
        job_worker *w = &k->js.h->workers[i];
        pid_t pid = atomic_load(&w->pid);
        if (!pid) continue;
        int pfd = pidfd_open_pid(pid);
        if (pfd < 0) worker_gone(k, w);
        else k->pidfd[i] = pfd;
    }
    log_info("job %s: reattached after a keeper restart (step %llu)", p->cfg.job.name,
             (unsigned long long)atomic_load(&k->js.h->committed_step));
    return 0;
}

/* The one test of "is this worker alive": its heartbeat in the worker table, which the worker's liveness thread
 * renews while the worker makes progress (common/job/worker.h). A worker silent for workers.heartbeat_timeout_sec
 * is killed (its pidfd then reports the death and its slots are reclaimed), and `dflash run` is told which pid and
 * why (X_DFLASH_KILLED=<pid> <reason>): it gives up on a worker killed again and again without a step committing. */
static void check_heartbeats(keeper *k)
{
    uint64_t now = job_now_ns(), limit = (uint64_t)(k->plan.cfg.workers.heartbeat_timeout_sec * 1e9);
    for (int i = 0; i < JOB_MAX_WORKERS; i++) {
        job_worker *w = &k->js.h->workers[i];
        if (k->pidfd[i] < 0 || !atomic_load(&w->pid)) continue;
        uint64_t hb = atomic_load(&w->heartbeat_ns);
        if (hb && now > hb && now - hb > limit) {
            char label[32], why[160];
            pid_t pid = atomic_load(&w->pid);
            worker_label(w, label, sizeof label);
            snprintf(why, sizeof why, "gave no sign of life for %.1f s (workers.heartbeat_timeout_sec = %g)",
                     (double)(now - hb) / 1e9, k->plan.cfg.workers.heartbeat_timeout_sec);
            log_warn("%s (pid %d) %s: killing it", label, (int)pid, why);
            /* told first, so that `dflash run` knows why before it reaps the death */
            sd_notifyf(0, "X_DFLASH_KILLED=%d %s", (int)pid, why);
            pidfd_kill(k->pidfd[i], SIGKILL);
            job_worker_heartbeat(w); /* one kill per timeout; the pidfd reports the death */
        }
    }
}

static void report_status(keeper *k)
{
    int fr, fi, rd, le;
    token_ring_stats(k->ring, &fr, &fi, &rd, &le);
    int pready = 0, pleased = 0;
    for (int i = 0; i < k->npools; i++) {
        int a, b, c, d;
        slot_pool_stats(k->pools[i], &a, &b, &c, &d);
        pready += c;
        pleased += d;
    }
    /* X_DFLASH_STEP: the committed step, for `dflash run` to tell kills in a row from kills between commits */
    sd_notifyf(0, "STATUS=step %llu/%llu, ledger %llu, token ring %d ready %d leased, pools %d ready %d leased\n"
               "X_DFLASH_STEP=%llu",
               (unsigned long long)atomic_load(&k->js.h->committed_step), (unsigned long long)k->js.h->total_steps,
               (unsigned long long)atomic_load(&k->js.h->ledger_frontier), rd, le, pready, pleased,
               (unsigned long long)atomic_load(&k->js.h->committed_step));
}

/* The evaluation worker has steps of this job left to evaluate (the last one included): the job ends once they
 * are (a training step never waits for it). */
static int eval_pending(keeper *k)
{
    uint64_t last = job_state_last_step(&k->js);
    job_worker *w = job_state_worker(&k->js, JOB_ROLE_EVAL, 0);
    /* none ever registered (a unit not added under systemd): nothing to wait for; else until it says it has nothing
     * left (the last step evaluated, or skipped for an error) and has exited */
    if (!k->plan.cfg.eval.prompts[0] || !atomic_load(&w->starts)) return 0;
    if (atomic_load(&k->js.h->eval.ended)) return atomic_load(&w->pid) != 0;
    static int said;
    if (!said++) {
        log_info("training finished: waiting for the evaluation worker (eval-0) to evaluate step %llu",
                 (unsigned long long)last);
    }
    ledger_append_eval(k->ledger, &k->js);
    return 1;
}

static int run(keeper *k)
{
    uint64_t wd_usec = 0;
    int watchdog = sd_watchdog_enabled(0, &wd_usec) > 0;
    double last_periodic = 0;
    sd_notify(0, "READY=1\nSTATUS=serving");
    while (!stop_signal) {
        struct pollfd pf[2 + JOB_MAX_WORKERS];
        int map[2 + JOB_MAX_WORKERS], n = 0;
        pf[n].fd = k->listen_fd;
        pf[n].events = POLLIN;
        map[n++] = -1;
        pf[n].fd = control_fd(k->ctl);
        pf[n].events = POLLIN;
        map[n++] = -1;
        for (int i = 0; i < JOB_MAX_WORKERS; i++) {
            if (k->pidfd[i] < 0) continue;
            pf[n].fd = k->pidfd[i];
            pf[n].events = POLLIN;
            map[n++] = i;
        }
        int r = poll(pf, (nfds_t)n, 100);
        if (r < 0 && errno != EINTR) {
            log_error("poll: %s", strerror(errno));
            return 1;
        }
        /* deaths first, so a restarted worker's registration finds its predecessor reclaimed */
        for (int j = 1; r > 0 && j < n; j++)
            if (pf[j].revents && map[j] >= 0) worker_gone(k, &k->js.h->workers[map[j]]);
        if (r > 0 && (pf[0].revents & POLLIN)) {
            int conn;
            while ((conn = accept4(k->listen_fd, NULL, NULL, SOCK_CLOEXEC)) >= 0) {
                struct timeval tv = {1, 0};
                setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
                setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
                handle_register(k, conn);
                close(conn);
            }
        }
        ledger_append_committed(k->ledger, &k->js);
        ledger_append_eval(k->ledger, &k->js);
        control_process(k->ctl);
        metrics_http_tick(k->metrics, k->ctl);
        double now = now_seconds();
        if (now - last_periodic >= 0.5) {
            last_periodic = now;
            check_heartbeats(k);
            report_status(k);
        }
        if (watchdog) sd_notify(0, "WATCHDOG=1");
        if (save_requested == 1) {
            save_requested = 2;
            if (save_and_end(k)) return RUN_STOPPED;
        }
        if (atomic_load(&k->js.h->finished) &&
            atomic_load(&k->js.h->ledger_frontier) >= job_state_last_step(&k->js) && !eval_pending(k)) {
            ledger_append_eval(k->ledger, &k->js); /* the last evaluation's line, when it came after the last pass */
            control_process(k->ctl); /* the drain's waiters get their answer (it finished after the last pass) */
            log_info("training %s: %llu steps in the ledger",
                     job_state_last_step(&k->js) < k->js.h->total_steps ? "drained" : "finished",
                     (unsigned long long)job_state_last_step(&k->js));
            return 0;
        }
    }
    log_info("stopping on SIG%s: the shared memory and the fd store stay for the next start to reattach",
             sigabbrev_np(stop_signal));
    return RUN_STOPPED;
}

int main(int argc, char **argv)
{
    static keeper k;
    const char *config = NULL, *overrides[MAX_OVERRIDES];
    int noverrides = 0;
    static const struct option opts[] = {{"config", required_argument, 0, 'c'}, {"set", required_argument, 0, 's'},
                                         {"resume", no_argument, 0, 'r'},       {"help", no_argument, 0, 'h'},
                                         {"fresh", no_argument, 0, 'f'},
                                         {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
        switch (o) {
        case 'c': config = optarg; break;
        case 's':
            if (noverrides == MAX_OVERRIDES) { fprintf(stderr, "dflashd: too many --set\n"); return 2; }
            if (!config_arg_well_formed(optarg)) {
                fprintf(stderr, "dflashd: --set \"%s\": expected section.key=value\n", optarg);
                return 2;
            }
            overrides[noverrides++] = optarg;
            break;
        case 'r': k.resume = 1; break;
        case 'f': k.fresh = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!config || optind != argc || (k.resume && k.fresh)) {
        usage(stderr);
        return 2;
    }
    log_init("dflashd", LOG_LEVEL_INFO);
    errbuf err = {{0}};
    if (job_plan_load(&k.plan, config, overrides, noverrides, &err)) {
        log_error("%s", err.msg);
        return 1;
    }
    for (int i = 0; i < JOB_MAX_WORKERS; i++) k.pidfd[i] = -1;
    for (int i = 0; i < JOB_MAX_DRAFTERS; i++) k.train_fd[i] = -1;
    for (int i = 0; i < JOB_MAX_TARGETS; i++) k.weights_fd[i] = -1;
    const char *rid = getenv("DFLASH_RUN_ID");
    snprintf(k.run_id, sizeof k.run_id, "%s", rid && rid[0] ? rid : "standalone");
    /* SIGTERM (systemctl stop, `dflash run` stopping) and SIGINT: leave the main loop and exit 0 through the clean
     * path, keeping the segments and the fd store so that the next start reattaches */
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &(struct sigaction){.sa_handler = on_save_signal}, NULL);
    sigaction(SIGPIPE, &(struct sigaction){.sa_handler = SIG_IGN}, NULL);
    mkdir(k.plan.cfg.job.run_dir, 0755);
    if (run_lock_open(&k.lock, k.plan.run_dir, RUN_LOCK_DFLASHD, &err)) { /* before touching any segment */
        log_error("%s", err.msg);
        return 1;
    }

    char **names = NULL;
    int nfds = sd_listen_fds_with_names(1, &names), rc, created = 0;
    if (nfds < 0) nfds = 0;
    if (nfds > FDSTORE_NAMES) nfds = FDSTORE_NAMES;
    int fds[FDSTORE_NAMES];
    for (int i = 0; i < nfds; i++) {
        fds[i] = SD_LISTEN_FDS_START + i;
        if (names && names[i]) fdstore_remember(&k, names[i]);
    }
    rc = nfds > 0 ? reattach_job(&k, fds, names, nfds, &err) : -ENOENT;
    if (rc) {
        if (nfds > 0) log_warn("cannot reattach (%s): starting the job afresh", err.msg);
        job_state_close(&k.js);
        token_ring_destroy(&k.ring);
        for (int i = 0; i < JOB_MAX_TARGETS; i++) slot_pool_destroy(&k.pools[i]);
        for (int i = 0; i < nfds; i++) close(fds[i]);
        for (int i = 0; i < JOB_MAX_DRAFTERS; i++) { /* training states a failed reattach took: the old run's */
            if (k.train_fd[i] >= 0) close(k.train_fd[i]);
            k.train_fd[i] = -1;
        }
        for (int i = 0; i < JOB_MAX_TARGETS; i++) { /* and device weights */
            if (k.weights_fd[i] >= 0) close(k.weights_fd[i]);
            k.weights_fd[i] = -1;
        }
        fdstore_remove_all(&k);
        run_record rec = {0};
        if ((rc = eval_check(&k, &err)) || (rc = resume_has_checkpoint(&k, &err)) || (rc = previous_run_check(&k, &err)) ||
            (rc = identity_check(&k, &err)) || (rc = data_plan_check(&k, &rec, &err)) ||
            (rc = record_write(&k, &rec, &err))) {
            log_error("%s", err.msg);
            run_record_free(&rec);
            return 1;
        }
        run_record_free(&rec);
        if ((rc = create_job(&k, &err))) {
            log_error("%s", err.msg);
            unlink_segments(&k.plan); /* a failed start (a refused resume...) leaves nothing in /dev/shm */
            return 1;
        }
        created = 1;
    }
    for (int i = 0; names && names[i]; i++) free(names[i]);
    free(names);
    char path[4096];
    job_config_path(&k.plan.cfg, "ledger.jsonl", path, sizeof path);
    if ((rc = ledger_open(&k.ledger, path, &k.js, (uint32_t)k.plan.cfg.workers.drafters, &err))) {
        log_error("%s", err.msg);
        if (created) unlink_segments(&k.plan);
        return 1;
    }
    if (ledger_notice(k.ledger)[0]) console_warn("%s", ledger_notice(k.ledger));
    ledger_set_block_size(k.ledger, k.plan.drafter.block_size);
    job_config_path(&k.plan.cfg, "tensorboard", path, sizeof path);
    if (k.plan.cfg.metrics.tensorboard && (rc = ledger_tensorboard_open(k.ledger, path, &err)))
        log_warn("metrics.tensorboard: %s: no TensorBoard events", err.msg);
    if ((k.listen_fd = listen_socket(k.plan.keeper_socket, &err)) < 0) {
        log_error("%s", err.msg);
        if (created) unlink_segments(&k.plan);
        return 1;
    }
    control_view cv = {.js = &k.js, .plan = &k.plan, .ring = k.ring, .pools = k.pools, .npools = k.npools};
    if ((rc = control_new(&k.ctl, &cv, &err))) {
        log_error("%s", err.msg);
        if (created) unlink_segments(&k.plan);
        return 1;
    }
    if ((rc = metrics_http_new(&k.metrics, k.plan.cfg.control.metrics_listen, &err))) {
        log_error("%s", err.msg);
        control_destroy(&k.ctl);
        if (created) unlink_segments(&k.plan);
        return 1;
    }
    rc = run(&k);
    metrics_http_destroy(&k.metrics);
    control_destroy(&k.ctl);
    char end_reason[sizeof k.js.h->end_reason] = ""; /* the job ended early for a cause no restart cures */
    if (rc == 0) {
        memcpy(end_reason, k.js.h->end_reason, sizeof end_reason - 1);
        if (end_reason[0]) log_error("the job ended before its last step: %s", end_reason);
    }
    if (rc == 0) { /* X_DFLASH_FINISHED: `dflash run` tells the job's end from a stop (both exit 0) by it */
        sd_notifyf(0, "STOPPING=1\nX_DFLASH_FINISHED=1\nSTATUS=finished: %llu steps in the ledger",
                   (unsigned long long)job_state_last_step(&k.js));
        fdstore_remove_all(&k);
    } else {
        sd_notify(0, "STOPPING=1");
    }
    ledger_destroy(&k.ledger);
    if (rc == 0) unlink_segments(&k.plan);
    run_lock_destroy(&k.lock);
    if (end_reason[0]) return JOB_EXIT_FATAL; /* `dflash run` gives up with the reason; systemd does not restart */
    return rc == RUN_STOPPED ? 0 : rc;
}
