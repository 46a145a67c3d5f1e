/* The client's side of one connection to metrics_http through its seam (metrics_http_add_connection), shared by
 * tests/fuzz/fuzz_metrics_http.c and tests/unit/test_metrics_http.c: a socketpair whose one end the server takes as
 * accepted from 127.0.0.1; the request's bytes are written (then the writing side is shut down: the server sees the
 * end of the request stream), and what the server sends is read until it closes the connection. Include after
 * metrics_http.h. */
#ifndef DFLASH_METRICS_HTTP_CLIENT_H
#define DFLASH_METRICS_HTTP_CLIENT_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A connected socketpair: the server's end handed to `m` as from 127.0.0.1 (0), or -errno when add_connection
 * refused it (its end is closed then, ours too). *client is ours, non-blocking. */
static inline int metrics_http_client_connect(metrics_http *m, int *client)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        perror("metrics_http_client: socketpair");
        abort();
    }
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(40000)};
    peer.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc = metrics_http_add_connection(m, sv[1], (const struct sockaddr *)&peer, sizeof peer);
    if (rc) {
        close(sv[0]);
        return rc;
    }
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    *client = sv[0];
    return 0;
}

/* Write req[0..n) on `client`, shut down its writing side, read until the server closes (or resets) the connection,
 * and close `client`. The reply as read (malloc'd, NUL-terminated; its first `cap` bytes are kept, *got says how many
 * came in all). Writing stops when the server closed its side (it may close before reading all of a bad request). */
static inline char *metrics_http_client_exchange(int client, const void *req, size_t n, size_t cap, size_t *got)
{
    char *reply = malloc(cap + 1);
    if (!reply) abort();
    size_t sent = 0, kept = 0;
    *got = 0;
    int writing = 1;
    if (n == 0) {
        shutdown(client, SHUT_WR);
        writing = 0;
    }
    for (;;) {
        struct pollfd p = {.fd = client, .events = POLLIN | (writing ? POLLOUT : 0)};
        if (poll(&p, 1, -1) < 0) {
            if (errno == EINTR) continue;
            perror("metrics_http_client: poll");
            abort();
        }
        if (writing && (p.revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t w = send(client, (const char *)req + sent, n - sent, MSG_NOSIGNAL);
            if (w > 0) sent += (size_t)w;
            else if (w < 0 && errno != EAGAIN && errno != EINTR) writing = 0; /* EPIPE, ECONNRESET: closed on us */
            if (writing && sent == n) {
                shutdown(client, SHUT_WR);
                writing = 0;
            }
        }
        if (p.revents & (POLLIN | POLLERR | POLLHUP)) {
            char buf[16384];
            ssize_t r = recv(client, buf, sizeof buf, 0);
            if (r == 0) break;
            if (r < 0) {
                if (errno == EAGAIN || errno == EINTR) continue;
                if (errno == ECONNRESET || errno == EPIPE) break;
                perror("metrics_http_client: recv");
                abort();
            }
            size_t take = kept + (size_t)r <= cap ? (size_t)r : cap - kept;
            memcpy(reply + kept, buf, take);
            kept += take;
            *got += (size_t)r;
        }
    }
    close(client);
    reply[kept] = 0;
    return reply;
}

#endif
