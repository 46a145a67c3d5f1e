#include "run_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* fcntl record locks rather than flock: F_GETLK names the holder's pid without taking the lock, so checking never
 * makes a starting owner fail. */
struct run_lock {
    int fd;
};

static const char *const owner_names[] = {"dflashd", "dflash run"};
static const char *const lock_files[] = {"dflashd.lock", "supervisor.lock"};

static void lock_path(const char *run_dir, enum run_lock_owner owner, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", run_dir, lock_files[owner]);
}

/* 1 with the holder's pid (0: in another pid namespace) when a live process holds the lock, 0 when none, -errno. */
static int lock_holder(int fd, pid_t *pid)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fcntl(fd, F_GETLK, &fl) < 0) return -errno;
    *pid = fl.l_type == F_UNLCK ? 0 : fl.l_pid;
    return fl.l_type != F_UNLCK;
}

static int busy(const char *run_dir, const char *path, enum run_lock_owner owner, pid_t pid, errbuf *err)
{
    if (pid > 0)
        return errbuf_set(err, EBUSY, "job.run_dir %s is in use by %s pid %d (%s is locked): stop it, or use "
                          "another run_dir", run_dir, owner_names[owner], (int)pid, path);
    return errbuf_set(err, EBUSY, "job.run_dir %s is in use by a %s outside this pid namespace (%s is locked)",
                      run_dir, owner_names[owner], path);
}

int run_lock_open(run_lock **out, const char *run_dir, enum run_lock_owner owner, errbuf *err)
{
    *out = NULL;
    char path[PATH_MAX + 32];
    lock_path(run_dir, owner, path, sizeof path);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return errbuf_set(err, errno, "%s: %s", path, strerror(errno));
    /* a holder may die between a refused F_SETLK and the F_GETLK that names it: then try again */
    for (int tries = 0;; tries++) {
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
        if (fcntl(fd, F_SETLK, &fl) == 0) break;
        int e = errno;
        pid_t pid = 0;
        int held = (e == EACCES || e == EAGAIN) ? lock_holder(fd, &pid) : -e;
        if (held == 0 && tries < 3) continue;
        close(fd);
        if (held < 0) return errbuf_set(err, -held, "%s: cannot lock: %s", path, strerror(-held));
        return busy(run_dir, path, owner, pid, err);
    }
    char text[32];
    int n = snprintf(text, sizeof text, "%d\n", (int)getpid());
    ssize_t w = ftruncate(fd, 0) == 0 ? pwrite(fd, text, (size_t)n, 0) : -1;
    (void)w; /* the pid in the file is for people; the lock is what counts */
    run_lock *l = xcalloc(1, sizeof *l);
    l->fd = fd;
    *out = l;
    return 0;
}

int run_lock_check(const char *run_dir, enum run_lock_owner owner, errbuf *err)
{
    char path[PATH_MAX + 32];
    lock_path(run_dir, owner, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : errbuf_set(err, errno, "%s: %s", path, strerror(errno));
    pid_t pid = 0;
    int held = lock_holder(fd, &pid);
    close(fd);
    if (held < 0) return errbuf_set(err, -held, "%s: cannot test the lock: %s", path, strerror(-held));
    return held ? busy(run_dir, path, owner, pid, err) : 0;
}

void run_lock_destroy(run_lock **lp)
{
    run_lock *l = *lp;
    if (!l) return;
    close(l->fd); /* drops the lock */
    free(l);
    *lp = NULL;
}
