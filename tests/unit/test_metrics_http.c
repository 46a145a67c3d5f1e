/* metrics_http: control.metrics_listen accepts loopback address:port only, naming the setting otherwise; the
 * rendering of a status reply has the figures with Prometheus names (the promtool and scrape checks are in
 * tests/system/metrics.sh). The module is compiled in here; control_status_pack is a stub. */
#include <errno.h>

#include "services/dflashd/metrics_http.c"
#include "tests/test.h"

uint8_t *control_status_pack(control *c, size_t *len)
{
    (void)c;
    *len = 0;
    return xmalloc(1);
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

TEST_MAIN
