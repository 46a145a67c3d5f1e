#include "fdpass.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

union fdpass_cmsg {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * FDPASS_MAX_FDS)];
};

ssize_t fdpass_send(int sock, const int *fds, int nfds, const void *buf, size_t len)
{
    /* A stream socket carries ancillary data only with at least one data byte, so require one. */
    if (nfds < 0 || nfds > FDPASS_MAX_FDS || len == 0 || !buf) return -EINVAL;
    struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
    union fdpass_cmsg cm;
    memset(&cm, 0, sizeof cm);
    if (nfds > 0) {
        msg.msg_control = cm.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    ssize_t n;
    do n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : n;
}

ssize_t fdpass_recv(int sock, int *fds, int max_fds, int *nfds, void *buf, size_t cap)
{
    *nfds = 0;
    if (max_fds < 0 || cap == 0 || !buf) return -EINVAL;
    struct iovec iov = { .iov_base = buf, .iov_len = cap };
    union fdpass_cmsg cm;
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof cm.buf };
    ssize_t n;
    do n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0) return -errno;
    int kept = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        int count = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int k = 0; k < count; k++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + sizeof(int) * (size_t)k, sizeof fd);
            if (kept < max_fds) fds[kept++] = fd;
            else close(fd); /* more than the caller asked for: never leak them */
        }
    }
    if (msg.msg_flags & MSG_TRUNC) {
        for (int k = 0; k < kept; k++) close(fds[k]);
        return -EMSGSIZE;
    }
    *nfds = kept;
    return n;
}
