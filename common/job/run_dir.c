#include "run_dir.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int run_dir_previous(const char *run_dir, char *what, size_t n)
{
    char path[PATH_MAX], link[PATH_MAX];
    struct stat st;
    size_t o = 0;
    what[0] = '\0';
    snprintf(path, sizeof path, "%s/ledger.jsonl", run_dir);
    if (stat(path, &st) == 0 && st.st_size > 0)
        o += (size_t)snprintf(what + o, n - o, "ledger.jsonl (%lld bytes)", (long long)st.st_size);
    snprintf(path, sizeof path, "%s/ckpt/latest", run_dir);
    ssize_t r = readlink(path, link, sizeof link - 1);
    if (r > 0) link[r] = '\0';
    if ((r > 0 || lstat(path, &st) == 0) && o < n)
        o += (size_t)snprintf(what + o, n - o, "%sckpt/latest%s%s", o ? " and " : "", r > 0 ? " -> " : "",
                              r > 0 ? link : "");
    return o > 0;
}

int run_dir_refuse(const char *run_dir, const char *what, errbuf *err)
{
    return errbuf_set(err, EEXIST, "job.run_dir %s holds a previous run (%s): continue it with --resume, or start "
                      "over with --fresh (which moves the previous run to %s/previous-<time>/), or use another "
                      "run_dir", run_dir, what, run_dir);
}

int run_dir_set_aside(const char *run_dir, int with_logs, char *dest, size_t n, errbuf *err)
{
    char stamp[32], path[PATH_MAX], to[PATH_MAX];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    for (int i = 1;; i++) {
        if (i == 1) snprintf(dest, n, "%s/previous-%s", run_dir, stamp);
        else snprintf(dest, n, "%s/previous-%s-%d", run_dir, stamp, i);
        if (mkdir(dest, 0750) == 0) break;
        if (errno != EEXIST || i == 100) return errbuf_set(err, errno, "%s: %s", dest, strerror(errno));
    }
    static const char *const leaves[] = {"ledger.jsonl", "metrics.jsonl", "ckpt", "eval.jsonl", "logs",
                                         "supervisor.state"};
    for (size_t i = 0; i < sizeof leaves / sizeof *leaves; i++) {
        if (!with_logs && i >= 4) break;
        snprintf(path, sizeof path, "%s/%s", run_dir, leaves[i]);
        snprintf(to, sizeof to, "%s/%s", dest, leaves[i]);
        if (rename(path, to) != 0 && errno != ENOENT)
            return errbuf_set(err, errno, "--fresh: moving %s to %s: %s", path, to, strerror(errno));
    }
    return 0;
}
