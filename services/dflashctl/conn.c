#include "conn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

struct conn {
    void *ctx, *sock;
    char endpoint[CONFIG_STRING_MAX + 16];
    uint64_t next_id;
};

int conn_open(conn **out, const char *endpoint, const job_config *cfg, const char *server_key_file,
              const char *client_key_file, errbuf *err)
{
    conn *c = xcalloc(1, sizeof *c);
    int rc = 0, zero = 0;
    char id[64];
    snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
    snprintf(id, sizeof id, "dflashctl-%d", (int)getpid());
    c->next_id = (uint64_t)getpid() << 20;
    c->ctx = zmq_ctx_new();
    if (!c->ctx || !(c->sock = zmq_socket(c->ctx, ZMQ_DEALER))) {
        rc = errbuf_set(err, errno, "zmq socket: %s", zmq_strerror(errno));
        goto fail;
    }
    int64_t maxmsg = CTL_MSG_MAX;
    zmq_setsockopt(c->sock, ZMQ_ROUTING_ID, id, strlen(id));
    zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (strncmp(endpoint, "ipc://", 6) && strncmp(endpoint, "tcp://", 6) && strncmp(endpoint, "inproc://", 9)) {
        rc = errbuf_set(err, EPROTONOSUPPORT, "%s: not an endpoint dflashd serves (ipc://PATH or tcp://HOST:PORT)",
                        endpoint);
        goto fail;
    }
    if (conn_socket_gone(endpoint)) { /* else ZeroMQ waits for it to appear */
        rc = errbuf_set(err, ECONNREFUSED, "%s: no such socket (%s): is the job running?", endpoint, strerror(errno));
        goto fail;
    }
    struct stat st; /* a file that is not a socket would only time out ("no answer"): say what it is, at once */
    if (!strncmp(endpoint, "ipc://", 6) && stat(endpoint + 6, &st) == 0 && !S_ISSOCK(st.st_mode)) {
        rc = errbuf_set(err, ENOTSOCK, "%s: %s is not a socket but a %s: not a dflashd control endpoint", endpoint,
                        endpoint + 6, S_ISDIR(st.st_mode) ? "folder" : S_ISREG(st.st_mode) ? "regular file" : "special file");
        goto fail;
    }
    if (server_key_file && server_key_file[0]) rc = ctl_curve_client_key(c->sock, server_key_file, client_key_file, err);
    else if (cfg) rc = ctl_curve_client(c->sock, cfg, endpoint, client_key_file, err);
    else if (strncmp(endpoint, "ipc://", 6) && strncmp(endpoint, "inproc://", 9))
        rc = errbuf_set(err, EPERM, "%s: a tcp endpoint needs --server-key FILE (dflashd's CURVE public key)", endpoint);
    if (rc) goto fail;
    if (zmq_connect(c->sock, endpoint) != 0) {
        rc = errbuf_set(err, errno, "%s: %s", endpoint, zmq_strerror(errno));
        goto fail;
    }
    *out = c;
    return 0;
fail:
    conn_close(&c);
    return rc;
}

int conn_socket_gone(const char *endpoint)
{
    return !strncmp(endpoint, "ipc://", 6) && access(endpoint + 6, F_OK) != 0;
}

int conn_wait(conn *c, uint64_t id, double timeout, Dflash__Envelope **reply, errbuf *err)
{
    double deadline = now_seconds() + timeout;
    *reply = NULL;
    for (;;) {
        double left = deadline - now_seconds();
        if (left <= 0) return errbuf_set(err, ETIMEDOUT, "dflashd at %s: no answer within %.1f s", c->endpoint, timeout);
        zmq_pollitem_t it = {.socket = c->sock, .events = ZMQ_POLLIN};
        int r = zmq_poll(&it, 1, (long)(left * 1000) + 1);
        if (r < 0) {
            if (errno == EINTR) return errbuf_set(err, EINTR, "interrupted");
            return errbuf_set(err, errno, "%s: %s", c->endpoint, zmq_strerror(errno));
        }
        if (r == 0) continue;
        ctl_msg m;
        while (ctl_recv(c->sock, 0, &m) == 1) {
            Dflash__Envelope *e = NULL;
            errbuf derr = {{0}};
            int bad = m.nframes != 1 || ctl_envelope_decode(&e, m.data, m.len, &derr);
            ctl_msg_clear(&m);
            if (bad) {
                ctl_envelope_destroy(&e);
                return errbuf_set(err, EBADMSG, "dflashd at %s sent a malformed reply: %s", c->endpoint,
                                  derr.msg[0] ? derr.msg : "several frames");
            }
            if (e->request_id == id) {
                *reply = e;
                return 0;
            }
            ctl_envelope_destroy(&e); /* a late answer to an earlier request */
        }
    }
}

int conn_request(conn *c, Dflash__Envelope *req, double timeout, Dflash__Envelope **reply, errbuf *err)
{
    req->version = CTL_PROTOCOL_VERSION;
    req->request_id = ++c->next_id;
    uint8_t *buf;
    size_t n;
    int rc = ctl_envelope_encode(req, &buf, &n, err);
    if (rc) return rc;
    /* a DEALER queues until connected: the wait below bounds how long dflashd may take to appear */
    rc = zmq_send(c->sock, buf, n, ZMQ_DONTWAIT) < 0 ? -errno : 0;
    free(buf);
    if (rc) return errbuf_set(err, -rc, "%s: send: %s", c->endpoint, zmq_strerror(-rc));
    return conn_wait(c, req->request_id, timeout, reply, err);
}

void conn_close(conn **pc)
{
    conn *c = *pc;
    if (!c) return;
    if (c->sock) zmq_close(c->sock);
    if (c->ctx) zmq_ctx_term(c->ctx);
    free(c);
    *pc = NULL;
}
