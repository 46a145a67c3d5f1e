/* metrics_http: dflashd's Prometheus endpoint. With control.metrics_listen set (a loopback address:port) it serves
 * GET /metrics in the Prometheus text format from libmicrohttpd's own thread, rendering the status reply that
 * `dflashctl status` gets (control_status_pack: one source of the figures). The main loop publishes a packed copy
 * at most every METRICS_HTTP_PUBLISH_SEC through metrics_http_tick, which never waits (trylock: a snapshot the
 * HTTP thread is copying is published on the next tick); the HTTP thread never touches the job state, and renders
 * each snapshot once for all the scrapes that show it. Connections are bounded, peers other than loopback refused.
 * Errors at start: -errno with an errbuf naming the setting. */
#ifndef DFLASH_METRICS_HTTP_H
#define DFLASH_METRICS_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "control.h"
#include "util.h"

#define METRICS_HTTP_PUBLISH_SEC 0.25
/* What a scrape flood can take of dflashd: one HTTP thread, at most this many connections (more are closed at
 * accept), each closed after METRICS_HTTP_TIMEOUT_SEC idle and holding at most METRICS_HTTP_CONNECTION_MEMORY bytes
 * of request buffers (a bigger request line or header gets 414/431) plus the one rendered reply it is sending. */
#define METRICS_HTTP_MAX_CONNECTIONS 16
#define METRICS_HTTP_TIMEOUT_SEC 10
#define METRICS_HTTP_CONNECTION_MEMORY 32768

typedef struct metrics_http metrics_http;

/* Parse "127.0.0.1:9464", "localhost:9464" or "[::1]:9464": a loopback address and a port 1..65535; what is not
 * such an address is refused naming `setting` and the value. *ipv6 says which of v4/v6 was filled. */
int metrics_http_parse_listen(const char *value, const char *setting, int *ipv6, uint8_t addr[16], uint16_t *port,
                              errbuf *err);
/* Start serving on control.metrics_listen (*out stays NULL when it is empty: off). */
int metrics_http_new(metrics_http **out, const char *listen, errbuf *err);
/* The seam the fuzzer and the tests drive the request path through, without a port: the same server with no
 * listening socket. Connections come only from metrics_http_add_connection, which hands it a connected socket (e.g.
 * one end of a socketpair) as if accepted from `peer`: the loopback check and the limits apply as to an accepted
 * one, and the socket is the server's from then on (closed by it, also when refused: then -errno, ECONNREFUSED for a
 * peer that is not loopback or over a limit). dflashd itself serves only through metrics_http_new. */
int metrics_http_new_unbound(metrics_http **out, errbuf *err);
int metrics_http_add_connection(metrics_http *m, int fd, const struct sockaddr *peer, socklen_t peer_len);
/* Publish the current status for the next scrapes when the last one is older than METRICS_HTTP_PUBLISH_SEC. */
void metrics_http_tick(metrics_http *m, control *c);
/* Render a packed StatusReply as Prometheus text (malloc'd, NUL-terminated; NULL when it does not unpack). */
char *metrics_http_render(const uint8_t *status, size_t len, double age_sec, size_t *out_len);
/* Stop the HTTP thread (waits for the requests in progress) and free everything. */
void metrics_http_destroy(metrics_http **m);

#endif
