#include "metrics_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dflash.pb-c.h"
#include "log.h"

struct metrics_http {
    struct MHD_Daemon *d;
    pthread_mutex_t mu;
    uint8_t *snap;         /* the published packed StatusReply (under mu) */
    size_t snap_len;
    double snap_at;        /* now_seconds() when it was built */
    uint8_t *pending;      /* built but not yet published (the HTTP thread held mu) */
    size_t pending_len;
    double pending_at, last_built;
    uint64_t gen;          /* counts the snapshots published (under mu) */
    char *text;            /* the rendered text of snapshot `text_gen`, less its age (MHD's one thread only) */
    size_t text_len;
    uint64_t text_gen;
};

/* ---- the listen address ---- */

int metrics_http_parse_listen(const char *value, const char *setting, int *ipv6, uint8_t addr[16], uint16_t *port,
                              errbuf *err)
{
    char host[64];
    const char *colon;
    memset(addr, 0, 16);
    *ipv6 = 0;
    if (value[0] == '[') { /* [::1]:port */
        const char *close = strchr(value, ']');
        if (!close || close[1] != ':' || (size_t)(close - value - 1) >= sizeof host) goto malformed;
        memcpy(host, value + 1, (size_t)(close - value - 1));
        host[close - value - 1] = 0;
        colon = close + 1;
        *ipv6 = 1;
    } else {
        colon = strrchr(value, ':');
        if (!colon || colon == value || (size_t)(colon - value) >= sizeof host || memchr(value, ':', (size_t)(colon - value)))
            goto malformed;
        memcpy(host, value, (size_t)(colon - value));
        host[colon - value] = 0;
    }
    char *end;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || errno || p < 1 || p > 65535 || colon[1] == '+' || colon[1] == '-') goto malformed;
    *port = (uint16_t)p;
    if (*ipv6) {
        if (inet_pton(AF_INET6, host, addr) != 1) goto malformed;
        if (memcmp(addr, &in6addr_loopback, 16)) goto not_loopback;
        return 0;
    }
    if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
    struct in_addr a4;
    if (inet_pton(AF_INET, host, &a4) != 1) goto malformed;
    memcpy(addr, &a4, 4);
    if (addr[0] != 127) goto not_loopback;
    return 0;
malformed:
    return errbuf_set(err, EINVAL, "%s = \"%.200s\": expected a loopback address and a port, e.g. 127.0.0.1:9464 "
                      "or [::1]:9464", setting, value);
not_loopback:
    return errbuf_set(err, EINVAL, "%s = \"%.200s\": not a loopback address: /metrics is served on 127.0.0.0/8 or "
                      "::1 only (a Prometheus elsewhere scrapes it through a proxy or tunnel)", setting, value);
}

/* ---- rendering ---- */

/* A label value in the text format: backslash, double quote and newline escaped. */
static void label_value(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '\\') fputs("\\\\", f);
        else if (*s == '"') fputs("\\\"", f);
        else if (*s == '\n') fputs("\\n", f);
        else fputc(*s, f);
    }
}

static void family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A sample value: integers exactly, the rest with round-trip precision, non-finite as the format spells them. */
static void value(FILE *f, double v)
{
    if (v != v) fputs(" NaN\n", f);
    else if (v > 1.7e308) fputs(" +Inf\n", f);
    else if (v < -1.7e308) fputs(" -Inf\n", f);
    else fprintf(f, " %.17g\n", v);
}

static void scalar(FILE *f, const char *name, const char *type, const char *help, double v)
{
    family(f, name, type, help);
    fputs(name, f);
    value(f, v);
}

static void worker_labels(FILE *f, const Dflash__WorkerStatus *w)
{
    fputs("{role=\"", f);
    label_value(f, w->role);
    fputs("\",worker=\"", f);
    label_value(f, w->name);
    fputs("\"", f);
}

typedef double (*worker_fig)(const Dflash__WorkerStatus *w);
static double w_up(const Dflash__WorkerStatus *w) { return w->pid != 0; }
static double w_ready(const Dflash__WorkerStatus *w) { return w->ready; }
static double w_pid(const Dflash__WorkerStatus *w) { return w->pid; }
static double w_epoch(const Dflash__WorkerStatus *w) { return (double)w->epoch; }
static double w_uptime(const Dflash__WorkerStatus *w) { return w->uptime_sec; }
static double w_restarts(const Dflash__WorkerStatus *w) { return (double)w->restarts; }
static double w_batches(const Dflash__WorkerStatus *w) { return (double)w->batches; }
static double w_tokens(const Dflash__WorkerStatus *w) { return (double)w->tokens; }
static double w_tps(const Dflash__WorkerStatus *w) { return w->tokens_per_sec; }
static double w_hb(const Dflash__WorkerStatus *w) { return w->heartbeat_age_sec; }

/* Every per-worker figure of the status reply: one row each (labels role and worker). */
static const struct {
    const char *name, *type, *help;
    worker_fig fig;
    int skip_negative; /* -1 means "none yet": no sample */
} worker_rows[] = {
    {"dflash_worker_up", "gauge", "1 when the worker has a running instance (a pid)", w_up, 0},
    {"dflash_worker_ready", "gauge", "1 when the worker's instance said READY", w_ready, 0},
    {"dflash_worker_pid", "gauge", "process id of the worker's instance (0: none)", w_pid, 0},
    {"dflash_worker_epoch", "gauge", "epoch of the worker's current instance", w_epoch, 0},
    {"dflash_worker_uptime_seconds", "gauge", "seconds since the worker's instance started", w_uptime, 0},
    {"dflash_worker_restarts_total", "counter", "starts of the worker after its first", w_restarts, 0},
    {"dflash_worker_batches_total", "counter", "batches the worker has handled", w_batches, 0},
    {"dflash_worker_tokens_total", "counter", "tokens the worker has handled", w_tokens, 0},
    {"dflash_worker_tokens_per_second", "gauge", "the worker's recent token rate", w_tps, 0},
    {"dflash_worker_heartbeat_age_seconds", "gauge", "seconds since the worker's last control-plane heartbeat",
     w_hb, 1},
};

static const char *const worker_states[] = {"down", "starting", "running", "held", "restarting"};

static void ring_rows(FILE *f, const char *base, const char *label, Dflash__RingStatus *const *r, size_t n)
{
    char name[96];
    snprintf(name, sizeof name, "%s_capacity_slots", base);
    family(f, name, "gauge", "slots of the ring or pool");
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "%s{%s=\"", name, label);
        label_value(f, r[i]->name);
        fputs("\"}", f);
        value(f, r[i]->slots);
    }
    snprintf(name, sizeof name, "%s_slots", base);
    family(f, name, "gauge", "slots by state (free, filling, ready, leased)");
    for (size_t i = 0; i < n; i++) {
        const uint32_t v[4] = {r[i]->free, r[i]->filling, r[i]->ready, r[i]->leased};
        static const char *const st[4] = {"free", "filling", "ready", "leased"};
        for (int k = 0; k < 4; k++) {
            fprintf(f, "%s{%s=\"", name, label);
            label_value(f, r[i]->name);
            fprintf(f, "\",state=\"%s\"}", st[k]);
            value(f, v[k]);
        }
    }
    snprintf(name, sizeof name, "%s_occupancy_ratio", base);
    family(f, name, "gauge", "share of the slots not free (filling, ready or leased)");
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "%s{%s=\"", name, label);
        label_value(f, r[i]->name);
        fputs("\"}", f);
        value(f, r[i]->slots ? (double)(r[i]->slots - r[i]->free) / r[i]->slots : 0);
    }
}

/* Every figure of the status reply but the snapshot's age (which with_age adds): the text a scrape gets, the same for
 * every scrape of one snapshot. */
static char *render_body(const uint8_t *status, size_t len, size_t *out_len)
{
    Dflash__StatusReply *s = dflash__status_reply__unpack(NULL, len, status);
    if (!s) return NULL;
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) {
        dflash__status_reply__free_unpacked(s, NULL);
        return NULL;
    }
    family(f, "dflash_job_info", "gauge", "the job: its name and run id (always 1)");
    fputs("dflash_job_info{job_name=\"", f);
    label_value(f, s->job);
    fputs("\",run_id=\"", f);
    label_value(f, s->run_id);
    fputs("\"} 1\n", f);
    scalar(f, "dflash_step", "gauge", "committed optimizer steps", (double)s->step);
    scalar(f, "dflash_total_steps", "gauge", "optimizer steps of the whole run", (double)s->total_steps);
    scalar(f, "dflash_stop_step", "gauge", "the step a drain stops after (0: no drain)", (double)s->stop_step);
    scalar(f, "dflash_ledger_steps", "gauge", "steps written to the ledger", (double)s->ledger_steps);
    scalar(f, "dflash_batches_issued_total", "counter", "batches the prefetcher has issued into the token ring",
           (double)s->next_batch);
    scalar(f, "dflash_skipped_steps_total", "counter", "steps the NaN guard did not apply", (double)s->skipped_steps);
    scalar(f, "dflash_paused", "gauge", "1 while the job is paused", s->paused);
    scalar(f, "dflash_held", "gauge", "1 while paused and every drafter holds (the step counter is frozen)", s->held);
    scalar(f, "dflash_finished", "gauge", "1 once training has finished", s->finished);
    scalar(f, "dflash_stalled_seconds", "gauge", "seconds without a committed step past workers.stall_warn_sec (0: "
           "moving)", s->stalled_sec);
    family(f, "dflash_waiting", "gauge", "1 while the job waits or holds (a stall, a checkpoint or ledger line that "
           "cannot be written); the reason is the label");
    fputs("dflash_waiting{reason=\"", f);
    label_value(f, s->waiting_on);
    fprintf(f, "\"} %d\n", s->waiting_on && s->waiting_on[0] ? 1 : 0);
    scalar(f, "dflash_loss", "gauge", "loss of the last committed step", s->loss);
    scalar(f, "dflash_slot_accuracy_ratio", "gauge", "slot accuracy of the last committed step over slots 1..B-1",
           s->slot_accuracy);
    family(f, "dflash_slot_accuracy_by_slot_ratio", "gauge", "accuracy of each block slot in the last committed step");
    for (size_t i = 0; i < s->n_slot_accuracies; i++) {
        fprintf(f, "dflash_slot_accuracy_by_slot_ratio{slot=\"%zu\"}", i + 1);
        value(f, s->slot_accuracies[i]);
    }
    scalar(f, "dflash_simulated_acceptance_length", "gauge", "simulated acceptance length (tau) per block of the "
           "last committed step", s->acceptance);
    if (s->eval) { /* the evaluation worker's last result: tau by decoding held-out prompts */
        scalar(f, "dflash_decoded_acceptance_length", "gauge", "acceptance length (tau) by decoding the held-out "
               "prompts with the drafter of dflash_eval_step (the evaluation worker)", s->eval->tau);
        scalar(f, "dflash_eval_step", "gauge", "the step whose drafter the last evaluation decoded with",
               (double)s->eval->step);
        scalar(f, "dflash_eval_prompts", "gauge", "prompts the last evaluation decoded", (double)s->eval->prompts);
        scalar(f, "dflash_decoded_speedup_ratio", "gauge", "tokens/s of speculative over target-only greedy decoding "
               "in the last evaluation", s->eval->speedup);
        scalar(f, "dflash_eval_duration_seconds", "gauge", "wall clock of the last evaluation", s->eval->seconds);
        family(f, "dflash_decoded_slot_acceptance_ratio", "gauge", "share of the last evaluation's blocks whose "
               "accepted draft reaches each slot");
        for (size_t i = 0; i < s->eval->n_slot_acceptance; i++) {
            fprintf(f, "dflash_decoded_slot_acceptance_ratio{slot=\"%zu\"}", i + 1);
            value(f, s->eval->slot_acceptance[i]);
        }
    }
    Dflash__RingStatus *ring[1] = {s->token_ring};
    if (s->token_ring) ring_rows(f, "dflash_token_ring", "ring", ring, 1);
    ring_rows(f, "dflash_pool", "pool", s->pools, s->n_pools);
    for (size_t r = 0; r < sizeof worker_rows / sizeof worker_rows[0]; r++) {
        family(f, worker_rows[r].name, worker_rows[r].type, worker_rows[r].help);
        for (size_t i = 0; i < s->n_workers; i++) {
            double v = worker_rows[r].fig(s->workers[i]);
            if (worker_rows[r].skip_negative && v < 0) continue;
            fputs(worker_rows[r].name, f);
            worker_labels(f, s->workers[i]);
            fputs("}", f);
            value(f, v);
        }
    }
    family(f, "dflash_worker_state", "gauge", "1 for the worker's current state (down, starting, running, held, "
           "restarting)");
    for (size_t i = 0; i < s->n_workers; i++)
        for (size_t k = 0; k < sizeof worker_states / sizeof worker_states[0]; k++) {
            fputs("dflash_worker_state", f);
            worker_labels(f, s->workers[i]);
            fprintf(f, ",state=\"%s\"} %d\n", worker_states[k], !strcmp(s->workers[i]->state, worker_states[k]));
        }
    family(f, "dflash_worker_info", "gauge", "the worker's GPU (\"-\": none) (always 1)");
    for (size_t i = 0; i < s->n_workers; i++) {
        fputs("dflash_worker_info", f);
        worker_labels(f, s->workers[i]);
        fputs(",gpu=\"", f);
        label_value(f, s->workers[i]->gpu);
        fputs("\"} 1\n", f);
    }
    if (s->rolling) {
        scalar(f, "dflash_rolling_restart_active", "gauge", "1 while a (rolling) restart runs", s->rolling->active);
        scalar(f, "dflash_rolling_restart_done_workers", "gauge", "workers the current or last restart has restarted",
               s->rolling->done);
        scalar(f, "dflash_rolling_restart_planned_workers", "gauge", "workers the current or last restart restarts",
               s->rolling->total);
    }
    scalar(f, "dflash_keeper_pid", "gauge", "process id of dflashd", s->keeper_pid);
    dflash__status_reply__free_unpacked(s, NULL);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    *out_len = n;
    return buf;
}

/* A scrape's text: the rendered body, then the age of the snapshot it shows (malloc'd, NUL-terminated). */
static char *with_age(const char *body, size_t n, double age_sec, size_t *out_len)
{
    char tail[256];
    FILE *f = fmemopen(tail, sizeof tail, "w");
    if (!f) return NULL;
    scalar(f, "dflash_metrics_snapshot_age_seconds", "gauge", "age of the status snapshot this scrape rendered",
           age_sec);
    long k = ftell(f);
    if (fclose(f) != 0 || k <= 0 || (size_t)k >= sizeof tail) return NULL;
    char *text = xmalloc(n + (size_t)k + 1);
    memcpy(text, body, n);
    memcpy(text + n, tail, (size_t)k);
    text[n + k] = 0;
    *out_len = n + (size_t)k;
    return text;
}

char *metrics_http_render(const uint8_t *status, size_t len, double age_sec, size_t *out_len)
{
    size_t n;
    char *body = render_body(status, len, &n);
    char *text = body ? with_age(body, n, age_sec, out_len) : NULL;
    free(body);
    return text;
}

/* ---- the HTTP side (MHD's thread) ---- */

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned int code, const char *text, const char *allow)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    enum MHD_Result ok = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    metrics_http *m = cls;
    int head = !strcmp(method, MHD_HTTP_METHOD_HEAD);
    if (strcmp(method, MHD_HTTP_METHOD_GET) && !head)
        return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n", "GET, HEAD");
    if (*upload_data_size) return reply(conn, MHD_HTTP_BAD_REQUEST, "a GET has no body\n", NULL);
    if (strcmp(url, "/metrics")) return reply(conn, MHD_HTTP_NOT_FOUND, "not found: the metrics are at /metrics\n", NULL);
    /* a snapshot is rendered once, by the first scrape that shows it (copied out under the lock, rendered outside
     * it); the scrapes after it get that text with their own age line: a flood costs a copy each, not a rendering */
    uint8_t *copy = NULL;
    size_t len = 0;
    double at = 0;
    uint64_t gen = 0;
    int have;
    pthread_mutex_lock(&m->mu);
    have = m->snap != NULL;
    gen = m->gen;
    at = m->snap_at;
    if (have && (!m->text || m->text_gen != gen)) {
        copy = xmalloc(m->snap_len ? m->snap_len : 1);
        memcpy(copy, m->snap, m->snap_len);
        len = m->snap_len;
    }
    pthread_mutex_unlock(&m->mu);
    if (!have) return reply(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "no status published yet\n", NULL);
    if (copy) {
        size_t bn = 0;
        char *body = render_body(copy, len, &bn);
        free(copy);
        if (!body) return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "the status snapshot does not decode\n", NULL);
        free(m->text);
        m->text = body;
        m->text_len = bn;
        m->text_gen = gen;
    }
    size_t n = 0;
    char *text = with_age(m->text, m->text_len, now_seconds() - at, &n);
    if (!text) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(n, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result ok = MHD_queue_response(conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

/* Loopback peers only (the socket is bound to loopback: this is the second lock on that door). */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *sa, socklen_t len)
{
    if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in))
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127 ? MHD_YES : MHD_NO;
    if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6))
        return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr) ? MHD_YES : MHD_NO;
    return MHD_NO;
}

static void on_log(void *cls, const char *fmt, va_list ap)
{
    char text[512];
    vsnprintf(text, sizeof text, fmt, ap);
    size_t n = strlen(text);
    while (n && text[n - 1] == '\n') text[--n] = 0;
    log_debug("metrics http: %s", text); /* a malformed request each: a flood must not fill the log */
}

/* The daemon with dflashd's limits: one polling thread, at most METRICS_HTTP_MAX_CONNECTIONS connections (all of
 * them from one peer at most: every peer is loopback), METRICS_HTTP_TIMEOUT_SEC idle, METRICS_HTTP_CONNECTION_MEMORY
 * bytes of buffers each; bound to `sa`, or with no listening socket (sa NULL). NULL when MHD cannot start. */
static metrics_http *start(const struct sockaddr *sa, int v6)
{
    metrics_http *m = xcalloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0) |
                     (sa ? 0 : MHD_USE_NO_LISTEN_SOCKET);
    m->d = MHD_start_daemon(flags, 0, on_accept, NULL, on_request, m,
                            MHD_OPTION_EXTERNAL_LOGGER, on_log, NULL, /* first: MHD says so otherwise */
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)METRICS_HTTP_MAX_CONNECTIONS,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)METRICS_HTTP_MAX_CONNECTIONS,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)METRICS_HTTP_TIMEOUT_SEC,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)METRICS_HTTP_CONNECTION_MEMORY,
                            sa ? MHD_OPTION_SOCK_ADDR : MHD_OPTION_END, sa, MHD_OPTION_END);
    if (!m->d) {
        pthread_mutex_destroy(&m->mu);
        free(m);
        return NULL;
    }
    return m;
}

int metrics_http_new(metrics_http **out, const char *listen, errbuf *err)
{
    *out = NULL;
    if (!listen || !listen[0]) return 0;
    int v6;
    uint8_t addr[16];
    uint16_t port;
    int rc = metrics_http_parse_listen(listen, "control.metrics_listen", &v6, addr, &port, err);
    if (rc) return rc;
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons(port)};
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons(port)};
    memcpy(&a4.sin_addr, addr, 4);
    memcpy(&a6.sin6_addr, addr, 16);
    metrics_http *m = start(v6 ? (struct sockaddr *)&a6 : (struct sockaddr *)&a4, v6);
    if (!m)
        return errbuf_set(err, EADDRNOTAVAIL, "control.metrics_listen = \"%.200s\": cannot serve there (the port in "
                          "use, or the address not on this host)", listen);
    log_info("metrics: Prometheus /metrics on http://%s/metrics", listen);
    *out = m;
    return 0;
}

int metrics_http_new_unbound(metrics_http **out, errbuf *err)
{
    *out = start(NULL, 0);
    return *out ? 0 : errbuf_set(err, EIO, "metrics http: libmicrohttpd did not start (no listening socket)");
}

int metrics_http_add_connection(metrics_http *m, int fd, const struct sockaddr *peer, socklen_t peer_len)
{
    errno = 0;
    return MHD_add_connection(m->d, fd, peer, peer_len) == MHD_YES ? 0 : -(errno ? errno : ECONNREFUSED);
}

void metrics_http_tick(metrics_http *m, control *c)
{
    if (!m) return;
    double now = now_seconds();
    if (!m->pending && now - m->last_built >= METRICS_HTTP_PUBLISH_SEC) {
        m->pending = control_status_pack(c, &m->pending_len);
        m->pending_at = m->last_built = now;
    }
    if (!m->pending || pthread_mutex_trylock(&m->mu) != 0) return; /* never wait on a scrape: next tick */
    uint8_t *old = m->snap;
    m->snap = m->pending;
    m->snap_len = m->pending_len;
    m->snap_at = m->pending_at;
    m->gen++;
    pthread_mutex_unlock(&m->mu);
    m->pending = NULL;
    free(old);
}

void metrics_http_destroy(metrics_http **mp)
{
    metrics_http *m = *mp;
    if (!m) return;
    MHD_stop_daemon(m->d);
    pthread_mutex_destroy(&m->mu);
    free(m->snap);
    free(m->pending);
    free(m->text);
    free(m);
    *mp = NULL;
}
