/* metrics_http: control.metrics_listen accepts loopback address:port only, naming the setting otherwise; the
 * rendering of a status reply has the figures with Prometheus names (the promtool and scrape checks are in
 * tests/system/metrics.sh). The module is compiled in here; control_status_pack is a stub. The request path is driven
 * through the seam (metrics_http_new_unbound, metrics_http_add_connection: socketpairs, no port), as the fuzzer
 * tests/fuzz/fuzz_metrics_http.c does: the answers, the loopback check and the bounds a scrape flood meets. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>

#include "services/dflashd/metrics_http.c"
#include "tests/fuzz/metrics_http_client.h"
#include "tests/test.h"

/* The keeper's status, here one whose step counts the snapshots taken. */
uint8_t *control_status_pack(control *c, size_t *len)
{
    (void)c;
    static uint64_t taken;
    Dflash__StatusReply s = DFLASH__STATUS_REPLY__INIT;
    s.step = taken++;
    *len = dflash__status_reply__get_packed_size(&s);
    uint8_t *buf = xmalloc(*len + 1);
    dflash__status_reply__pack(&s, buf);
    return buf;
}

TEST(listen_accepts_loopback)
{
    const char *good[] = {"127.0.0.1:9464", "localhost:1", "[::1]:65535", "127.1.2.3:80"};
    for (int i = 0; i < 4; i++) {
        int v6;
        uint8_t a[16];
        uint16_t port;
        errbuf err = {{0}};
        EXPECT(metrics_http_parse_listen(good[i], "control.metrics_listen", &v6, a, &port, &err) == 0);
        EXPECT(v6 == (i == 2));
    }
}

TEST(listen_refuses_others_naming_the_setting)
{
    const char *bad[] = {"0.0.0.0:9464", "10.1.2.3:9464", "[::]:9464", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:65536",
                         ":9464", "127.0.0.1:94x", "example.com:80", "", "127.0.0.1:-1", "[::1]9464", "1:2:3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int v6;
        uint8_t a[16];
        uint16_t port;
        errbuf err = {{0}};
        EXPECT(metrics_http_parse_listen(bad[i], "control.metrics_listen", &v6, a, &port, &err) == -EINVAL);
        EXPECT_CONTAINS(err.msg, "control.metrics_listen");
    }
    errbuf err = {{0}};
    int v6;
    uint8_t a[16];
    uint16_t port;
    metrics_http_parse_listen("0.0.0.0:9464", "control.metrics_listen", &v6, a, &port, &err);
    EXPECT_CONTAINS(err.msg, "not a loopback");
}

TEST(render_names_and_labels)
{
    Dflash__StatusReply s = DFLASH__STATUS_REPLY__INIT;
    s.job = "a \"job\"\n";
    s.run_id = "r1";
    s.step = 42;
    s.loss = 1.5;
    double acc[3] = {0.5, 0.25, 0.125};
    s.slot_accuracies = acc;
    s.n_slot_accuracies = 3;
    s.skipped_steps = 2;
    Dflash__RingStatus ring = DFLASH__RING_STATUS__INIT, pool = DFLASH__RING_STATUS__INIT, *pp = &pool;
    ring.name = "token-ring", ring.slots = 4, ring.free = 1, ring.ready = 3;
    pool.name = "pool-0", pool.slots = 2, pool.leased = 2;
    s.token_ring = &ring;
    s.pools = &pp;
    s.n_pools = 1;
    Dflash__WorkerStatus w = DFLASH__WORKER_STATUS__INIT, *wp = &w;
    w.name = "target-0", w.role = "target", w.gpu = "-", w.state = "running", w.pid = 9, w.restarts = 3;
    w.tokens_per_sec = 100.5, w.heartbeat_age_sec = -1;
    s.workers = &wp;
    s.n_workers = 1;
    Dflash__EvalStatus ev = DFLASH__EVAL_STATUS__INIT; /* the evaluation worker's last result */
    double slots[3] = {0.75, 0.5, 0.25};
    ev.step = 40, ev.tau = 2.5, ev.prompts = 64, ev.speedup = 1.75, ev.seconds = 3;
    ev.slot_acceptance = slots;
    ev.n_slot_acceptance = 3;
    s.eval = &ev;
    size_t len = dflash__status_reply__get_packed_size(&s), n;
    uint8_t *buf = xmalloc(len);
    dflash__status_reply__pack(&s, buf);
    char *t = metrics_http_render(buf, len, 0.5, &n);
    REQUIRE(t);
    EXPECT(strlen(t) == n);
    EXPECT_CONTAINS(t, "\ndflash_step 42\n");
    EXPECT_CONTAINS(t, "# TYPE dflash_step gauge\n");
    EXPECT_CONTAINS(t, "dflash_job_info{job_name=\"a \\\"job\\\"\\n\",run_id=\"r1\"} 1\n");
    EXPECT_CONTAINS(t, "dflash_slot_accuracy_by_slot_ratio{slot=\"3\"} 0.125\n");
    EXPECT_CONTAINS(t, "dflash_skipped_steps_total 2\n");
    EXPECT_CONTAINS(t, "dflash_token_ring_occupancy_ratio{ring=\"token-ring\"} 0.75\n");
    EXPECT_CONTAINS(t, "dflash_pool_slots{pool=\"pool-0\",state=\"leased\"} 2\n");
    EXPECT_CONTAINS(t, "dflash_worker_restarts_total{role=\"target\",worker=\"target-0\"} 3\n");
    EXPECT_CONTAINS(t, "dflash_worker_tokens_per_second{role=\"target\",worker=\"target-0\"} 100.5\n");
    EXPECT_CONTAINS(t, "dflash_worker_state{role=\"target\",worker=\"target-0\",state=\"running\"} 1\n");
    EXPECT(!strstr(t, "dflash_worker_heartbeat_age_seconds{")); /* none yet: no sample */
    EXPECT_CONTAINS(t, "\ndflash_decoded_acceptance_length 2.5\n");
    EXPECT_CONTAINS(t, "\ndflash_eval_step 40\n");
    EXPECT_CONTAINS(t, "\ndflash_eval_prompts 64\n");
    EXPECT_CONTAINS(t, "\ndflash_decoded_speedup_ratio 1.75\n");
    EXPECT_CONTAINS(t, "dflash_decoded_slot_acceptance_ratio{slot=\"2\"} 0.5\n");
    free(t);
    EXPECT(metrics_http_render((const uint8_t *)"\xff\xff\xff", 3, 0, &n) == NULL);
    free(buf);
}

static char *ask(metrics_http *m, const char *req)
{
    int client;
    REQUIRE(metrics_http_client_connect(m, &client) == 0);
    size_t got;
    return metrics_http_client_exchange(client, req, strlen(req), 65536, &got);
}

/* Publish the next snapshot (the tick builds one at most every METRICS_HTTP_PUBLISH_SEC). */
static void publish(metrics_http *m)
{
    for (uint64_t g = m->gen; m->gen == g; usleep(10000)) metrics_http_tick(m, NULL);
}

static metrics_http *unbound(void)
{
    signal(SIGPIPE, SIG_IGN);
    metrics_http *m = NULL;
    errbuf err = {{0}};
    REQUIRE(metrics_http_new_unbound(&m, &err) == 0 && m);
    return m;
}

TEST(requests_get_answers)
{
    metrics_http *m = unbound();
    char *r = ask(m, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_CONTAINS(r, "HTTP/1.1 503 "); /* nothing published yet */
    free(r);
    publish(m);
    r = ask(m, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT(!strncmp(r, "HTTP/1.1 200 ", 13));
    EXPECT_CONTAINS(r, "text/plain; version=0.0.4");
    EXPECT_CONTAINS(r, "\ndflash_step 0\n");
    free(r);
    r = ask(m, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT(!strncmp(r, "HTTP/1.1 200 ", 13) && !strstr(r, "dflash_step"));
    free(r);
    r = ask(m, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nx=1");
    EXPECT(!strncmp(r, "HTTP/1.1 405 ", 13));
    EXPECT_CONTAINS(r, "Allow: GET, HEAD");
    free(r);
    r = ask(m, "GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT(!strncmp(r, "HTTP/1.1 404 ", 13));
    free(r);
    r = ask(m, "GET /metrics HTTP/9.9\r\nHost: x\r\n\r\n");
    EXPECT(!strncmp(r, "HTTP/1.1 505 ", 13));
    free(r);
    r = ask(m, "\x01\x02 garbage\r\n\r\n"); /* no request line at all: closed */
    EXPECT(!strncmp(r, "HTTP/1.1 4", 10) || !r[0]);
    free(r);
    r = ask(m, "GET /metrics HTTP/1.1\r\nHost: x\r\n"); /* the stream ends inside the headers: closed */
    EXPECT(!r[0]);
    free(r);
    size_t big = METRICS_HTTP_CONNECTION_MEMORY + 1000; /* a header over a connection's memory: 431 */
    char *req = xmalloc(big + 64);
    int k = snprintf(req, big + 64, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(req + k, 'b', big);
    strcpy(req + k + big, "\r\n\r\n");
    r = ask(m, req);
    EXPECT(!strncmp(r, "HTTP/1.1 431 ", 13));
    free(r);
    free(req);
    metrics_http_destroy(&m);
}

/* A snapshot is rendered once: the scrapes after the first get that text (their age line added), a new snapshot is
 * rendered anew. */
TEST(snapshot_rendered_once)
{
    metrics_http *m = unbound();
    publish(m);
    char *a = ask(m, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    const char *first = m->text;
    char *b = ask(m, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT(first && m->text == first);
    EXPECT_CONTAINS(a, "\ndflash_step 0\n");
    EXPECT_CONTAINS(b, "\ndflash_step 0\n");
    EXPECT_CONTAINS(b, "\ndflash_keeper_pid 0\n# HELP dflash_metrics_snapshot_age_seconds ");
    publish(m);
    char *c = ask(m, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_CONTAINS(c, "\ndflash_step 1\n");
    EXPECT(strstr(c, "\ndflash_metrics_snapshot_age_seconds "));
    free(a), free(b), free(c);
    metrics_http_destroy(&m);
}

TEST(non_loopback_peer_refused)
{
    metrics_http *m = unbound();
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(1)};
    peer.sin_addr.s_addr = htonl(0x0a000001); /* 10.0.0.1 */
    EXPECT(metrics_http_add_connection(m, sv[1], (const struct sockaddr *)&peer, sizeof peer) < 0);
    char c;
    EXPECT(read(sv[0], &c, 1) == 0); /* the server closed its end */
    close(sv[0]);
    metrics_http_destroy(&m);
}

static int threads(void)
{
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

/* A flood of connections that send nothing: METRICS_HTTP_MAX_CONNECTIONS are held, the next is refused at once, no
 * thread is started for any of them; when one closes, a new one is taken again and served. */
TEST(connection_flood_is_bounded)
{
    metrics_http *m = unbound();
    publish(m);
    int before = threads(), held[METRICS_HTTP_MAX_CONNECTIONS];
    for (int i = 0; i < METRICS_HTTP_MAX_CONNECTIONS; i++) REQUIRE(metrics_http_client_connect(m, &held[i]) == 0);
    int extra;
    for (int i = 0; i < 8; i++) EXPECT(metrics_http_client_connect(m, &extra) < 0);
    EXPECT(threads() == before);
    close(held[0]); /* the server reads its end of stream and closes: room for one */
    int rc = -1;
    for (int i = 0; i < 6000 && (rc = metrics_http_client_connect(m, &extra)) != 0; i++) usleep(10000);
    REQUIRE(rc == 0);
    size_t got;
    const char *req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    char *r = metrics_http_client_exchange(extra, req, strlen(req), 65536, &got);
    EXPECT(!strncmp(r, "HTTP/1.1 200 ", 13));
    free(r);
    for (int i = 1; i < METRICS_HTTP_MAX_CONNECTIONS; i++) close(held[i]);
    metrics_http_destroy(&m);
}

TEST_MAIN
