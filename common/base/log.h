/* log: one logging module for every process. Lines go to stderr as "<ts> <role>[pid] LEVEL msg", or with sd-daemon
 * priority prefixes ("<3>") when stderr is the journal (JOURNAL_STREAM set). The level is checked before formatting.
 * The role and level are process-wide settings made once at start (log_init); logging itself is thread-safe
 * (one write(2) per line). */
#ifndef DFLASH_LOG_H
#define DFLASH_LOG_H

enum log_level { LOG_LEVEL_ERROR = 0, LOG_LEVEL_WARN, LOG_LEVEL_INFO, LOG_LEVEL_DEBUG };

/* Set the process role shown on every line and the threshold; DFLASH_LOG_LEVEL (error|warn|info|debug) overrides. */
void log_init(const char *role, enum log_level level);
/* Current threshold. */
enum log_level log_level_get(void);
/* Parse "error|warn|info|debug"; returns -1 when unknown. */
int log_level_parse(const char *name);
/* Format and write one line (use the macros below). */
void log_write(enum log_level level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define log_at(lvl, ...) \
    do { if ((lvl) <= log_level_get()) log_write((lvl), __FILE__, __LINE__, __VA_ARGS__); } while (0)
#define log_error(...) log_at(LOG_LEVEL_ERROR, __VA_ARGS__)
#define log_warn(...)  log_at(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_info(...)  log_at(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(...) log_at(LOG_LEVEL_DEBUG, __VA_ARGS__)

#endif
