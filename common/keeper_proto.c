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

int keeper_register(const char *socket_path, enum job_role role, int index, keeper_reply *reply, int *fds,
                    int max_fds, double deadline_sec, errbuf *err)
{
    double until = now_seconds() + deadline_sec;
    const char *run_id = getenv("DFLASH_RUN_ID");
    int last = 0, logged = 0;
    for (;;) {
        int s = connect_once(socket_path);
        if (s >= 0) {
            keeper_request rq = {.magic = KEEPER_MAGIC, .role = role, .index = index, .pid = getpid()};
            snprintf(rq.run_id, sizeof rq.run_id, "%s", run_id ? run_id : "");
            int nfds = 0;
            ssize_t n = fdpass_send(s, NULL, 0, &rq, sizeof rq);
            if (n == (ssize_t)sizeof rq) n = fdpass_recv(s, fds, max_fds, &nfds, reply, sizeof *reply);
            close(s);
            if (n == (ssize_t)sizeof *reply && reply->magic == KEEPER_MAGIC) {
                if (reply->status != 0) {
                    for (int i = 0; i < nfds; i++) close(fds[i]);
                    return errbuf_set(err, -reply->status, "keeper %s refused registration: %s", socket_path,
                                      reply->msg);
                }
                if ((int)reply->npools != nfds) {
                    for (int i = 0; i < nfds; i++) close(fds[i]);
                    return errbuf_set(err, EPROTO, "keeper %s: reply announces %u fds, %d arrived", socket_path,
                                      reply->npools, nfds);
                }
                return 0;
            }
            for (int i = 0; i < nfds; i++) close(fds[i]);
            last = n < 0 ? (int)n : -EPROTO;
        } else {
            last = s;
        }
        if (now_seconds() > until)
            return errbuf_set(err, -last, "keeper %s: no registration reply within %.0f s: %s", socket_path,
                              deadline_sec, strerror(-last));
        if (!logged++) log_info("waiting for the keeper at %s (%s)", socket_path, strerror(-last));
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}
