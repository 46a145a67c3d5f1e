#include "notify.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int notify_socket_open(const char *path, errbuf *err)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path)
        return errbuf_set(err, ENAMETOOLONG, "%s: notify socket path longer than %zu bytes (use a shorter job.run_dir)",
                          path, sizeof sa.sun_path - 1);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return errbuf_set(err, errno, "%s: socket: %s", path, strerror(errno));
    int one = 1, big = 1 << 20;
    if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof one) < 0) {
        int e = errno;
        close(fd);
        return errbuf_set(err, e, "%s: SO_PASSCRED: %s", path, strerror(e));
    }
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big); /* best effort: bursts of STATUS= lines */
    if (unlink(path) < 0 && errno != ENOENT) {
        int e = errno;
        close(fd);
        return errbuf_set(err, e, "%s: cannot remove the old socket: %s", path, strerror(e));
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int e = errno;
        close(fd);
        return errbuf_set(err, e, "%s: bind: %s", path, strerror(e));
    }
    return fd;
}

/* Copy a value, cut to NOTIFY_TEXT_MAX - 1 bytes, control characters made spaces (it may reach a terminal). */
static void notify_copy_value(char *dst, size_t cap, const char *v, size_t n)
{
    if (n > cap - 1) n = cap - 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)v[i];
        dst[i] = (ch < 0x20 || ch == 0x7f) ? ' ' : (char)ch;
    }
    dst[n] = '\0';
}

void notify_parse(const char *text, size_t n, notify_msg *m)
{
    size_t i = 0;
    while (i < n) {
        size_t end = i;
        while (end < n && text[end] != '\n') end++;
        const char *line = text + i;
        size_t len = end - i;
        const char *eq = memchr(line, '=', len);
        if (eq) {
            size_t kl = (size_t)(eq - line);
            const char *v = eq + 1;
            size_t vl = len - kl - 1;
#define KEY_IS(k) (kl == sizeof(k) - 1 && memcmp(line, k, kl) == 0)
#define VAL_IS(s) (vl == sizeof(s) - 1 && memcmp(v, s, vl) == 0)
            if (KEY_IS("READY")) m->ready = VAL_IS("1");
            else if (KEY_IS("STOPPING")) m->stopping = VAL_IS("1");
            else if (KEY_IS("WATCHDOG")) {
                m->watchdog = VAL_IS("1");
                m->watchdog_trigger = VAL_IS("trigger");
            } else if (KEY_IS("FDSTORE")) m->fdstore = VAL_IS("1");
            else if (KEY_IS("FDSTOREREMOVE")) m->fdstore_remove = VAL_IS("1");
            else if (KEY_IS("X_DFLASH_FINISHED")) m->finished = VAL_IS("1");
            else if (KEY_IS("X_DFLASH_STALLED")) {
                m->has_stalled = 1;
                notify_copy_value(m->stalled, sizeof m->stalled, v, vl);
            }
            else if (KEY_IS("X_DFLASH_WARN")) {
                m->has_warn = 1;
                notify_copy_value(m->warn, sizeof m->warn, v, vl);
            }
            else if (KEY_IS("X_DFLASH_NOTE")) {
                m->has_note = 1;
                notify_copy_value(m->note, sizeof m->note, v, vl);
            }
            else if (KEY_IS("X_DFLASH_KILLED")) {
                char buf[NOTIFY_TEXT_MAX], *rest;
                notify_copy_value(buf, sizeof buf, v, vl);
                long pid = strtol(buf, &rest, 10);
                m->has_killed = pid > 0 && rest != buf;
                m->killed_pid = (pid_t)pid;
                snprintf(m->killed_why, sizeof m->killed_why, "%s", rest + (*rest == ' '));
            }
            else if (KEY_IS("X_DFLASH_STEP")) {
                char buf[32], *end;
                notify_copy_value(buf, sizeof buf, v, vl);
                m->step = strtoull(buf, &end, 10);
                m->has_step = end != buf && !*end;
            }
            else if (KEY_IS("STATUS")) {
                m->has_status = 1;
                notify_copy_value(m->status, sizeof m->status, v, vl);
            } else if (KEY_IS("FDNAME")) {
                /* a name too long to keep is invalid: leave it empty so notify_fdname_valid rejects it */
                m->has_fdname = 1;
                notify_copy_value(m->fdname, sizeof m->fdname, v, vl);
                if (vl > NOTIFY_TEXT_MAX - 1) m->fdname[0] = '\0';
            }
#undef KEY_IS
#undef VAL_IS
        }
        i = end + 1;
    }
}

int notify_fdname_valid(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 255) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (ch < 0x20 || ch == 0x7f || ch == ':') return 0;
    }
    return 1;
}

void notify_msg_close_fds(notify_msg *m)
{
    for (int i = 0; i < m->nfds; i++) close(m->fds[i]);
    m->nfds = 0;
}

int notify_recv(int sock, notify_msg *m)
{
    char buf[NOTIFY_MSG_MAX + 1];
    union {
        struct cmsghdr align;
        char space[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int) * NOTIFY_MAX_FDS)];
    } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = NOTIFY_MSG_MAX};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.space, .msg_controllen = sizeof ctl.space};
    ssize_t r;
    do r = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC | MSG_TRUNC);
    while (r < 0 && errno == EINTR);
    if (r < 0) return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -errno;
    memset(m, 0, offsetof(notify_msg, fds));
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET) continue;
        if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len >= CMSG_LEN(sizeof(struct ucred))) {
            struct ucred uc;
            memcpy(&uc, CMSG_DATA(c), sizeof uc);
            m->pid = uc.pid;
        } else if (c->cmsg_type == SCM_RIGHTS) {
            int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < k; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + (size_t)i * sizeof(int), sizeof fd);
                if (m->nfds < NOTIFY_MAX_FDS) m->fds[m->nfds++] = fd;
                else close(fd);
            }
        }
    }
    if ((size_t)r > NOTIFY_MSG_MAX || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
        notify_msg_close_fds(m);
        return -EMSGSIZE;
    }
    notify_parse(buf, (size_t)r, m);
    return 1;
}
