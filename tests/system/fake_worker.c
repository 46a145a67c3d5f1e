/* fake_worker: stands in for dflashd, dflash-prefetch, dflash-target and dflash-drafter in the `dflash run` system
 * test (tests/system/supervisor.sh links it under those names). Its role comes from argv[0] (and --index). It loads
 * the job config it is given (-c FILE, --set ...), appends "<name> start <pid>" to <run_dir>/events, checks what the
 * supervisor handed it (absolute -c, no stray fds, LISTEN_FDS only for dflashd; problems go to <run_dir>/errors),
 * sends READY=1 and STATUS= lines, pings the watchdog when WATCHDOG_USEC is set, and exits 0 on SIGTERM.
 * dflashd keeps a memfd with a known pattern in the supervisor's fd store ("pool0") and, when it gets it back after
 * a restart, checks the pattern and appends "dflashd got pool0 back" to <run_dir>/fdstore; it exits 0 once
 * <run_dir>/finish exists (saying X_DFLASH_FINISHED=1 first, as the real one does when the job is done; its exit 0
 * on SIGTERM says nothing) and never sends READY=1 while <run_dir>/noready exists. A worker that finds <run_dir>/nowatchdog-<name> removes it and stops pinging. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "job_config.h"

#define PATTERN_BYTES 65536

static volatile sig_atomic_t got_term;
static char run_dir[CONFIG_STRING_MAX];
static char name[64];

static void on_term(int sig) { got_term = 1; }

/* Append one line to <run_dir>/<leaf> with a single O_APPEND write (several fakes write the same file). */
static void append_line(const char *leaf, const char *fmt, ...)
{
    char path[CONFIG_STRING_MAX + 64], line[512];
    snprintf(path, sizeof path, "%s/%s", run_dir, leaf);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    ssize_t w = write(fd, line, (size_t)n);
    (void)w;
    close(fd);
}

static int file_exists(const char *leaf)
{
    char path[CONFIG_STRING_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", run_dir, leaf);
    return access(path, F_OK) == 0;
}

static unsigned char pattern_byte(size_t i) { return (unsigned char)((i * 131u + 7u) & 0xff); }

/* Every fd >= 3 open at start that is not one of the n passed ones (fd 3 .. 3+n-1) leaked from the supervisor. */
static int count_stray_fds(int n, int *first)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return 0;
    int stray = 0, self = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] == '.' || fd < 3 + n || fd == self) continue;
        if (!stray) *first = fd;
        stray++;
    }
    closedir(d);
    return stray;
}

/* dflashd: take pool0 back from LISTEN_FDS or create and store it. */
static void dflashd_pool(int nlisten, char **names)
{
    for (int i = 0; i < nlisten; i++) {
        if (strcmp(names[i], "pool0") != 0) {
            append_line("errors", "dflashd: unexpected stored fd \"%s\"", names[i]);
            continue;
        }
        int fd = SD_LISTEN_FDS_START + i;
        unsigned char *p = mmap(NULL, PATTERN_BYTES, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            append_line("errors", "dflashd: cannot map pool0: %s", strerror(errno));
            continue;
        }
        size_t bad = 0;
        for (size_t k = 0; k < PATTERN_BYTES; k++) bad += p[k] != pattern_byte(k);
        munmap(p, PATTERN_BYTES);
        if (bad) append_line("errors", "dflashd: pool0 came back with %zu wrong bytes", bad);
        else append_line("fdstore", "dflashd got pool0 back");
        return;
    }
    int fd = memfd_create("pool0", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, PATTERN_BYTES) < 0) {
        append_line("errors", "dflashd: memfd: %s", strerror(errno));
        exit(1);
    }
    unsigned char *p = mmap(NULL, PATTERN_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) exit(1);
    for (size_t k = 0; k < PATTERN_BYTES; k++) p[k] = pattern_byte(k);
    munmap(p, PATTERN_BYTES);
    int r = sd_pid_notify_with_fds(0, 0, "FDSTORE=1\nFDNAME=pool0", &fd, 1);
    if (r <= 0) append_line("errors", "dflashd: FDSTORE failed: %d", r);
    close(fd);
}

int main(int argc, char **argv)
{
    /* Before anything opens an fd: what did the supervisor leave open? */
    const char *lf = getenv("LISTEN_FDS");
    int nlisten_env = lf ? atoi(lf) : 0, first_stray = -1;
    int stray = count_stray_fds(nlisten_env, &first_stray);
    prctl(PR_SET_DUMPABLE, 0); /* the watchdog's SIGABRT must not leave core files */

    const char *base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    const char *config = NULL;
    const char *sets[64];
    int nsets = 0, index = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-c") == 0 && i + 1 < argc) config = argv[++i];
        else if (strcmp(argv[i], "--index") == 0 && i + 1 < argc) index = atoi(argv[++i]);
        else if (strcmp(argv[i], "--set") == 0 && i + 1 < argc && nsets < 64) sets[nsets++] = argv[++i];
        else if (strcmp(argv[i], "--resume") == 0 || strcmp(argv[i], "--fresh") == 0) continue;
        else {
            fprintf(stderr, "fake_worker: unexpected argument %s\n", argv[i]);
            return 2;
        }
    }
    if (strcmp(base, "dflashd") == 0) snprintf(name, sizeof name, "dflashd");
    else if (strcmp(base, "dflash-prefetch") == 0) snprintf(name, sizeof name, "prefetch");
    else if (strcmp(base, "dflash-target") == 0) snprintf(name, sizeof name, "target-%d", index);
    else if (strcmp(base, "dflash-drafter") == 0) snprintf(name, sizeof name, "drafter-%d", index);
    else {
        fprintf(stderr, "fake_worker: unknown role %s\n", base);
        return 2;
    }
    if (!config) {
        fprintf(stderr, "fake_worker: %s: no -c FILE\n", name);
        return 2;
    }
    job_config cfg;
    errbuf err = {{0}};
    if (job_config_load(&cfg, config, sets, nsets, &err) != 0) {
        fprintf(stderr, "fake_worker: %s\n", err.msg);
        return 2;
    }
    snprintf(run_dir, sizeof run_dir, "%s", cfg.job.run_dir);
    if (config[0] != '/') append_line("errors", "%s: -c %s is not absolute", name, config);
    if (stray) append_line("errors", "%s: %d stray fd(s) open at start (first %d)", name, stray, first_stray);

    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL);
    append_line("events", "%s start %d", name, (int)getpid());

    char **names = NULL;
    int nlisten = sd_listen_fds_with_names(1, &names);
    if (nlisten < 0) nlisten = 0;
    int is_dflashd = strcmp(name, "dflashd") == 0;
    if (is_dflashd) dflashd_pool(nlisten, names);
    else if (nlisten > 0) append_line("errors", "%s: got %d stored fd(s) it never stored", name, nlisten);
    for (int i = 0; i < nlisten; i++) free(names ? names[i] : NULL);
    free(names);

    uint64_t wd_usec = 0;
    int watchdog = sd_watchdog_enabled(1, &wd_usec) > 0;
    char nowd[96];
    snprintf(nowd, sizeof nowd, "nowatchdog-%s", name);
    if (is_dflashd && file_exists("noready")) sd_notify(0, "STATUS=dflashd never ready");
    else sd_notifyf(0, "READY=1\nSTATUS=%s ready", name);
    int pinging = 1;
    for (long tick = 0; !got_term; tick++) {
        if (pinging && file_exists(nowd)) {
            char path[CONFIG_STRING_MAX + 128];
            snprintf(path, sizeof path, "%s/%s", run_dir, nowd);
            unlink(path);
            pinging = 0;
            append_line("events", "%s stops pinging %d", name, (int)getpid());
        }
        if (watchdog && pinging) sd_notify(0, "WATCHDOG=1");
        if (tick % 5 == 0) sd_notifyf(0, "STATUS=%s step %ld", name, tick / 5);
        if (is_dflashd && file_exists("finish")) {
            sd_notify(0, "STOPPING=1\nX_DFLASH_FINISHED=1\nSTATUS=dflashd finished");
            return 0;
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return 0;
}
