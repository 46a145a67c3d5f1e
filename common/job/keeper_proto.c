#include "keeper_proto.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "fdpass.h"
#include "log.h"

_Static_assert(KEEPER_MAX_FDS <= FDPASS_MAX_FDS, "a keeper reply carries up to KEEPER_MAX_FDS fds in one message");

static int connect_once(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) return -ENAMETOOLONG;
    strcpy(addr.sun_path, path);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0) return -errno;
    if (connect(s, (struct sockaddr *)&addr, sizeof addr) != 0) {
        int e = errno;
        close(s);
        return -e;
    }
    return s;
}

/* One request (payload + fds) and its reply; retries connecting, and (when retry_again) while the keeper answers
 * -EAGAIN, until deadline_sec passes. */
static int keeper_exchange(const char *socket_path, const void *rq, size_t rq_len, const int *send_fds,
                           int nsend, int retry_again, keeper_reply *reply, int *fds, int max_fds,
                           double deadline_sec, errbuf *err)
{
    double until = now_seconds() + deadline_sec;
    int last = 0, logged = 0, logged_again = 0;
    for (;;) {
        int s = connect_once(socket_path);
        if (s >= 0) {
            int nfds = 0;
            ssize_t n = fdpass_send(s, send_fds, nsend, rq, rq_len);
            if (n == (ssize_t)rq_len) n = fdpass_recv(s, fds, max_fds, &nfds, reply, sizeof *reply);
            close(s);
            if (n == (ssize_t)sizeof *reply && reply->magic == KEEPER_MAGIC) {
                if (reply->status != 0) {
                    for (int i = 0; i < nfds; i++) close(fds[i]);
                    reply->msg[sizeof reply->msg - 1] = '\0';
                    if (!(retry_again && reply->status == -EAGAIN))
                        return errbuf_set(err, -reply->status, "keeper %s refused: %s", socket_path, reply->msg);
                    if (!logged_again++) log_info("keeper %s: %s (retrying)", socket_path, reply->msg);
                    last = -EAGAIN;
                } else if ((int)(reply->npools + reply->ntrain + reply->nweights) != nfds) {
                    for (int i = 0; i < nfds; i++) close(fds[i]);
                    return errbuf_set(err, EPROTO, "keeper %s: reply announces %u fds, %d arrived", socket_path,
                                      reply->npools + reply->ntrain + reply->nweights, nfds);
                } else {
                    return 0;
                }
            } else {
                for (int i = 0; i < nfds; i++) close(fds[i]);
                last = n < 0 ? (int)n : -EPROTO;
            }
        } else {
            last = s;
        }
        if (now_seconds() > until)
            return errbuf_set(err, -last, "keeper %s: no %s within %.0f s: %s", socket_path,
                              last == -EAGAIN ? "acceptance" : "reply", deadline_sec,
                              last == -EAGAIN ? reply->msg : strerror(-last));
        if (last != -EAGAIN && !logged++)
            log_info("waiting for the keeper at %s (%s)", socket_path, strerror(-last));
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

int keeper_register(const char *socket_path, enum job_role role, int index, keeper_reply *reply, int *fds,
                    int max_fds, double deadline_sec, errbuf *err)
{
    const char *run_id = getenv("DFLASH_RUN_ID");
    keeper_request rq = {.magic = KEEPER_MAGIC, .role = role, .index = index, .pid = getpid()};
    snprintf(rq.run_id, sizeof rq.run_id, "%s", run_id ? run_id : "");
    int rc = keeper_exchange(socket_path, &rq, sizeof rq, NULL, 0, 1, reply, fds, max_fds, deadline_sec, err);
    if (rc) return errbuf_wrap(err, rc, "registration of %s-%d", job_role_name(role), index);
    return 0;
}

int keeper_deposit_memory(const char *socket_path, enum keeper_deposit_kind kind, int index, uint64_t epoch, int fd,
                   const uint8_t uuid[16], uint64_t bytes, double deadline_sec, errbuf *err)
{
    const char *run_id = getenv("DFLASH_RUN_ID");
    keeper_deposit rq = {.magic = KEEPER_DEPOSIT_MAGIC, .index = index, .pid = getpid(), .kind = (uint32_t)kind,
                         .epoch = epoch, .bytes = bytes};
    if (uuid) memcpy(rq.device_uuid, uuid, 16);
    snprintf(rq.run_id, sizeof rq.run_id, "%s", run_id ? run_id : "");
    keeper_reply rp;
    int none[1];
    int rc = keeper_exchange(socket_path, &rq, sizeof rq, &fd, 1, 0, &rp, none, 0, deadline_sec, err);
    static const char *const what[] = {"pool", "training state", "target weights"};
    if (rc) return errbuf_wrap(err, rc, "deposit of %s %d", kind <= KEEPER_DEPOSIT_WEIGHTS ? what[kind] : "memory",
                               index);
    return 0;
}
