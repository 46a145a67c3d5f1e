/* metrics_http: dflashd's Prometheus endpoint. With control.metrics_listen set (a loopback address:port) it serves
 * GET /metrics in the Prometheus text format from libmicrohttpd's own thread, rendering the status reply that
 * `dflashctl status` gets (control_status_pack: one source of the figures). The main loop publishes a packed copy
 * at most every METRICS_HTTP_PUBLISH_SEC through metrics_http_tick, which never waits (trylock: a snapshot the
 * HTTP thread is copying is published on the next tick); the HTTP thread never touches the job state. Connections
 * are bounded, peers other than loopback are refused. Errors at start: -errno with an errbuf naming the setting. */
#ifndef DFLASH_METRICS_HTTP_H
#define DFLASH_METRICS_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "control.h"
#include "util.h"

#define METRICS_HTTP_PUBLISH_SEC 0.25
#define METRICS_HTTP_MAX_CONNECTIONS 16

typedef struct metrics_http metrics_http;

/* Parse "127.0.0.1:9464", "localhost:9464" or "[::1]:9464": a loopback address and a port 1..65535; what is not
 * such an address is refused naming `setting` and the value. *ipv6 says which of v4/v6 was filled. */
int metrics_http_parse_listen(const char *value, const char *setting, int *ipv6, uint8_t addr[16], uint16_t *port,
                              errbuf *err);
/* Start serving on control.metrics_listen (*out stays NULL when it is empty: off). */
int metrics_http_new(metrics_http **out, const char *listen, errbuf *err);
/* Publish the current status for the next scrapes when the last one is older than METRICS_HTTP_PUBLISH_SEC. */
void metrics_http_tick(metrics_http *m, control *c);
/* Render a packed StatusReply as Prometheus text (malloc'd, NUL-terminated; NULL when it does not unpack). */
char *metrics_http_render(const uint8_t *status, size_t len, double age_sec, size_t *out_len);
/* Stop the HTTP thread (waits for the requests in progress) and free everything. */
void metrics_http_destroy(metrics_http **m);

#endif
