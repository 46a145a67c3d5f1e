#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char log_role[32] = "dflash";
static enum log_level log_threshold = LOG_LEVEL_INFO;
static int log_to_journal;

int log_level_parse(const char *name)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (name && strcmp(name, names[i]) == 0) return i;
    return -1;
}

void log_init(const char *role, enum log_level level)
{
    snprintf(log_role, sizeof log_role, "%s", role ? role : "dflash");
    log_threshold = level;
    int env = log_level_parse(getenv("DFLASH_LOG_LEVEL"));
    if (env >= 0) log_threshold = (enum log_level)env;
    log_to_journal = getenv("JOURNAL_STREAM") != NULL;
}

enum log_level log_level_get(void) { return log_threshold; }

void log_write(enum log_level level, const char *file, int line, const char *fmt, ...)
{
    static const char *tags[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};
    static const int prio[] = {3, 4, 6, 7}; /* sd-daemon.h SD_ERR, SD_WARNING, SD_INFO, SD_DEBUG */
    char buf[2048];
    int n;
    if (log_to_journal) {
        n = snprintf(buf, sizeof buf, "<%d>", prio[level]);
    } else {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        localtime_r(&ts.tv_sec, &tm);
        n = snprintf(buf, sizeof buf, "%02d:%02d:%02d.%03ld %s[%d] %s ", tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, log_role, (int)getpid(), tags[level]);
    }
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
    if (level == LOG_LEVEL_DEBUG && n < (int)sizeof buf - 40)
        n += snprintf(buf + n, sizeof buf - (size_t)n - 1, " (%s:%d)", file, line);
    buf[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, (size_t)n);
    (void)w;
}
