#include "control.h"

#include <errno.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <systemd/sd-daemon.h>
#include <zmq.h>

#include "ctl_proto.h"
#include "log.h"
#include "step_metrics.h"
#include "step_plan.h"
#include "zap.h"

#define CONTROL_RESTART_TIMEOUT_SEC 300.0 /* a restarted worker must be ready and healthy within this */
#define CONTROL_HEALTHY_SEC 1.0           /* ... and keep heartbeating this long before the next one restarts */
#define CONTROL_MAX_WAITERS 32
#define CONTROL_BATCH 256                 /* messages served per control_process call */
#define CONTROL_WARN_WINDOW_SEC 10.0      /* refusals logged one by one: at most CONTROL_WARN_BURST a window, */
#define CONTROL_WARN_BURST 20             /* the rest counted and summarised when the window ends */

/* What the control plane knows of the current instance of one worker-table entry. */
typedef struct worker_ctl {
    uint64_t epoch;          /* epoch this control registration belongs to (0: none) */
    uint64_t last_hb_ns;
    int held;
    char gpu[64];
    uint64_t sample_tokens, sample_ns;
    double tokens_per_sec;
} worker_ctl;

typedef struct waiter {
    uint8_t id[CTL_ID_MAX];
    size_t idlen;
    uint64_t request_id;
} waiter;

struct control {
    control_view v;
    void *ctx, *sock;
    int fd;
    int bound_ipc; /* bound an ipc:// endpoint: its socket file is ours to remove */
    char endpoint[CONFIG_STRING_MAX + 16];
    worker_ctl ws[JOB_MAX_WORKERS];
    job_restart_op *op; /* the restart operation in the job state (it outlives this process) */
    zap_handler *zap;   /* tcp with control.curve_client_keys_file: the client allow-list */
    waiter waiters[CONTROL_MAX_WAITERS];
    int nwaiters;
    double last_timers, last_rates;
    double warn_window;                 /* start of the current refusal-logging window */
    int warned;                         /* refusals logged in it */
    uint64_t suppressed;                /* refusals not logged in it */
    char last_suppressed[256];
    uint64_t last_step;                 /* committed step when last seen moving */
    double last_step_at, stall_warned_at;
    uint32_t block_seen, ledger_seen;   /* write_block.err, ledger_block.err last reported (0: none) */
    uint64_t block_step, ledger_step;
};

/* ---- sending ---- */

static void send_to(control *c, const uint8_t *id, size_t idlen, Dflash__Envelope *e)
{
    errbuf err = {{0}};
    if (ctl_send(c->sock, id, idlen, e, &err)) log_debug("control: %s (reply dropped)", err.msg);
}

/* End the refusal-logging window: say how many refusals were not logged one by one. */
static void warn_flush(control *c, double now)
{
    if (c->suppressed)
        log_warn("control: %llu more refused messages in the last %.0f s, not logged one by one (the last: %s)",
                 (unsigned long long)c->suppressed, now - c->warn_window, c->last_suppressed);
    c->suppressed = 0;
    c->warned = 0;
    c->warn_window = now;
}

/* A peer's routing id for messages, without a worker's token ("target-1/<token>" -> "target-1/..."). */
static void peer_format(const ctl_msg *m, char *out, size_t n)
{
    const uint8_t *slash = memchr(m->id, '/', m->idlen);
    enum job_role role;
    int index, has;
    uint8_t tok[JOB_CTL_TOKEN_BYTES];
    if (slash && !ctl_worker_id_split(m->id, m->idlen, &role, &index, tok, &has))
        snprintf(out, n, "%s-%d/...", job_role_name(role), index);
    else
        ctl_id_format(m->id, m->idlen, out, n);
}

static void reply_error(control *c, const ctl_msg *m, uint64_t req, Dflash__ErrorCode code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void reply_error(control *c, const ctl_msg *m, uint64_t req, Dflash__ErrorCode code, const char *fmt, ...)
{
    char text[512], who[2 * CTL_ID_MAX + 8];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    peer_format(m, who, sizeof who);
    double now = now_seconds();
    if (now - c->warn_window >= CONTROL_WARN_WINDOW_SEC) warn_flush(c, now);
    if (c->warned < CONTROL_WARN_BURST) {
        c->warned++;
        log_warn("control: peer %s: %s (refused)", who, text);
    } else { /* a flood (garbage, a client in a loop) must not fill the disk with one line each */
        c->suppressed++;
        snprintf(c->last_suppressed, sizeof c->last_suppressed, "peer %.64s: %.160s", who, text);
    }
    Dflash__Envelope e;
    Dflash__Error er = DFLASH__ERROR__INIT;
    ctl_envelope_init(&e, req);
    er.code = code;
    er.message = text;
    e.body_case = DFLASH__ENVELOPE__BODY_ERROR;
    e.error = &er;
    send_to(c, m->id, m->idlen, &e);
}

static void reply_ack(control *c, const uint8_t *id, size_t idlen, uint64_t req, Dflash__Ack *a)
{
    Dflash__Envelope e;
    ctl_envelope_init(&e, req);
    e.body_case = DFLASH__ENVELOPE__BODY_ACK;
    e.ack = a;
    send_to(c, id, idlen, &e);
}

/* ---- workers ---- */

static int role_count(const control *c, enum job_role role) { return job_role_workers(&c->v.plan->cfg, role); }

/* The worker-table slot of (role, index) in this job, or -1. */
static int worker_slot(const control *c, enum job_role role, int index)
{
    if (index < 0 || index >= role_count(c, role)) return -1;
    job_worker *w = job_state_worker(c->v.js, role, index);
    return w ? (int)(w - c->v.js->h->workers) : -1;
}

static job_worker *slot_worker(const control *c, int slot) { return &c->v.js->h->workers[slot]; }

/* Whether a peer's routing id carries the control token of the current registration of worker `slot`: the keeper
 * gave it to that instance alone (over its unix socket, checked by pid), so a client that only claims the name
 * cannot speak for the worker, nor take its connection over (ROUTER handover matches whole routing ids). */
static int token_ok(const control *c, int slot, const uint8_t tok[JOB_CTL_TOKEN_BYTES], int has)
{
    const job_worker *w = slot_worker(c, slot);
    if (!has || !atomic_load(&w->pid)) return 0;
    uint8_t diff = 0;
    for (int i = 0; i < JOB_CTL_TOKEN_BYTES; i++) diff |= (uint8_t)(tok[i] ^ w->ctl_token[i]);
    return diff == 0;
}

/* A peer whose routing id claims a worker's name must prove it with the worker's token: 1 it claims one and does
 * not (then it was refused and logged), 0 otherwise. */
static int claim_refused(control *c, const ctl_msg *m, uint64_t req)
{
    enum job_role role;
    int idx, slot, has;
    uint8_t tok[JOB_CTL_TOKEN_BYTES];
    if (ctl_worker_id_split(m->id, m->idlen, &role, &idx, tok, &has)) return 0;
    if ((slot = worker_slot(c, role, idx)) >= 0 && token_ok(c, slot, tok, has)) return 0;
    reply_error(c, m, req, DFLASH__ERROR_CODE__ERROR_CODE_UNKNOWN_WORKER,
                "connects with worker %s-%d's name but without the token of its registration with the keeper: "
                "not that worker (dflashctl and other clients must use another routing id)", job_role_name(role), idx);
    return 1;
}

/* The slot of the worker that a register/heartbeat comes from, checked against its identity, token and epoch. */
static int worker_of_peer(control *c, const ctl_msg *m, uint64_t req, const char *role_name, int index, uint64_t epoch,
                          int32_t pid)
{
    enum job_role role;
    int idx, slot, has;
    uint8_t tok[JOB_CTL_TOKEN_BYTES];
    char who[2 * CTL_ID_MAX + 8];
    peer_format(m, who, sizeof who);
    if (ctl_worker_id_split(m->id, m->idlen, &role, &idx, tok, &has) || (slot = worker_slot(c, role, idx)) < 0) {
        reply_error(c, m, req, DFLASH__ERROR_CODE__ERROR_CODE_UNKNOWN_WORKER, "%s is not a worker of job %s", who,
                    c->v.plan->cfg.job.name);
        return -1;
    }
    if (role_name && (ctl_role_parse(role_name) != role || index != idx)) {
        reply_error(c, m, req, DFLASH__ERROR_CODE__ERROR_CODE_UNKNOWN_WORKER, "peer %s registers as %s-%d", who,
                    role_name, index);
        return -1;
    }
    job_worker *w = slot_worker(c, slot);
    uint64_t cur = atomic_load(&w->epoch);
    if (epoch < cur) {
        reply_error(c, m, req, DFLASH__ERROR_CODE__ERROR_CODE_STALE_EPOCH,
                    "%s: epoch %llu is stale, the current instance (pid %d) has epoch %llu", who,
                    (unsigned long long)epoch, (int)atomic_load(&w->pid), (unsigned long long)cur);
        return -1;
    }
    if (!token_ok(c, slot, tok, has)) {
        reply_error(c, m, req, DFLASH__ERROR_CODE__ERROR_CODE_UNKNOWN_WORKER,
                    "%s: claims to be %s-%d without the token of its registration with the keeper: refused", who,
                    job_role_name(role), idx);
        return -1;
    }
    if (epoch > cur || (pid && pid != atomic_load(&w->pid))) {
        reply_error(c, m, req, DFLASH__ERROR_CODE__ERROR_CODE_UNKNOWN_WORKER,
                    "%s: epoch %llu pid %d was not registered with the keeper (current: epoch %llu pid %d)", who,
                    (unsigned long long)epoch, (int)pid, (unsigned long long)cur, (int)atomic_load(&w->pid));
        return -1;
    }
    return slot;
}

static void handle_register(control *c, const ctl_msg *m, const Dflash__Envelope *e)
{
    const Dflash__RegisterWorker *r = e->register_worker;
    int slot = worker_of_peer(c, m, e->request_id, r->role, r->index, r->epoch, r->pid);
    if (slot < 0) return;
    worker_ctl *ws = &c->ws[slot];
    if (ws->epoch != r->epoch) log_info("control: %s-%d connected (epoch %llu, pid %d, gpu %s)", r->role, r->index,
                                        (unsigned long long)r->epoch, r->pid, r->gpu);
    ws->epoch = r->epoch;
    ws->last_hb_ns = job_now_ns();
    ws->held = 0;
    snprintf(ws->gpu, sizeof ws->gpu, "%s", r->gpu);
    Dflash__Ack a = DFLASH__ACK__INIT;
    a.message = "registered";
    a.epoch = r->epoch;
    a.step = atomic_load(&c->v.js->h->committed_step);
    reply_ack(c, m->id, m->idlen, e->request_id, &a);
}

static void handle_heartbeat(control *c, const ctl_msg *m, const Dflash__Envelope *e)
{
    const Dflash__Heartbeat *h = e->heartbeat;
    int slot = worker_of_peer(c, m, e->request_id, NULL, 0, h->epoch, 0);
    if (slot < 0) return;
    worker_ctl *ws = &c->ws[slot];
    if (ws->epoch != h->epoch) ws->gpu[0] = '\0'; /* known from a heartbeat only (after our own restart) */
    ws->epoch = h->epoch;
    ws->last_hb_ns = job_now_ns();
    ws->held = h->activity == DFLASH__WORKER_ACTIVITY__WORKER_ACTIVITY_HELD;
    Dflash__Envelope out;
    Dflash__Heartbeat back = DFLASH__HEARTBEAT__INIT;
    ctl_envelope_init(&out, e->request_id);
    back.epoch = h->epoch;
    back.step = atomic_load(&c->v.js->h->committed_step);
    back.paused = atomic_load(&c->v.js->h->paused) != 0;
    out.body_case = DFLASH__ENVELOPE__BODY_HEARTBEAT;
    out.heartbeat = &back;
    send_to(c, m->id, m->idlen, &out);
}

/* The control registration of entry `slot` belongs to its current instance. */
static int ctl_current(const control *c, int slot)
{
    const job_worker *w = slot_worker(c, slot);
    return c->ws[slot].epoch && c->ws[slot].epoch == atomic_load(&w->epoch) && atomic_load(&w->pid);
}

/* Paused, and every drafter holds between steps: the step counter cannot move. */
static int job_held(const control *c)
{
    if (!atomic_load(&c->v.js->h->paused)) return 0;
    for (int i = 0; i < c->v.plan->cfg.workers.drafters; i++) {
        int s = worker_slot(c, JOB_ROLE_DRAFTER, i);
        if (s < 0 || !ctl_current(c, s) || !c->ws[s].held) return 0;
    }
    return 1;
}

static const char *worker_state(const control *c, int slot)
{
    const job_worker *w = slot_worker(c, slot);
    if (!atomic_load(&w->pid)) return "down";
    if (atomic_load(&w->restart_requested)) return "restarting";
    if (!atomic_load(&w->ready)) return "starting";
    if (ctl_current(c, slot) && c->ws[slot].held && atomic_load(&c->v.js->h->paused)) return "held";
    return "running";
}

/* ---- stalls ---- */

/* What a pipeline that commits no step waits on, from the rings and the worker table. */
static void stall_diagnose(const control *c, char *out, size_t n)
{
    size_t o = 0;
    const enum job_role roles[] = {JOB_ROLE_PREFETCH, JOB_ROLE_TARGET, JOB_ROLE_DRAFTER};
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < role_count(c, roles[r]); i++) {
            int slot = worker_slot(c, roles[r], i);
            const char *st = slot >= 0 ? worker_state(c, slot) : "down";
            if (strcmp(st, "running") && o < n)
                o += (size_t)snprintf(out + o, n - o, "%s-%d is %s; ", job_role_name(roles[r]), i, st);
        }
    int fr, fi, rd, le, prd = 0, ple = 0, pfi = 0;
    token_ring_stats(c->v.ring, &fr, &fi, &rd, &le);
    for (int i = 0; i < c->v.npools; i++) {
        int a, b, d, e;
        slot_pool_stats(c->v.pools[i], &a, &b, &d, &e);
        prd += d, ple += e, pfi += b;
    }
    if (o >= n) return;
    /* A target claims its slot (filling) before it leases a batch, and a step needs one batch per drafter: with no
     * batch in the ring or leased from it and no slot ready, filling slots and leased ones wait on the data. */
    if (rd == 0 && le == 0 && prd == 0)
        snprintf(out + o, n - o,
                 "the token ring holds no batch (%d slot(s) claimed by targets, %d leased by drafters): waiting on "
                 "prefetch-0 (data)",
                 pfi, ple);
    else if (prd == 0)
        snprintf(out + o, n - o, "no hidden-state slot is ready (%d filling, %d leased): waiting on the targets", pfi,
                 ple);
    else
        snprintf(out + o, n - o, "%d hidden-state slot(s) ready, %d leased: waiting on the drafters", prd, ple);
}

/* When dflashd cannot write the ledger (job_write_block): what it says. */
static int ledger_block_text(const control *c, char *out, size_t n)
{
    job_write_block *b = &c->v.js->h->ledger_block;
    uint32_t e = atomic_load_explicit(&b->err, memory_order_acquire);
    if (!e) return 0;
    snprintf(out, n,
             "dflashd cannot write the ledger line of step %llu (%.*s): nothing is lost, the steps wait in the job "
             "state (the drafters hold once %d are waiting); it retries and goes on once it can write (free space "
             "or fix the folder's permissions)",
             (unsigned long long)atomic_load(&b->step), (int)sizeof b->msg, b->msg, JOB_RECORD_RING);
    return 1;
}

/* When drafter-0 cannot write a checkpoint (job_write_block), or dflashd the ledger: what it says, for the log, the
 * console and status. */
static int write_block_text(const control *c, char *out, size_t n)
{
    job_write_block *b = &c->v.js->h->write_block;
    uint32_t e = atomic_load_explicit(&b->err, memory_order_acquire);
    if (!e || atomic_load(&b->abandoned)) return ledger_block_text(c, out, n);
    snprintf(out, n,
             "drafter-0 cannot write the checkpoint of step %llu (%s: %.*s): the job holds at step %llu, nothing is "
             "lost; it retries every %g s and goes on once it can write (free space or fix the folder's "
             "permissions), or `dflashctl drain` ends it without this checkpoint",
             (unsigned long long)atomic_load(&b->step), strerror((int)e), (int)sizeof b->msg, b->msg,
             (unsigned long long)atomic_load(&b->step), c->v.plan->cfg.train.checkpoint_retry_sec);
    return 1;
}

/* Report a ledger line that cannot be written, and its end, once each. */
static void check_ledger_block(control *c)
{
    job_write_block *b = &c->v.js->h->ledger_block;
    uint32_t e = atomic_load_explicit(&b->err, memory_order_acquire);
    if (e == c->ledger_seen) return;
    char text[1024];
    if (e && ledger_block_text(c, text, sizeof text)) { /* the ledger module logged the error itself */
        c->ledger_step = atomic_load(&b->step);
        sd_notifyf(0, "X_DFLASH_STALLED=%s", text);
    } else if (!e) {
        sd_notifyf(0, "X_DFLASH_STALLED=the ledger line of step %llu is written (after %llu attempts): the job goes on",
                   (unsigned long long)c->ledger_step, (unsigned long long)atomic_load(&b->attempts));
    }
    c->ledger_seen = e;
}

/* Report a checkpoint that cannot be written, and its end, once each: dflashd's log and `dflash run`'s console. */
static void check_write_block(control *c)
{
    check_ledger_block(c);
    job_write_block *b = &c->v.js->h->write_block;
    uint32_t e = atomic_load_explicit(&b->err, memory_order_acquire);
    if (e == c->block_seen) return;
    char text[1024];
    if (e && write_block_text(c, text, sizeof text)) {
        c->block_step = atomic_load(&b->step);
        log_error("%s", text);
        sd_notifyf(0, "X_DFLASH_STALLED=%s", text);
    } else if (!e) {
        snprintf(text, sizeof text, "the checkpoint of step %llu is written (after %llu attempts): the job goes on",
                 (unsigned long long)c->block_step, (unsigned long long)atomic_load(&b->attempts));
        log_info("%s", text);
        sd_notifyf(0, "X_DFLASH_STALLED=%s", text);
    }
    c->block_seen = e;
}

/* Seconds without a committed step while the job runs (0: moving, paused, finished, holding on a checkpoint that
 * cannot be written (reported on its own), or under the threshold). */
static double stall_seconds(control *c, double now)
{
    job_state_header *h = c->v.js->h;
    uint64_t step = atomic_load(&h->committed_step);
    if (step != c->last_step || !c->last_step_at || atomic_load(&h->paused) || atomic_load(&h->finished) ||
        atomic_load(&h->write_block.err) || atomic_load(&h->ledger_block.err)) {
        c->last_step = step;
        c->last_step_at = now;
        c->stall_warned_at = 0;
        return 0;
    }
    double idle = now - c->last_step_at;
    return idle >= c->v.plan->cfg.workers.stall_warn_sec ? idle : 0;
}

static void check_stall(control *c, double now)
{
    double idle = stall_seconds(c, now);
    if (!idle || (c->stall_warned_at && now - c->stall_warned_at < c->v.plan->cfg.workers.stall_warn_sec)) return;
    char why[512];
    stall_diagnose(c, why, sizeof why);
    log_warn("stalled: no step committed for %.0f s (at step %llu): %s", idle, (unsigned long long)c->last_step, why);
    sd_notifyf(0, "X_DFLASH_STALLED=stalled: no step committed for %.0f s (at step %llu): %s", idle,
               (unsigned long long)c->last_step, why);
    c->stall_warned_at = now;
}

/* ---- status ---- */

typedef struct status_buf {
    Dflash__WorkerStatus ws[JOB_MAX_WORKERS];
    Dflash__WorkerStatus *wp[JOB_MAX_WORKERS];
    char names[JOB_MAX_WORKERS][32], gpus[JOB_MAX_WORKERS][64];
    Dflash__RingStatus ring, pools[JOB_MAX_TARGETS];
    Dflash__RingStatus *pp[JOB_MAX_TARGETS];
    char pool_names[JOB_MAX_TARGETS][32];
    Dflash__RollingStatus rolling;
    char rolling_role[16];
    double slot_acc[DFLASH_MAX_BLOCK];
    Dflash__EvalStatus eval;
    double eval_slots[DFLASH_MAX_BLOCK];
    char waiting[1024];
    char resharded[1024];
    Dflash__StatusReply s;
} status_buf;

static void ring_fill(Dflash__RingStatus *r, char *name, uint32_t slots, int fr, int fi, int rd, int le)
{
    dflash__ring_status__init(r);
    r->name = name;
    r->slots = slots;
    r->free = (uint32_t)fr;
    r->filling = (uint32_t)fi;
    r->ready = (uint32_t)rd;
    r->leased = (uint32_t)le;
}

/* The status reply's figures, the one place they are gathered (dflashctl status, and /metrics through
 * control_status_pack); s and what it points to live in b. */
static void status_build(control *c, status_buf *b)
{
    const job_config *cfg = &c->v.plan->cfg;
    job_state_header *h = c->v.js->h;
    Dflash__StatusReply *s = &b->s;
    dflash__status_reply__init(s);
    s->job = (char *)cfg->job.name;
    s->run_id = h->run_id;
    s->step = atomic_load(&h->committed_step);
    s->total_steps = h->total_steps;
    s->stop_step = atomic_load(&h->stop_step);
    s->paused = atomic_load(&h->paused) != 0;
    s->held = job_held(c);
    s->finished = atomic_load(&h->finished) != 0;
    s->ledger_steps = atomic_load(&h->ledger_frontier);
    s->skipped_steps = atomic_load(&h->skipped_steps);
    step_plan_describe(&h->plan, b->resharded, sizeof b->resharded);
    s->resharded = b->resharded;
    s->keeper_pid = (int32_t)getpid();
    s->next_batch = token_ring_next_id_peek(c->v.ring);
    if ((s->stalled_sec = stall_seconds(c, now_seconds())) > 0) stall_diagnose(c, b->waiting, sizeof b->waiting);
    else write_block_text(c, b->waiting, sizeof b->waiting); /* holding: waiting_on says why, stalled_sec stays 0 */
    s->waiting_on = b->waiting;
    if (s->step > 0) { /* the last committed step's records, summed over ranks as the drafters report them */
        step_summary sm;
        step_metrics_sum(&sm, h->records[(s->step - 1) % JOB_RECORD_RING], h->ndrafters, s->step - 1);
        s->loss = sm.loss;
        s->acceptance = sm.acceptance;
        s->slot_accuracy = sm.slot_accuracy;
        for (int i = 1; i < c->v.plan->drafter.block_size && i < DFLASH_MAX_BLOCK; i++)
            b->slot_acc[s->n_slot_accuracies++] = step_metrics_slot_accuracy(&sm, i);
        s->slot_accuracies = b->slot_acc;
    }
    int fr, fi, rd, le;
    token_ring_stats(c->v.ring, &fr, &fi, &rd, &le);
    ring_fill(&b->ring, "token-ring", token_ring_geometry_get(c->v.ring).nslots, fr, fi, rd, le);
    s->token_ring = &b->ring;
    for (int i = 0; i < c->v.npools && i < JOB_MAX_TARGETS; i++) {
        slot_pool_stats(c->v.pools[i], &fr, &fi, &rd, &le);
        snprintf(b->pool_names[i], sizeof b->pool_names[i], "pool-%d", i);
        ring_fill(&b->pools[i], b->pool_names[i], slot_pool_nslots(c->v.pools[i]), fr, fi, rd, le);
        b->pp[s->n_pools++] = &b->pools[i];
    }
    s->pools = b->pp;
    uint64_t now = job_now_ns();
    job_eval ev;
    if (job_eval_read(c->v.js, &ev) == 0) { /* the evaluation worker's last result */
        dflash__eval_status__init(&b->eval);
        b->eval.step = ev.step;
        b->eval.tau = ev.tau;
        b->eval.prompts = ev.prompts;
        b->eval.speedup = ev.speedup;
        b->eval.seconds = ev.seconds;
        for (uint32_t k = 1; k < ev.block_size && k < DFLASH_MAX_BLOCK; k++)
            b->eval_slots[b->eval.n_slot_acceptance++] = ev.per_slot[k];
        b->eval.slot_acceptance = b->eval_slots;
        s->eval = &b->eval;
    }
    const enum job_role *roles = job_roles;
    for (int r = 0; r < JOB_NROLES; r++) {
        for (int i = 0; i < role_count(c, roles[r]); i++) {
            int slot = worker_slot(c, roles[r], i);
            if (slot < 0) continue;
            const job_worker *w = slot_worker(c, slot);
            size_t n = s->n_workers++;
            Dflash__WorkerStatus *o = &b->ws[n];
            dflash__worker_status__init(o);
            b->wp[n] = o;
            snprintf(b->names[n], sizeof b->names[n], "%s-%d", job_role_name(roles[r]), i);
            o->name = b->names[n];
            o->role = (char *)job_role_name(roles[r]);
            o->index = i;
            int cur = ctl_current(c, slot);
            snprintf(b->gpus[n], sizeof b->gpus[n], "%s", cur && c->ws[slot].gpu[0] ? c->ws[slot].gpu : "-");
            o->gpu = b->gpus[n];
            o->pid = atomic_load(&w->pid);
            o->state = (char *)worker_state(c, slot);
            o->epoch = atomic_load(&w->epoch);
            uint64_t st = atomic_load(&w->started_ns);
            o->uptime_sec = o->pid && st && now > st ? (double)(now - st) / 1e9 : 0;
            uint64_t starts = atomic_load(&w->starts);
            o->restarts = starts > 0 ? starts - 1 : 0;
            o->batches = atomic_load(&w->batches);
            o->tokens = atomic_load(&w->tokens);
            o->tokens_per_sec = o->pid ? c->ws[slot].tokens_per_sec : 0;
            uint64_t hb = atomic_load(&w->heartbeat_ns); /* the sign of life dflashd judges by (main.c) */
            o->heartbeat_age_sec = o->pid && hb && now > hb ? (double)(now - hb) / 1e9 : -1;
            o->ready = atomic_load(&w->ready) != 0;
        }
    }
    s->workers = b->wp;
    dflash__rolling_status__init(&b->rolling);
    b->rolling.active = c->op->active;
    snprintf(b->rolling_role, sizeof b->rolling_role, "%s", c->op->role ? job_role_name(c->op->role) : "");
    b->rolling.role = b->rolling_role;
    b->rolling.current = c->op->first + c->op->cur;
    b->rolling.done = c->op->done;
    b->rolling.total = c->op->count;
    b->rolling.error = c->op->error;
    b->rolling.id = c->op->id;
    s->rolling = &b->rolling;
}

static void handle_status(control *c, const ctl_msg *m, const Dflash__Envelope *e)
{
    status_buf *b = xcalloc(1, sizeof *b);
    status_build(c, b);
    Dflash__Envelope out;
    ctl_envelope_init(&out, e->request_id);
    out.body_case = DFLASH__ENVELOPE__BODY_STATUS_REPLY;
    out.status_reply = &b->s;
    send_to(c, m->id, m->idlen, &out);
    free(b);
}

uint8_t *control_status_pack(control *c, size_t *len)
{
    status_buf *b = xcalloc(1, sizeof *b);
    status_build(c, b);
    *len = dflash__status_reply__get_packed_size(&b->s);
    uint8_t *out = xmalloc(*len ? *len : 1);
    dflash__status_reply__pack(&b->s, out);
    free(b);
    return out;
}

/* ---- commands ---- */

static void handle_pause(control *c, const ctl_msg *m, const Dflash__Envelope *e, int pause)
{
    job_state_header *h = c->v.js->h;
    if (pause && atomic_load(&h->stop_step)) {
        reply_error(c, m, e->request_id, DFLASH__ERROR_CODE__ERROR_CODE_REFUSED, "the job is draining: no pause");
        return;
    }
    uint32_t was = atomic_exchange(&h->paused, (uint32_t)pause);
    job_state_wake(c->v.js);
    if (was != (uint32_t)pause) log_info("control: %s at step %llu", pause ? "pause" : "resume",
                                         (unsigned long long)atomic_load(&h->committed_step));
    Dflash__Ack a = DFLASH__ACK__INIT;
    a.message = pause ? "pausing: the step in flight finishes, then every worker holds"
                : was ? "resumed" : "not paused: nothing to resume";
    a.step = atomic_load(&h->committed_step);
    a.done = pause ? job_held(c) : 1;
    reply_ack(c, m->id, m->idlen, e->request_id, &a);
}

static void add_waiter(control *c, const ctl_msg *m, uint64_t req)
{
    int i;
    for (i = 0; i < c->nwaiters; i++)
        if (c->waiters[i].idlen == m->idlen && !memcmp(c->waiters[i].id, m->id, m->idlen)) break;
    if (i == c->nwaiters) {
        if (c->nwaiters == CONTROL_MAX_WAITERS) return; /* they still see it in status */
        c->nwaiters++;
    }
    memcpy(c->waiters[i].id, m->id, m->idlen);
    c->waiters[i].idlen = m->idlen;
    c->waiters[i].request_id = req;
}

static int drain_done(const control *c)
{
    job_state_header *h = c->v.js->h;
    return atomic_load(&h->finished) && atomic_load(&h->ledger_frontier) >= job_state_last_step(c->v.js);
}

static void handle_drain(control *c, const ctl_msg *m, const Dflash__Envelope *e)
{
    job_state_header *h = c->v.js->h;
    uint64_t stop = atomic_load(&h->stop_step);
    if (!stop && !atomic_load(&h->finished)) {
        /* every batch already issued into the token ring belongs to a step up to this one */
        uint64_t next = token_ring_next_id_peek(c->v.ring);
        uint64_t committed = atomic_load(&h->committed_step);
        stop = step_plan_steps_covering(&h->plan, next);
        if (stop < committed) stop = committed;
        if (stop == 0) stop = 1; /* 0 would mean "no drain" */
        if (stop > h->total_steps) stop = h->total_steps;
        atomic_store(&h->stop_step, stop);
        log_info("control: drain: training stops after step %llu (batches issued: %llu, committed steps: %llu)",
                 (unsigned long long)stop, (unsigned long long)next, (unsigned long long)committed);
    }
    atomic_store(&h->paused, 0); /* a held job could not reach the stop step */
    job_state_wake(c->v.js);
    Dflash__Ack a = DFLASH__ACK__INIT;
    char msg[128];
    snprintf(msg, sizeof msg, "draining: training up to step %llu, then checkpoint and stop", (unsigned long long)stop);
    a.message = msg;
    a.stop_step = stop ? stop : job_state_last_step(c->v.js);
    a.step = atomic_load(&h->committed_step);
    a.done = drain_done(c);
    if (!a.done) add_waiter(c, m, e->request_id);
    reply_ack(c, m->id, m->idlen, e->request_id, &a);
}

/* The job is finished for the workers of role: training is, and (the evaluation worker) it has nothing left. */
static int role_finished(const control *c, enum job_role role)
{
    const job_state_header *h = c->v.js->h;
    return atomic_load(&h->finished) && (role != JOB_ROLE_EVAL || atomic_load(&h->eval.ended));
}

static int rolling_start(control *c, const ctl_msg *m, uint64_t req, enum job_role role, int first, int count)
{
    job_state_header *h = c->v.js->h;
    const char *why = c->op->active ? "a restart is already running" : role_finished(c, role) ? "the job is finished"
                      : atomic_load(&h->stop_step) ? "the job is draining"
                      /* the new instance must come back and prove healthy: a paused job would keep the caller (and
                       * every other restart) waiting until resume, without a word */
                      : atomic_load(&h->paused) ? "the job is paused: resume it first (dflashctl resume), then restart"
                      : NULL;
    if (why) {
        reply_error(c, m, req, DFLASH__ERROR_CODE__ERROR_CODE_REFUSED, "%s", why);
        return -1;
    }
    *c->op = (job_restart_op){.active = 1, .role = (uint32_t)role, .first = first, .count = count, .id = req};
    log_info("control: restart of %s %d..%d, one at a time", job_role_name(role), first, first + count - 1);
    return 0;
}

static void handle_restart(control *c, const ctl_msg *m, const Dflash__Envelope *e)
{
    const char *name = e->restart->worker;
    enum job_role role;
    int index, slot;
    if (ctl_worker_name_parse(name, strlen(name), &role, &index) || (slot = worker_slot(c, role, index)) < 0) {
        reply_error(c, m, e->request_id, DFLASH__ERROR_CODE__ERROR_CODE_UNKNOWN_WORKER,
                    "no worker \"%.64s\" in job %s (names: prefetch-0, target-N, drafter-N)", name,
                    c->v.plan->cfg.job.name);
        return;
    }
    if (rolling_start(c, m, e->request_id, role, index, 1)) return;
    Dflash__Ack a = DFLASH__ACK__INIT;
    a.message = "restarting";
    a.epoch = atomic_load(&slot_worker(c, slot)->epoch);
    reply_ack(c, m->id, m->idlen, e->request_id, &a);
}

static void handle_rolling(control *c, const ctl_msg *m, const Dflash__Envelope *e)
{
    enum job_role role = ctl_role_parse(e->rolling_restart->role);
    if (role == JOB_ROLE_NONE) {
        reply_error(c, m, e->request_id, DFLASH__ERROR_CODE__ERROR_CODE_UNKNOWN_WORKER,
                    "no role \"%.64s\" (roles: prefetch, target, drafter, eval)", e->rolling_restart->role);
        return;
    }
    if (rolling_start(c, m, e->request_id, role, 0, role_count(c, role))) return;
    Dflash__Ack a = DFLASH__ACK__INIT;
    a.message = "rolling restart started";
    reply_ack(c, m->id, m->idlen, e->request_id, &a);
}

static void handle_config(control *c, const ctl_msg *m, const Dflash__Envelope *e)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        reply_error(c, m, e->request_id, DFLASH__ERROR_CODE__ERROR_CODE_FAILED, "open_memstream: %s", strerror(errno));
        return;
    }
    config_dump(job_config_table, &c->v.plan->cfg, f);
    fclose(f);
    Dflash__Envelope out;
    Dflash__ConfigReply r = DFLASH__CONFIG_REPLY__INIT;
    ctl_envelope_init(&out, e->request_id);
    r.text = text;
    out.body_case = DFLASH__ENVELOPE__BODY_CONFIG_REPLY;
    out.config_reply = &r;
    send_to(c, m->id, m->idlen, &out);
    free(text);
}

static void handle_message(control *c, const ctl_msg *m)
{
    if (m->nframes != 1) {
        reply_error(c, m, 0, DFLASH__ERROR_CODE__ERROR_CODE_MALFORMED, "%d frames: one Envelope frame expected",
                    m->nframes);
        return;
    }
    Dflash__Envelope *e = NULL;
    errbuf err = {{0}};
    int rc = ctl_envelope_decode(&e, m->data, m->len, &err);
    if (rc) {
        reply_error(c, m, e ? e->request_id : 0,
                    rc == -EMSGSIZE ? DFLASH__ERROR_CODE__ERROR_CODE_TOO_LARGE
                    : rc == -EPROTO ? DFLASH__ERROR_CODE__ERROR_CODE_VERSION : DFLASH__ERROR_CODE__ERROR_CODE_MALFORMED,
                    "%s", err.msg);
        ctl_envelope_destroy(&e);
        return;
    }
    /* a read-only client key (control.curve_readonly_keys_file) may look, not steer nor pose as a worker */
    if (!strcmp(m->user, ZAP_USER_READONLY) && e->body_case != DFLASH__ENVELOPE__BODY_STATUS_REQUEST &&
        e->body_case != DFLASH__ENVELOPE__BODY_CONFIG_REQUEST) {
        reply_error(c, m, e->request_id, DFLASH__ERROR_CODE__ERROR_CODE_FORBIDDEN,
                    "this client's key is read-only (control.curve_readonly_keys_file): status and config only");
        ctl_envelope_destroy(&e);
        return;
    }
    if (e->body_case != DFLASH__ENVELOPE__BODY_REGISTER_WORKER && e->body_case != DFLASH__ENVELOPE__BODY_HEARTBEAT &&
        claim_refused(c, m, e->request_id)) {
        ctl_envelope_destroy(&e);
        return;
    }
    switch (e->body_case) {
    case DFLASH__ENVELOPE__BODY_REGISTER_WORKER: handle_register(c, m, e); break;
    case DFLASH__ENVELOPE__BODY_HEARTBEAT: handle_heartbeat(c, m, e); break;
    case DFLASH__ENVELOPE__BODY_STATUS_REQUEST: handle_status(c, m, e); break;
    case DFLASH__ENVELOPE__BODY_PAUSE: handle_pause(c, m, e, 1); break;
    case DFLASH__ENVELOPE__BODY_RESUME: handle_pause(c, m, e, 0); break;
    case DFLASH__ENVELOPE__BODY_DRAIN: handle_drain(c, m, e); break;
    case DFLASH__ENVELOPE__BODY_RESTART: handle_restart(c, m, e); break;
    case DFLASH__ENVELOPE__BODY_ROLLING_RESTART: handle_rolling(c, m, e); break;
    case DFLASH__ENVELOPE__BODY_CONFIG_REQUEST: handle_config(c, m, e); break;
    default:
        reply_error(c, m, e->request_id, DFLASH__ERROR_CODE__ERROR_CODE_UNKNOWN_COMMAND,
                    "unknown command (envelope body %d)", (int)e->body_case);
        break;
    }
    ctl_envelope_destroy(&e);
}

/* ---- timers ---- */

static void sample_rates(control *c, uint64_t now)
{
    for (int i = 0; i < JOB_MAX_WORKERS; i++) {
        const job_worker *w = slot_worker(c, i);
        if (!atomic_load(&w->role)) continue;
        worker_ctl *ws = &c->ws[i];
        uint64_t t = atomic_load(&w->tokens);
        if (ws->sample_ns && now > ws->sample_ns && t >= ws->sample_tokens)
            ws->tokens_per_sec = (double)(t - ws->sample_tokens) / ((double)(now - ws->sample_ns) / 1e9);
        ws->sample_tokens = t;
        ws->sample_ns = now;
    }
}

static void rolling_fail(control *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rolling_fail(control *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->op->error, sizeof c->op->error, fmt, ap);
    va_end(ap);
    c->op->active = 0;
    log_warn("control: restart of %s stopped: %s", job_role_name(c->op->role), c->op->error);
}

/* One worker at a time: ask it to restart, wait until its next instance is ready and has kept heartbeating for
 * CONTROL_HEALTHY_SEC, then the next. */
static void rolling_step(control *c, uint64_t now)
{
    job_restart_op *op = c->op;
    if (!op->active) return;
    int index = op->first + op->cur, slot = worker_slot(c, op->role, index);
    job_worker *w = slot_worker(c, slot);
    if (role_finished(c, op->role)) {
        rolling_fail(c, "the job finished before %s-%d came back", job_role_name(op->role), index);
        return;
    }
    if (!op->requested) {
        op->old_epoch = atomic_load(&w->epoch);
        if (atomic_load(&w->pid)) atomic_store(&w->restart_requested, 1);
        job_state_wake(c->v.js);
        op->requested = 1;
        op->healthy_ns = 0;
        op->deadline = now_seconds() + CONTROL_RESTART_TIMEOUT_SEC;
        log_info("control: restarting %s-%d (epoch %llu)", job_role_name(op->role), index,
                 (unsigned long long)op->old_epoch);
        return;
    }
    int fresh = atomic_load(&w->epoch) != op->old_epoch && atomic_load(&w->ready) &&
                !atomic_load(&w->restart_requested) && ctl_current(c, slot);
    if (!fresh) {
        op->healthy_ns = 0;
    } else if (!op->healthy_ns) {
        op->healthy_ns = now;
    } else if (now - op->healthy_ns >= (uint64_t)(CONTROL_HEALTHY_SEC * 1e9) && c->ws[slot].last_hb_ns > op->healthy_ns) {
        log_info("control: %s-%d is back (epoch %llu, pid %d) and healthy", job_role_name(op->role), index,
                 (unsigned long long)atomic_load(&w->epoch), (int)atomic_load(&w->pid));
        op->done++;
        op->cur++;
        op->requested = 0;
        if (op->cur == op->count) {
            op->active = 0;
            log_info("control: restart of %d %s worker(s) complete", op->count, job_role_name(op->role));
        }
        return;
    }
    if (now_seconds() > op->deadline)
        rolling_fail(c, "%s-%d: no ready and healthy new instance within %.0f s", job_role_name(op->role), index,
                     CONTROL_RESTART_TIMEOUT_SEC);
}

static void notify_drained(control *c)
{
    if (!c->nwaiters || !drain_done(c)) return;
    char msg[CONFIG_STRING_MAX + 1024];
    job_write_block *b = &c->v.js->h->write_block;
    uint64_t step = atomic_load(&c->v.js->h->committed_step);
    if (atomic_load(&b->abandoned))
        snprintf(msg, sizeof msg,
                 "drained: %llu steps trained, but their checkpoint could not be written (%.*s): %s/ckpt/latest is "
                 "the last checkpoint, and --resume repeats the steps after it",
                 (unsigned long long)step, (int)sizeof b->msg, b->msg, c->v.plan->cfg.job.run_dir);
    else
        snprintf(msg, sizeof msg, "drained: %llu steps trained, checkpoint written to %s/ckpt",
                 (unsigned long long)step, c->v.plan->cfg.job.run_dir);
    for (int i = 0; i < c->nwaiters; i++) {
        Dflash__Ack a = DFLASH__ACK__INIT;
        a.message = msg;
        a.step = step;
        a.stop_step = job_state_last_step(c->v.js);
        a.done = 1;
        reply_ack(c, c->waiters[i].id, c->waiters[i].idlen, c->waiters[i].request_id, &a);
    }
    c->nwaiters = 0;
}

/* ---- life cycle ---- */

/* ipc: the socket's folder exists with mode 0750 (owner and group may connect, nobody else). */
static int prepare_ipc(const char *path, errbuf *err)
{
    struct sockaddr_un sa;
    if (strlen(path) >= sizeof sa.sun_path)
        return errbuf_set(err, ENAMETOOLONG, "control.endpoint ipc://%s: path longer than 107 bytes", path);
    char dir[CONFIG_STRING_MAX + 16];
    snprintf(dir, sizeof dir, "%s", path);
    char *d = dirname(dir);
    if (mkdir(d, 0750) != 0 && errno != EEXIST) return errbuf_set(err, errno, "%s: %s", d, strerror(errno));
    if (chmod(d, 0750) != 0) return errbuf_set(err, errno, "chmod 0750 %s: %s", d, strerror(errno));
    return 0;
}

int control_new(control **out, const control_view *view, errbuf *err)
{
    control *c = xcalloc(1, sizeof *c);
    int rc = 0, one = 1, linger = 1000, hwm = 1000;
    c->v = *view;
    c->op = &view->js->h->restart_op;
    if (c->op->active) { /* begun by the dflashd before this one: carry it on (heartbeats are counted afresh) */
        c->op->healthy_ns = 0;
        log_info("control: carrying on the restart of %s %d..%d begun before dflashd restarted (%d of %d done)",
                 job_role_name(c->op->role), c->op->first, c->op->first + c->op->count - 1, c->op->done, c->op->count);
    }
    const job_config *cfg = &view->plan->cfg;
    ctl_endpoint(cfg, c->endpoint, sizeof c->endpoint);
    int ipc = strncmp(c->endpoint, "ipc://", 6) == 0;
    if (ipc && (cfg->control.curve_client_keys_file[0] || cfg->control.curve_readonly_keys_file[0])) {
        /* the folder's mode guards an ipc socket; a key list there would guard nothing: say so, do not ignore it */
        rc = errbuf_set(err, EINVAL, "control.%s is set but control.endpoint %s is not tcp://: the key lists apply to "
                        "tcp endpoints only", cfg->control.curve_client_keys_file[0] ? "curve_client_keys_file"
                        : "curve_readonly_keys_file", c->endpoint);
        goto fail;
    }
    if (ipc && (rc = prepare_ipc(c->endpoint + 6, err))) goto fail;
    c->ctx = zmq_ctx_new();
    if (!c->ctx || !(c->sock = zmq_socket(c->ctx, ZMQ_ROUTER))) {
        rc = errbuf_set(err, errno, "control: zmq socket: %s", zmq_strerror(errno));
        goto fail;
    }
    int64_t maxmsg = CTL_MSG_MAX;
    if (zmq_setsockopt(c->sock, ZMQ_ROUTER_HANDOVER, &one, sizeof one) ||
        zmq_setsockopt(c->sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one) ||
        zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger) ||
        zmq_setsockopt(c->sock, ZMQ_SNDHWM, &hwm, sizeof hwm) ||
        zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg)) {
        rc = errbuf_set(err, errno, "control: socket options: %s", zmq_strerror(errno));
        goto fail;
    }
    if (!ipc) { /* anything that leaves the host is encrypted and authenticated by the server key */
        char key[41];
        if (!cfg->control.curve_secret_key_file[0]) {
            rc = errbuf_set(err, EPERM, "control.endpoint %s: only ipc:// without control.curve_secret_key_file",
                            c->endpoint);
            goto fail;
        }
        if ((rc = ctl_key_read(cfg->control.curve_secret_key_file, "control.curve_secret_key_file", key, err)))
            goto fail;
        if (!zmq_has("curve")) {
            rc = errbuf_set(err, ENOTSUP, "control.endpoint %s: this libzmq has no CURVE support", c->endpoint);
            goto fail;
        }
        if (zmq_setsockopt(c->sock, ZMQ_CURVE_SERVER, &one, sizeof one) ||
            zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, key, 40)) {
            rc = errbuf_set(err, errno, "control: CURVE options: %s", zmq_strerror(errno));
            goto fail;
        }
        /* the allow-list's handler must be there before the first handshake, i.e. before the bind */
        if ((cfg->control.curve_client_keys_file[0] || cfg->control.curve_readonly_keys_file[0]) &&
            (rc = zap_new(&c->zap, c->ctx, cfg->control.curve_client_keys_file, cfg->control.curve_readonly_keys_file,
                            key, err)))
            goto fail;
    }
    if (zmq_bind(c->sock, c->endpoint) != 0) {
        rc = errbuf_set(err, errno, "control.endpoint %s: %s", c->endpoint, zmq_strerror(errno));
        goto fail;
    }
    if (ipc) chmod(c->endpoint + 6, 0660);
    c->bound_ipc = ipc;
    size_t fl = sizeof c->fd;
    if (zmq_getsockopt(c->sock, ZMQ_FD, &c->fd, &fl) != 0) {
        rc = errbuf_set(err, errno, "control: ZMQ_FD: %s", zmq_strerror(errno));
        goto fail;
    }
    log_info("control: serving on %s", c->endpoint);
    *out = c;
    return 0;
fail:
    control_destroy(&c);
    return rc;
}

int control_fd(const control *c) { return c->fd; }

void control_process(control *c)
{
    ctl_msg m;
    for (int i = 0; i < CONTROL_BATCH; i++) {
        int r = ctl_recv(c->sock, 1, &m);
        if (r <= 0) {
            if (r < 0 && r != -EAGAIN && r != -EINTR) log_warn("control: receive: %s", zmq_strerror(-r));
            break;
        }
        handle_message(c, &m);
        ctl_msg_clear(&m);
    }
    double now_s = now_seconds();
    if (now_s - c->last_timers >= 0.1) {
        uint64_t now = job_now_ns();
        c->last_timers = now_s;
        rolling_step(c, now);
        check_stall(c, now_s);
        check_write_block(c);
        if (c->suppressed && now_s - c->warn_window >= CONTROL_WARN_WINDOW_SEC) warn_flush(c, now_s);
        if (now_s - c->last_rates >= 1.0) {
            c->last_rates = now_s;
            sample_rates(c, now);
        }
    }
    notify_drained(c);
    /* ZMQ_FD only signals again once the pending events are read */
    int events;
    size_t el = sizeof events;
    zmq_getsockopt(c->sock, ZMQ_EVENTS, &events, &el);
}

void control_destroy(control **pc)
{
    control *c = *pc;
    if (!c) return;
    if (c->sock) zmq_close(c->sock);
    zap_destroy(&c->zap);
    if (c->ctx) zmq_ctx_term(c->ctx);
    /* libzmq leaves the file of an ipc socket it was given by name: remove it, so that a clean stop reads as one
     * (dflashctl: "no such socket"; a follower of a restart stops waiting). A killed dflashd leaves it, and its
     * successor's bind replaces it. */
    if (c->bound_ipc) unlink(c->endpoint + 6);
    free(c);
    *pc = NULL;
}
