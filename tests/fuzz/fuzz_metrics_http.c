/* libFuzzer target: the input is the raw bytes a client sends on one connection to dflashd's /metrics server. They
 * go through the real request path of services/dflashd/metrics_http.c (libmicrohttpd's parser, the loopback check,
 * the limits, on_request, the rendering of a published status snapshot) over a socketpair handed to the server with
 * metrics_http_add_connection. The server must answer with an HTTP status line or close the connection, never crash
 * (ASan, UBSan), never keep the connection (the exchange reads until the server closes: a connection kept past the
 * end of the request would hang, one leaked would, after METRICS_HTTP_MAX_CONNECTIONS inputs, get the next one
 * refused: both fail here), never answer 500 (the snapshot it renders is a good one), and a 200 is the metrics. The
 * status snapshot is a full one (workers, pools, an eval result, labels that need escaping), published once through
 * metrics_http_tick. One server for the whole run, as dflashd has one. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "services/dflashd/metrics_http.c"
#include "tests/fuzz/metrics_http_client.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What control_status_pack gives dflashd's main loop, here a fixed job of two targets, two drafters and an eval. */
uint8_t *control_status_pack(control *c, size_t *len)
{
    (void)c;
    Dflash__StatusReply s = DFLASH__STATUS_REPLY__INIT;
    s.job = "fuzz \"job\"\\\n";
    s.run_id = "r-1";
    s.step = 1234, s.total_steps = 5000, s.ledger_steps = 1234, s.next_batch = 1300, s.skipped_steps = 1;
    s.loss = 2.5, s.slot_accuracy = 0.5, s.acceptance = 1.75, s.waiting_on = "checkpoint";
    double acc[7] = {0.9, 0.7, 0.5, 0.3, 0.2, 0.1, NAN};
    s.slot_accuracies = acc;
    s.n_slot_accuracies = 7;
    Dflash__RingStatus ring = DFLASH__RING_STATUS__INIT, p0 = DFLASH__RING_STATUS__INIT, p1 = DFLASH__RING_STATUS__INIT;
    Dflash__RingStatus *pools[2] = {&p0, &p1};
    ring.name = "token-ring", ring.slots = 8, ring.free = 2, ring.filling = 1, ring.ready = 4, ring.leased = 1;
    p0.name = "pool-0", p0.slots = 4, p0.leased = 4;
    p1.name = "pool-1", p1.slots = 0;
    s.token_ring = &ring;
    s.pools = pools;
    s.n_pools = 2;
    Dflash__WorkerStatus w[5], *wp[5];
    static const char *const names[5] = {"target-0", "target-1", "drafter-0", "drafter-1", "eval-0"};
    static const char *const roles[5] = {"target", "target", "drafter", "drafter", "eval"};
    for (int i = 0; i < 5; i++) {
        dflash__worker_status__init(&w[i]);
        w[i].name = (char *)names[i], w[i].role = (char *)roles[i], w[i].gpu = i < 4 ? "0" : "-";
        w[i].state = i == 1 ? "restarting" : "running", w[i].pid = i == 1 ? 0 : 100 + i, w[i].restarts = i;
        w[i].tokens = 1000 * i, w[i].tokens_per_sec = 12.5 * i, w[i].heartbeat_age_sec = i == 4 ? -1 : 0.1;
        wp[i] = &w[i];
    }
    s.workers = wp;
    s.n_workers = 5;
    Dflash__EvalStatus ev = DFLASH__EVAL_STATUS__INIT;
    double slots[7] = {0.8, 0.6, 0.4, 0.2, 0.1, 0.05, 0};
    ev.step = 1200, ev.tau = 2.25, ev.prompts = 32, ev.speedup = 1.5, ev.seconds = 4;
    ev.slot_acceptance = slots;
    ev.n_slot_acceptance = 7;
    s.eval = &ev;
    Dflash__RollingStatus roll = DFLASH__ROLLING_STATUS__INIT;
    roll.active = 1, roll.done = 2, roll.total = 5;
    s.rolling = &roll;
    *len = dflash__status_reply__get_packed_size(&s);
    uint8_t *buf = xmalloc(*len ? *len : 1);
    dflash__status_reply__pack(&s, buf);
    return buf;
}

static metrics_http *server;

/* The kinds of answer, each on a branch of its own: libmicrohttpd is not instrumented (its parser's branches are
 * invisible to libFuzzer), so an input that draws a new kind of answer from it is kept for this. */
static volatile unsigned answers[16];
__attribute__((noinline)) static void answered(unsigned kind) { answers[kind]++; }
static void classify(unsigned code)
{
    switch (code) {
    case 0: answered(0); break; /* closed without an answer */
    case 100: answered(1); break;
    case 200: answered(2); break;
    case 400: answered(3); break;
    case 404: answered(4); break;
    case 405: answered(5); break;
    case 413: answered(6); break;
    case 414: answered(7); break;
    case 417: answered(8); break;
    case 431: answered(9); break;
    case 500: answered(10); break;
    case 501: answered(11); break;
    case 505: answered(12); break;
    default: answered(13); break;
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    signal(SIGPIPE, SIG_IGN);
    errbuf err = {{0}};
    if (metrics_http_new_unbound(&server, &err) != 0) {
        fprintf(stderr, "fuzz_metrics_http: %s\n", err.msg);
        abort();
    }
    metrics_http_tick(server, NULL); /* publish the snapshot, as dflashd's main loop does */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int client;
    int rc = metrics_http_client_connect(server, &client);
    if (rc) {
        fprintf(stderr, "fuzz_metrics_http: a loopback connection refused (%s): connections leaked\n", strerror(-rc));
        abort();
    }
    size_t got;
    unsigned code = 0;
    char *r = metrics_http_client_exchange(client, data, size, 4096, &got);
    if (got) { /* an answer: a status line first (MHD may say 100 Continue before the final one) */
        if (got < 13 || (strncmp(r, "HTTP/1.1 ", 9) && strncmp(r, "HTTP/1.0 ", 9)) ||
            sscanf(r + 9, "%3u", &code) != 1 || code < 100 || code > 599) {
            fprintf(stderr, "fuzz_metrics_http: not an HTTP status line: \"%.60s\"\n", r);
            abort();
        }
        if (strstr(r, "does not decode")) abort(); /* the snapshot is good: its rendering never fails */
        if (code == 200) { /* only on_request says 200: the metrics, headers and (GET) body */
            char *end = strstr(r, "\r\n\r\n"), *type = strstr(r, "text/plain; version=0.0.4");
            size_t kept = got < 4096 ? got : 4096;
            if (!end || !type || type > end) abort();
            if (end + 4 < r + kept && strncmp(end + 4, "# HELP dflash_job_info", 22) && strncmp(end + 4, "HTTP/1.", 7))
                abort(); /* after the headers: the rendered metrics, or (HEAD) nothing or the next reply */
        }
    }
    classify(code);
    free(r);
    return 0;
}
