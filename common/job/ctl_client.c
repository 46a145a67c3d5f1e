#include "ctl_client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "ctl_proto.h"
#include "log.h"

struct ctl_client {
    void *ctx, *sock;
    char name[32], endpoint[CONFIG_STRING_MAX + 16], gpu[64];
    enum job_role role;
    int index;
    uint64_t epoch, next_id;
    double interval, timeout, last_sent, last_heard, started;
    int held, registered, refused, silent_warned;
};

static void client_send(ctl_client *c, Dflash__Envelope *e)
{
    errbuf err = {{0}};
    int rc = ctl_send(c->sock, NULL, 0, e, &err);
    if (rc && rc != -EAGAIN) log_debug("control: %s", err.msg);
    /* not connected yet (ZMQ_IMMEDIATE): try again soon rather than a whole interval later */
    c->last_sent = now_seconds() - (rc ? c->interval - 0.05 : 0);
}

static void send_register(ctl_client *c)
{
    Dflash__Envelope e;
    Dflash__RegisterWorker r = DFLASH__REGISTER_WORKER__INIT;
    ctl_envelope_init(&e, ++c->next_id);
    r.role = (char *)job_role_name(c->role);
    r.index = c->index;
    r.epoch = c->epoch;
    r.pid = (int32_t)getpid();
    r.gpu = c->gpu;
    e.body_case = DFLASH__ENVELOPE__BODY_REGISTER_WORKER;
    e.register_worker = &r;
    client_send(c, &e);
}

static void send_heartbeat(ctl_client *c)
{
    Dflash__Envelope e;
    Dflash__Heartbeat h = DFLASH__HEARTBEAT__INIT;
    ctl_envelope_init(&e, ++c->next_id);
    h.epoch = c->epoch;
    h.activity = c->held ? DFLASH__WORKER_ACTIVITY__WORKER_ACTIVITY_HELD : DFLASH__WORKER_ACTIVITY__WORKER_ACTIVITY_RUNNING;
    e.body_case = DFLASH__ENVELOPE__BODY_HEARTBEAT;
    e.heartbeat = &h;
    client_send(c, &e);
}

int ctl_client_new(ctl_client **out, const job_config *cfg, enum job_role role, int index, uint64_t epoch,
                   const uint8_t token[JOB_CTL_TOKEN_BYTES], const char *gpu, errbuf *err)
{
    char id[32 + 2 * JOB_CTL_TOKEN_BYTES + 2];
    ctl_client *c = xcalloc(1, sizeof *c);
    int rc = 0, zero = 0, one = 1, hwm = 16;
    c->role = role;
    c->index = index;
    c->epoch = epoch;
    c->interval = cfg->control.heartbeat_sec;
    c->timeout = cfg->workers.heartbeat_timeout_sec;
    snprintf(c->name, sizeof c->name, "%s-%d", job_role_name(role), index);
    size_t o = (size_t)snprintf(id, sizeof id, "%s/", c->name);
    for (int i = 0; i < JOB_CTL_TOKEN_BYTES; i++) o += (size_t)snprintf(id + o, sizeof id - o, "%02x", token[i]);
    snprintf(c->gpu, sizeof c->gpu, "%s", gpu && gpu[0] ? gpu : "none");
    ctl_endpoint(cfg, c->endpoint, sizeof c->endpoint);
    c->ctx = zmq_ctx_new();
    if (!c->ctx || !(c->sock = zmq_socket(c->ctx, ZMQ_DEALER))) {
        rc = errbuf_set(err, errno, "control: zmq socket: %s", zmq_strerror(errno));
        goto fail;
    }
    /* nothing may wait on dflashd: no linger, a short queue, messages only to a live connection */
    if (zmq_setsockopt(c->sock, ZMQ_ROUTING_ID, id, strlen(id)) || zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_setsockopt(c->sock, ZMQ_SNDHWM, &hwm, sizeof hwm) || zmq_setsockopt(c->sock, ZMQ_RCVHWM, &hwm, sizeof hwm) ||
        zmq_setsockopt(c->sock, ZMQ_IMMEDIATE, &one, sizeof one)) {
        rc = errbuf_set(err, errno, "control: socket options: %s", zmq_strerror(errno));
        goto fail;
    }
    int64_t maxmsg = CTL_MSG_MAX;
    zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if ((rc = ctl_curve_client(c->sock, cfg, c->endpoint, NULL, err))) goto fail;
    if (zmq_connect(c->sock, c->endpoint) != 0) {
        rc = errbuf_set(err, errno, "control.endpoint %s: %s", c->endpoint, zmq_strerror(errno));
        goto fail;
    }
    c->started = c->last_heard = now_seconds();
    *out = c;
    return 0;
fail:
    ctl_client_destroy(&c);
    return rc;
}

static void handle_reply(ctl_client *c, const ctl_msg *m)
{
    Dflash__Envelope *e = NULL;
    errbuf err = {{0}};
    if (m->nframes != 1 || ctl_envelope_decode(&e, m->data, m->len, &err)) {
        log_warn("control: malformed message from dflashd (%s): ignored", m->nframes != 1 ? "several frames" : err.msg);
        ctl_envelope_destroy(&e);
        return;
    }
    c->last_heard = now_seconds();
    if (c->silent_warned) {
        log_info("control: dflashd answers again");
        c->silent_warned = 0;
    }
    switch (e->body_case) {
    case DFLASH__ENVELOPE__BODY_ACK: c->registered = 1; break;
    case DFLASH__ENVELOPE__BODY_HEARTBEAT: break;
    case DFLASH__ENVELOPE__BODY_ERROR:
        if (e->error->code == DFLASH__ERROR_CODE__ERROR_CODE_STALE_EPOCH) {
            if (!c->refused) log_error("control: dflashd refused this instance: %s", e->error->message);
            c->refused = 1;
        } else {
            log_warn("control: dflashd: %s", e->error->message);
        }
        break;
    default: log_warn("control: unexpected message (body %d) from dflashd: ignored", (int)e->body_case); break;
    }
    ctl_envelope_destroy(&e);
}

void ctl_client_tick(ctl_client *c)
{
    if (!c) return;
    ctl_msg m;
    for (int i = 0; i < 64 && ctl_recv(c->sock, 0, &m) == 1; i++) {
        handle_reply(c, &m);
        ctl_msg_clear(&m);
    }
    double now = now_seconds();
    if (now - c->last_sent >= c->interval) {
        if (!c->registered) send_register(c);
        else send_heartbeat(c);
    }
    if (!c->silent_warned && now - c->last_heard > c->timeout) {
        log_warn("control: no word from dflashd at %s for %.0f s", c->endpoint, now - c->last_heard);
        c->silent_warned = 1;
        c->registered = 0; /* a restarted dflashd learns about us from the registration again */
    }
}

void ctl_client_set_held(ctl_client *c, int held)
{
    if (!c || c->held == !!held) return;
    c->held = !!held;
    send_heartbeat(c);
}

int ctl_client_refused(const ctl_client *c) { return c && c->refused; }

void ctl_client_destroy(ctl_client **pc)
{
    ctl_client *c = *pc;
    if (!c) return;
    if (c->sock) zmq_close(c->sock);
    if (c->ctx) zmq_ctx_term(c->ctx);
    free(c);
    *pc = NULL;
}
