#include "supervisor.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "shm.h"
#include "slot_pool.h"
#include "notify.h"
#include "job_plan.h"
#include "job_state.h"
#include "run_dir.h"
#include "run_lock.h"

#define START_LIMIT 8           /* a worker's failed starts in a row (exit before READY) that end the run */
#define KILL_LIMIT 5            /* a worker's kills for no sign of life, no step committed since the first, that end it */
#define READY_TIMEOUT_SEC 120.0  /* dflashd's first READY=1; env DFLASH_READY_TIMEOUT (seconds) overrides */
#define STOP_TIMEOUT_SEC 10.0    /* SIGTERM -> SIGKILL when stopping */
#define STOP_GIVE_UP_SEC 5.0     /* after the SIGKILL: stop waiting for children that cannot die (D state) */
#define WATCHDOG_KILL_SEC 2.0    /* SIGABRT -> SIGKILL, like systemd */
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define BACKOFF_RESET_SEC 10.0   /* a child that ran this long restarts after BACKOFF_MIN_MS again */
#define PROGRESS_EVERY_SEC 5.0   /* progress line when stderr is not a terminal */
#define FDSTORE_MAX 64           /* stored fds per child */
#define SAVE_TIMEOUT_SEC 600.0   /* giving up on a running job: its checkpoint (GBs for a large drafter) within this */

enum child_state { CHILD_STARTING, CHILD_READY, CHILD_EXITED, CHILD_BACKOFF };
static const char *const child_state_name[] = {"starting", "ready", "exited", "backoff"};

typedef struct stored_fd {
    char name[NOTIFY_TEXT_MAX];
    int fd;
} stored_fd;

typedef struct child {
    char name[32];
    char *path;          /* the binary */
    char **argv;         /* NULL-terminated */
    int started;         /* ever started: listed in the state file */
    int alive;           /* pid not yet reaped */
    pid_t pid;           /* current or last pid (messages of a just-dead pid still reach its fd store) */
    enum child_state state;
    int restarts, ready_count;
    int failed_starts;   /* exits with an error before READY, in a row */
    int backoff_ms;
    int stopping;        /* sent STOPPING=1: no watchdog any more */
    int finished;        /* dflashd sent X_DFLASH_FINISHED=1: its exit 0 ends the job (else it was only stopped) */
    int watchdog_fired;
    int hb_killed;       /* dflashd killed this instance for missed heartbeats (X_DFLASH_KILLED) */
    char kill_why[160];  /* why the watchdog or dflashd killed it */
    int liveness_kills;  /* such kills in a row, all at committed step kills_step */
    unsigned long long kills_step;
    double start_time, last_ping, restart_at, kill_at; /* kill_at: SIGKILL due (0: none) */
    stored_fd fds[FDSTORE_MAX];
    int nfds;
    char status[NOTIFY_TEXT_MAX];
} child;

enum phase { PHASE_STARTUP, PHASE_RUNNING, PHASE_STOPPING };

/* The one state of `dflash run`. */
typedef struct supervisor {
    const supervisor_opts *o;
    char run_dir[PATH_MAX], notify_path[PATH_MAX], state_path[PATH_MAX], logs_dir[PATH_MAX];
    child *ch;           /* ch[0] is dflashd */
    int n;
    int notify_fd, sig_fd;
    run_lock *lock;      /* <run_dir>/supervisor.lock: one dflash run per run_dir */
    double watchdog_sec;
    enum phase phase;
    double ready_timeout, ready_deadline, stop_deadline;
    int killed_all, stop_signal, exit_code;
    /* giving up on a running job (give_up): dflashd was asked to checkpoint the committed state and end the job */
    int saving;
    double save_deadline;
    char gave_up[1200];  /* why the run gave up (printed again at the end) */
    unsigned long long committed; /* dflashd's committed step (X_DFLASH_STEP) */
    /* progress line */
    int tty, shown_visible;
    int last_status_child; /* -1: none yet */
    char shown[NOTIFY_TEXT_MAX + 40];
    double last_print;
    int state_warned;
} supervisor;

/* ---- progress line and event logging ---- */

static void progress_text(const supervisor *s, char *out, size_t n)
{
    out[0] = '\0';
    const child *src = NULL;
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->ch[i].name, "drafter-0") == 0 && s->ch[i].status[0]) src = &s->ch[i];
    if (!src && s->last_status_child >= 0) src = &s->ch[s->last_status_child];
    if (src) snprintf(out, n, "%s: %s", src->name, src->status);
    for (int i = 0; src && i < s->n; i++) /* tau by decoding (the evaluation worker's STATUS) beside the drafter's */
        if (strcmp(s->ch[i].name, "eval-0") == 0 && s->ch[i].status[0] && &s->ch[i] != src) {
            size_t at = strlen(out);
            snprintf(out + at, n - at, "  |  %s", s->ch[i].status);
        }
}

static void progress_hide(supervisor *s)
{
    if (s->tty && s->shown_visible) {
        ssize_t w = write(STDERR_FILENO, "\r\033[K", 4);
        (void)w;
        s->shown_visible = 0;
    }
}

/* On a terminal: redraw the line in place, cut to the terminal width so that "\r" rewrites it. */
static void progress_draw(supervisor *s)
{
    if (!s->tty || !s->shown[0]) return;
    struct winsize ws;
    size_t cols = (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1) ? ws.ws_col : 80;
    size_t len = strlen(s->shown);
    if (len > cols - 1) len = cols - 1;
    char buf[sizeof s->shown + 8];
    int k = snprintf(buf, sizeof buf, "\r%.*s\033[K", (int)len, s->shown);
    ssize_t w = write(STDERR_FILENO, buf, (size_t)k);
    (void)w;
    s->shown_visible = 1;
}

#define sup_log(s, lvl, ...) \
    do { progress_hide(s); log_at(lvl, __VA_ARGS__); progress_draw(s); } while (0)

/* Called after every STATUS=: a terminal shows it at once, a file or pipe from the timer (progress_tick). */
static void progress_update(supervisor *s)
{
    char text[sizeof s->shown];
    progress_text(s, text, sizeof text);
    if (!s->tty || strcmp(text, s->shown) == 0) return;
    snprintf(s->shown, sizeof s->shown, "%s", text);
    progress_draw(s);
}

/* Not a terminal: print the line when it changed, at most every PROGRESS_EVERY_SEC. Returns the next due time. */
static double progress_tick(supervisor *s, double now)
{
    if (s->tty) return INFINITY;
    char text[sizeof s->shown];
    progress_text(s, text, sizeof text);
    if (!text[0] || strcmp(text, s->shown) == 0) return INFINITY;
    if (now - s->last_print < PROGRESS_EVERY_SEC) return s->last_print + PROGRESS_EVERY_SEC;
    snprintf(s->shown, sizeof s->shown, "%s", text);
    s->last_print = now;
    log_info("status %s", text);
    return INFINITY;
}

/* ---- state file ---- */

static void state_write(supervisor *s)
{
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", s->state_path);
    FILE *f = fopen(tmp, "w");
    int ok = f != NULL;
    for (int i = 0; ok && i < s->n; i++) {
        const child *c = &s->ch[i];
        if (c->started)
            fprintf(f, "%s %d %d %s %d\n", c->name, (int)c->pid, c->restarts, child_state_name[c->state],
                    c->ready_count);
    }
    if (f && fclose(f) != 0) ok = 0;
    if (ok && rename(tmp, s->state_path) != 0) ok = 0;
    if (!ok && !s->state_warned) {
        sup_log(s, LOG_LEVEL_WARN, "%s: cannot write the state file: %s", s->state_path, strerror(errno));
        s->state_warned = 1;
    }
}

/* ---- fd store ---- */

static void fdstore_remove(child *c, const char *name)
{
    int k = 0;
    for (int i = 0; i < c->nfds; i++) {
        if (strcmp(c->fds[i].name, name) == 0) close(c->fds[i].fd);
        else c->fds[k++] = c->fds[i];
    }
    c->nfds = k;
}

/* FDSTORE=1: the message's fds under one name, replacing what that name held. */
static void fdstore_add(supervisor *s, child *c, notify_msg *m)
{
    const char *name = m->has_fdname ? m->fdname : "stored"; /* systemd's default name */
    if (!notify_fdname_valid(name)) {
        sup_log(s, LOG_LEVEL_WARN, "%s (pid %d): FDSTORE=1 with an invalid FDNAME \"%s\": fds closed", c->name,
                (int)m->pid, name);
        notify_msg_close_fds(m);
        return;
    }
    fdstore_remove(c, name);
    for (int i = 0; i < m->nfds; i++) {
        if (c->nfds == FDSTORE_MAX) {
            sup_log(s, LOG_LEVEL_WARN, "%s: fd store full (%d fds): fd \"%s\" not stored", c->name, FDSTORE_MAX,
                    name);
            close(m->fds[i]);
            continue;
        }
        snprintf(c->fds[c->nfds].name, sizeof c->fds[c->nfds].name, "%s", name);
        c->fds[c->nfds++].fd = m->fds[i];
    }
    log_debug("%s: stored %d fd(s) as \"%s\" (%d in store)", c->name, m->nfds, name, c->nfds);
    m->nfds = 0;
}

/* ---- starting children ---- */

static void kill_child(child *c, int sig)
{
    if (!c->alive) return;
    /* The pid is ours until reaped, so neither it nor its group id can have been reused. */
    if (kill(-c->pid, sig) < 0) kill(c->pid, sig);
}

static int setenv_int(const char *key, long long v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", v);
    return setenv(key, buf, 1);
}

static void close_fds_from(int first)
{
    if (close_range((unsigned)first, ~0U, 0) == 0) return;
    long max = sysconf(_SC_OPEN_MAX);
    for (long fd = first; fd < (max > 0 ? max : 65536); fd++) close((int)fd);
}

/* In the forked child: own process group, logs on stdout/stderr, stored fds at 3.., the sd-daemon environment. */
static _Noreturn void child_exec(const supervisor *s, const child *c, int log_fd, pid_t parent)
{
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    setpgid(0, 0);
    /* Without systemd nothing else stops the workers if `dflash run` itself is killed. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_fd >= 0 && null_fd != 0) dup2(null_fd, 0);
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    int n = c->nfds, tmp[FDSTORE_MAX];
    /* Copy above the target range first so that dup2 never overwrites a stored fd still to be moved. */
    for (int i = 0; i < n; i++) {
        tmp[i] = fcntl(c->fds[i].fd, F_DUPFD_CLOEXEC, 3 + n);
        if (tmp[i] < 0) {
            fprintf(stderr, "dflash run: %s: cannot pass stored fd \"%s\": %s\n", c->name, c->fds[i].name,
                    strerror(errno));
            _exit(127);
        }
    }
    for (int i = 0; i < n; i++) dup2(tmp[i], 3 + i); /* dup2 leaves FD_CLOEXEC off */
    close_fds_from(3 + n);
    setenv("NOTIFY_SOCKET", s->notify_path, 1);
    if (n > 0) {
        char names[FDSTORE_MAX * NOTIFY_TEXT_MAX];
        size_t off = 0;
        names[0] = '\0';
        for (int i = 0; i < n; i++)
            off += (size_t)snprintf(names + off, sizeof names - off, "%s%s", i ? ":" : "", c->fds[i].name);
        setenv_int("LISTEN_FDS", n);
        setenv_int("LISTEN_PID", getpid());
        setenv("LISTEN_FDNAMES", names, 1);
    } else {
        unsetenv("LISTEN_FDS");
        unsetenv("LISTEN_PID");
        unsetenv("LISTEN_FDNAMES");
    }
    if (s->watchdog_sec > 0) {
        setenv_int("WATCHDOG_USEC", llround(s->watchdog_sec * 1e6));
        setenv_int("WATCHDOG_PID", getpid());
    } else {
        unsetenv("WATCHDOG_USEC");
        unsetenv("WATCHDOG_PID");
    }
    execv(c->path, c->argv);
    fprintf(stderr, "dflash run: cannot execute %s: %s\n", c->path, strerror(errno));
    _exit(127);
}

static void child_schedule_restart(supervisor *s, child *c, const char *why, double now);

static void child_start(supervisor *s, child *c, double now)
{
    char log_path[PATH_MAX + 64];
    snprintf(log_path, sizeof log_path, "%s/%s.log", s->logs_dir, c->name);
    if (c->started) c->restarts++;
    c->started = 1;
    int log_fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
        char why[PATH_MAX + 128];
        snprintf(why, sizeof why, "cannot open %s: %s", log_path, strerror(errno));
        c->pid = 0;
        child_schedule_restart(s, c, why, now);
        return;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) child_exec(s, c, log_fd, parent);
    close(log_fd);
    if (pid < 0) {
        char why[128];
        snprintf(why, sizeof why, "fork failed: %s", strerror(errno));
        c->pid = 0;
        child_schedule_restart(s, c, why, now);
        return;
    }
    setpgid(pid, pid); /* also in the child: whichever runs first wins, the other fails harmlessly */
    c->pid = pid;
    c->alive = 1;
    c->state = CHILD_STARTING;
    c->stopping = c->watchdog_fired = c->hb_killed = c->finished = 0;
    c->kill_at = 0;
    c->start_time = now;
    if (c->nfds) sup_log(s, LOG_LEVEL_INFO, "started %s (pid %d) with %d stored fd(s)", c->name, (int)pid, c->nfds);
    else sup_log(s, LOG_LEVEL_INFO, "started %s (pid %d)", c->name, (int)pid);
    state_write(s);
}

/* After a failure: backoff 100 ms doubling to 5 s, back to 100 ms once the child had run BACKOFF_RESET_SEC. */
static void child_schedule_restart(supervisor *s, child *c, const char *why, double now)
{
    if (c->backoff_ms == 0 || (c->start_time > 0 && now - c->start_time >= BACKOFF_RESET_SEC))
        c->backoff_ms = BACKOFF_MIN_MS;
    int delay = c->backoff_ms;
    c->backoff_ms = c->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : c->backoff_ms * 2;
    c->state = CHILD_BACKOFF;
    c->restart_at = now + delay / 1000.0;
    if (c->pid > 0) sup_log(s, LOG_LEVEL_WARN, "restarting %s (pid %d %s) in %d ms", c->name, (int)c->pid, why, delay);
    else sup_log(s, LOG_LEVEL_WARN, "restarting %s (%s) in %d ms", c->name, why, delay);
    state_write(s);
}

static void start_workers(supervisor *s, double now)
{
    for (int i = 1; i < s->n; i++)
        if (!s->ch[i].started) child_start(s, &s->ch[i], now);
}

/* ---- stopping ---- */

static void begin_stop(supervisor *s, int exit_code, double now)
{
    if (s->phase == PHASE_STOPPING) return;
    s->phase = PHASE_STOPPING;
    s->exit_code = exit_code;
    s->stop_deadline = now + STOP_TIMEOUT_SEC;
    for (int i = 0; i < s->n; i++) {
        child *c = &s->ch[i];
        if (c->alive) kill_child(c, SIGTERM);
        else if (c->state == CHILD_BACKOFF) c->state = CHILD_EXITED;
    }
    state_write(s);
}

/* A failure that restarting cannot cure ends the run with status 1. When the job was running, dflashd is first asked
 * (SIGUSR1) to have the committed state checkpointed and to end the job there, so that --resume continues from it;
 * nothing is restarted meanwhile, and the stop follows when dflashd exits or after SAVE_TIMEOUT_SEC. */
static void give_up(supervisor *s, const char *why, double now)
{
    child *d = &s->ch[0], *writer = NULL; /* drafter rank 0 writes the checkpoint: without it there is none to wait for */
    for (int i = 1; i < s->n; i++)
        if (strcmp(s->ch[i].name, "drafter-0") == 0) writer = &s->ch[i];
    snprintf(s->gave_up, sizeof s->gave_up, "%s", why);
    if (s->phase != PHASE_RUNNING || s->saving || !d->alive || d->state != CHILD_READY || !writer || !writer->alive ||
        writer->state != CHILD_READY) {
        sup_log(s, LOG_LEVEL_ERROR, "%s; stopping the job", why);
        begin_stop(s, 1, now);
        return;
    }
    sup_log(s, LOG_LEVEL_ERROR, "%s; stopping the job after the committed state is checkpointed", why);
    s->saving = 1;
    s->save_deadline = now + SAVE_TIMEOUT_SEC;
    kill(d->pid, SIGUSR1);
}

static void kill_all(supervisor *s, const char *why)
{
    for (int i = 0; i < s->n; i++) {
        child *c = &s->ch[i];
        if (!c->alive) continue;
        sup_log(s, LOG_LEVEL_WARN, "%s (pid %d) %s: SIGKILL", c->name, (int)c->pid, why);
        kill_child(c, SIGKILL);
    }
    s->killed_all = 1;
}

/* ---- events ---- */

static child *child_by_pid(supervisor *s, pid_t pid)
{
    if (pid <= 0) return NULL;
    for (int i = 0; i < s->n; i++)
        if (s->ch[i].started && s->ch[i].pid == pid) return &s->ch[i];
    return NULL;
}

static void watchdog_fire(supervisor *s, child *c, const char *why, double now)
{
    snprintf(c->kill_why, sizeof c->kill_why, "%s", why);
    sup_log(s, LOG_LEVEL_WARN, "watchdog: %s (pid %d) %s: SIGABRT", c->name, (int)c->pid, why);
    c->watchdog_fired = 1;
    c->kill_at = now + WATCHDOG_KILL_SEC;
    kill_child(c, SIGABRT);
}

static void handle_message(supervisor *s, notify_msg *m, double now)
{
    child *c = child_by_pid(s, m->pid);
    if (!c) {
        log_debug("notify message from unknown pid %d ignored", (int)m->pid);
        notify_msg_close_fds(m);
        return;
    }
    if (m->fdstore && m->nfds > 0) fdstore_add(s, c, m);
    else if (m->nfds > 0) {
        log_debug("%s: %d fd(s) without FDSTORE=1 closed", c->name, m->nfds);
        notify_msg_close_fds(m);
    }
    if (m->fdstore_remove && m->has_fdname) fdstore_remove(c, m->fdname);
    if (c == &s->ch[0] && m->has_step) s->committed = m->step;
    if (c == &s->ch[0] && m->has_killed) { /* sent before the kill: here before the death is reaped */
        child *k = child_by_pid(s, m->killed_pid);
        if (k && k->alive && k != c) {
            k->hb_killed = 1;
            snprintf(k->kill_why, sizeof k->kill_why, "dflashd: %.150s", m->killed_why);
        }
    }
    if (m->has_status) {
        snprintf(c->status, sizeof c->status, "%s", m->status);
        s->last_status_child = (int)(c - s->ch);
        progress_update(s);
    }
    if (m->has_warn) sup_log(s, LOG_LEVEL_WARN, "%s: %s", c->name, m->warn);
    if (m->has_note) sup_log(s, LOG_LEVEL_INFO, "%s: %s", c->name, m->note);
    if (!c->alive) return; /* a late message of a dead instance: only its fd store and status count */
    if (m->watchdog) c->last_ping = now;
    if (m->stopping) c->stopping = 1;
    if (m->finished && c == &s->ch[0]) c->finished = 1;
    if (m->has_stalled && c == &s->ch[0]) sup_log(s, LOG_LEVEL_WARN, "%s", m->stalled);
    if (m->ready && c->state == CHILD_STARTING) {
        c->state = CHILD_READY;
        c->failed_starts = 0;
        c->ready_count++;
        c->last_ping = now;
        sup_log(s, LOG_LEVEL_INFO, "%s ready (pid %d)", c->name, (int)c->pid);
        state_write(s);
        if (c == &s->ch[0] && s->phase == PHASE_STARTUP) {
            s->phase = PHASE_RUNNING;
            start_workers(s, now);
        }
    }
    if (m->watchdog_trigger && !c->watchdog_fired && s->phase != PHASE_STOPPING)
        watchdog_fire(s, c, "sent WATCHDOG=trigger", now);
}

static void drain_notify(supervisor *s)
{
    static notify_msg m; /* large (fds): not on the stack */
    for (;;) {
        int r = notify_recv(s->notify_fd, &m);
        if (r == 0) return;
        if (r == -EMSGSIZE) {
            sup_log(s, LOG_LEVEL_WARN, "%s: oversized notify message dropped", s->notify_path);
            continue;
        }
        if (r < 0) {
            sup_log(s, LOG_LEVEL_WARN, "%s: recvmsg: %s", s->notify_path, strerror(-r));
            return;
        }
        handle_message(s, &m, now_seconds());
    }
}

/* The last error line a child wrote to its log, else its last line (for the message that ends a run). */
static void child_last_log_line(const supervisor *s, const child *c, char *out, size_t n)
{
    char path[PATH_MAX + 64], line[1024];
    int have_error = 0;
    snprintf(path, sizeof path, "%s/%s.log", s->logs_dir, c->name);
    snprintf(out, n, "%.*s", (int)(n > 1 ? n - 1 : 0), path);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) {
        int is_error = strstr(line, " ERROR ") != NULL;
        if (is_error || !have_error) snprintf(out, n, "%.*s", (int)(n > 1 ? n - 1 : 0), line);
        have_error |= is_error;
    }
    if (f) fclose(f);
    out[strcspn(out, "\n")] = 0;
}

/* A worker killed for showing no sign of life (the watchdog, or dflashd for missed heartbeats): the KILL_LIMIT-th
 * such death in a row with no step committed since the first ends the run. A step that takes long but progresses
 * keeps its signs of life (common/job/worker.h), so this is a worker that hangs. 1 when the run gives up. */
static int liveness_kill_counted(supervisor *s, child *c, double now)
{
    if (c->liveness_kills == 0 || c->kills_step != s->committed) {
        c->liveness_kills = 0;
        c->kills_step = s->committed;
    }
    if (++c->liveness_kills < KILL_LIMIT) return 0;
    char msg[1200];
    snprintf(msg, sizeof msg, "%s was killed %d times in a row for showing no sign of life, with no step committed "
             "since step %llu (the last time: %s): its work does not progress (see %.700s/%s.log)", c->name,
             c->liveness_kills, c->kills_step, c->kill_why, s->logs_dir, c->name);
    c->state = CHILD_EXITED;
    give_up(s, msg, now);
    return 1;
}

static void handle_exit(supervisor *s, child *c, int status, double now)
{
    int failed_start = c->state == CHILD_STARTING && WIFEXITED(status) && WEXITSTATUS(status) != 0;
    c->alive = 0;
    c->kill_at = 0;
    char why[64];
    if (WIFSIGNALED(status)) snprintf(why, sizeof why, "killed by signal %d", WTERMSIG(status));
    else snprintf(why, sizeof why, "exited with status %d", WEXITSTATUS(status));
    if (s->phase == PHASE_STOPPING) {
        c->state = CHILD_EXITED;
        sup_log(s, LOG_LEVEL_INFO, "%s (pid %d) %s", c->name, (int)c->pid, why);
        state_write(s);
        return;
    }
    if (s->saving) { /* giving up: nothing is restarted; dflashd's exit ends the wait for the checkpoint */
        c->state = CHILD_EXITED;
        sup_log(s, LOG_LEVEL_INFO, "%s (pid %d) %s", c->name, (int)c->pid,
                c == &s->ch[0] && c->finished ? "ended the job at the committed step" : why);
        state_write(s);
        if (c == &s->ch[0]) begin_stop(s, 1, now);
        return;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == JOB_EXIT_FATAL) { /* a cause no restart cures (job_state.h) */
        char last[1024], msg[1200];
        child_last_log_line(s, c, last, sizeof last);
        snprintf(msg, sizeof msg, "%s %s, a failure no restart cures: %s", c->name, why, last);
        c->state = CHILD_EXITED;
        give_up(s, msg, now);
        return;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && c == &s->ch[0] && !c->finished) {
        /* dflashd exits 0 when stopped by a signal (systemctl stop) without finishing the job: here, where nothing
         * else would start it again, restart it like any dflashd that went away; it reattaches */
        child_schedule_restart(s, c, "stopped without finishing the job", now);
        return;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        c->state = CHILD_EXITED;
        sup_log(s, LOG_LEVEL_INFO, "%s (pid %d) finished", c->name, (int)c->pid);
        state_write(s);
        if (c == &s->ch[0]) {
            sup_log(s, LOG_LEVEL_INFO, "dflashd finished: stopping the workers");
            begin_stop(s, 0, now);
        }
        return;
    }
    if (c == &s->ch[0] && s->phase == PHASE_STARTUP && WIFEXITED(status)) {
        /* dflashd refused to start (bad config, missing model...): restarting it cannot help; say why and stop */
        char last[1024];
        child_last_log_line(s, c, last, sizeof last);
        sup_log(s, LOG_LEVEL_ERROR, "dflashd failed to start (%s): %s", why, last);
        begin_stop(s, 1, now);
        return;
    }
    if ((c->watchdog_fired || c->hb_killed) && c != &s->ch[0] && liveness_kill_counted(s, c, now)) return;
    /* like systemd's start limit: a worker that keeps failing before it is ready will not get better by itself */
    if (failed_start && ++c->failed_starts >= START_LIMIT) {
        char last[1024], msg[1200];
        child_last_log_line(s, c, last, sizeof last);
        snprintf(msg, sizeof msg, "%s failed %d times in a row before becoming ready (%s): %s", c->name,
                 c->failed_starts, why, last);
        c->state = CHILD_EXITED;
        give_up(s, msg, now);
        return;
    }
    child_schedule_restart(s, c, why, now);
}

static void reap_children(supervisor *s, double now)
{
    for (;;) {
        /* Look first (WNOWAIT: it stays a zombie, its pid still names it): what it sent before dying is queued by
         * now, even when it died after the previous drain, so apply that (FDSTORE, X_DFLASH_FINISHED), then reap. */
        siginfo_t si = {0};
        if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) < 0 || si.si_pid <= 0) return;
        drain_notify(s);
        int status;
        pid_t pid = waitpid(si.si_pid, &status, 0);
        if (pid <= 0) return;
        child *c = child_by_pid(s, pid);
        if (c && c->alive) handle_exit(s, c, status, now);
    }
}

static void handle_signals(supervisor *s, double now)
{
    struct signalfd_siginfo si;
    while (read(s->sig_fd, &si, sizeof si) == (ssize_t)sizeof si) {
        int sig = (int)si.ssi_signo;
        if (sig == SIGCHLD) {
            reap_children(s, now);
        } else if (s->phase == PHASE_STOPPING && s->stop_signal) {
            sup_log(s, LOG_LEVEL_WARN, "SIG%s again: killing every child now", sigabbrev_np(sig));
            kill_all(s, "still running");
        } else {
            sup_log(s, LOG_LEVEL_INFO, "SIG%s: stopping every child (SIGTERM, SIGKILL after %.0f s)", sigabbrev_np(sig),
                    STOP_TIMEOUT_SEC);
            s->stop_signal = sig;
            if (s->phase == PHASE_STOPPING) s->exit_code = 128 + sig;
            begin_stop(s, 128 + sig, now);
        }
    }
}

/* 1 when deadline t has come; otherwise lowers *next to t. */
static int due(double t, double now, double *next)
{
    if (t <= now) return 1;
    if (t < *next) *next = t;
    return 0;
}

/* Fire due timers; returns the earliest next deadline (INFINITY: none). */
static double run_timers(supervisor *s, double now)
{
    double next = INFINITY;
#define DUE(t) due((t), now, &next)
    if (s->phase == PHASE_STARTUP && DUE(s->ready_deadline)) {
        sup_log(s, LOG_LEVEL_ERROR, "dflashd sent no READY=1 within %g s (see %s/dflashd.log): stopping",
                s->ready_timeout, s->logs_dir);
        begin_stop(s, 1, now);
    }
    for (int i = 0; i < s->n; i++) {
        child *c = &s->ch[i];
        if (c->state == CHILD_BACKOFF && s->phase != PHASE_STOPPING && DUE(c->restart_at)) child_start(s, c, now);
        if (c->alive && c->kill_at > 0 && DUE(c->kill_at)) {
            sup_log(s, LOG_LEVEL_WARN, "%s (pid %d) still running %.0f s after SIGABRT: SIGKILL", c->name,
                    (int)c->pid, WATCHDOG_KILL_SEC);
            kill_child(c, SIGKILL);
            c->kill_at = 0;
        }
        if (s->watchdog_sec > 0 && c->alive && c->state == CHILD_READY && !c->stopping && !c->watchdog_fired &&
            s->phase != PHASE_STOPPING && DUE(c->last_ping + s->watchdog_sec)) {
            char why[96];
            snprintf(why, sizeof why, "sent no WATCHDOG=1 for %.1f s", now - c->last_ping);
            watchdog_fire(s, c, why, now);
        }
    }
    if (s->saving && s->phase != PHASE_STOPPING && DUE(s->save_deadline)) {
        sup_log(s, LOG_LEVEL_ERROR, "the committed state was not checkpointed within %.0f s: stopping without it",
                SAVE_TIMEOUT_SEC);
        begin_stop(s, 1, now);
    }
    if (s->phase == PHASE_STOPPING && !s->killed_all && DUE(s->stop_deadline))
        kill_all(s, "still running 10 s after SIGTERM");
    double p = progress_tick(s, now);
    if (p < next) next = p;
#undef DUE
    return next;
}

static int any_alive(const supervisor *s)
{
    for (int i = 0; i < s->n; i++)
        if (s->ch[i].alive) return 1;
    return 0;
}

static int event_loop(supervisor *s)
{
    for (;;) {
        /* what the children sent first, then the timers: after this process was not scheduled for a while, the
         * WATCHDOG=1 pings queued meanwhile must count before a watchdog is judged overdue */
        drain_notify(s);
        double now = now_seconds();
        double next = run_timers(s, now);
        if (s->phase == PHASE_STOPPING && !any_alive(s)) break;
        if (s->phase == PHASE_STOPPING && s->killed_all && now > s->stop_deadline + STOP_GIVE_UP_SEC) {
            sup_log(s, LOG_LEVEL_ERROR, "children still alive %.0f s after SIGKILL: giving up on them",
                    STOP_GIVE_UP_SEC);
            if (s->exit_code == 0) s->exit_code = 1;
            break;
        }
        if (s->phase == PHASE_STOPPING && s->killed_all) {
            double g = s->stop_deadline + STOP_GIVE_UP_SEC + 0.01;
            if (g < next) next = g;
        }
        int timeout = 1000;
        if (next < INFINITY) {
            double ms = ceil((next - now) * 1000.0);
            timeout = ms < 0 ? 0 : ms > 1000 ? 1000 : (int)ms; /* a 1 s tick: a deadline set by a timer is seen */
        }
        struct pollfd pf[2] = {{.fd = s->notify_fd, .events = POLLIN}, {.fd = s->sig_fd, .events = POLLIN}};
        int r = poll(pf, 2, timeout);
        if (r < 0 && errno != EINTR) {
            sup_log(s, LOG_LEVEL_ERROR, "poll: %s", strerror(errno));
            begin_stop(s, 1, now_seconds());
            kill_all(s, "supervisor failing");
        }
        if (r <= 0) continue;
        if (pf[0].revents) drain_notify(s);
        if (pf[1].revents) handle_signals(s, now_seconds());
    }
    return s->exit_code;
}

/* ---- setup ---- */

static int mkdir_p(const char *path, errbuf *err)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return errbuf_set(err, ENAMETOOLONG, "%s: path too long", path);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char saved = *p;
            *p = '\0';
            if (mkdir(buf, 0750) < 0 && errno != EEXIST)
                return errbuf_set(err, errno, "job.run_dir: cannot create %s: %s", buf, strerror(errno));
            *p = saved;
            if (!saved) break;
        }
    }
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode))
        return errbuf_set(err, ENOTDIR, "job.run_dir: %s is not a folder", path);
    return 0;
}

static char **argv_build(const supervisor_opts *o, const char *path, int index, int resume)
{
    int cap = 8 + 2 * o->noverrides, k = 0;
    char **argv = xcalloc((size_t)cap, sizeof *argv);
    argv[k++] = xstrdup(path);
    argv[k++] = xstrdup("-c");
    argv[k++] = xstrdup(o->config_path);
    if (index >= 0) {
        char buf[16];
        snprintf(buf, sizeof buf, "%d", index);
        argv[k++] = xstrdup("--index");
        argv[k++] = xstrdup(buf);
    }
    for (int i = 0; i < o->noverrides; i++) {
        argv[k++] = xstrdup("--set");
        argv[k++] = xstrdup(o->overrides[i]);
    }
    /* dflashd: --fresh because this run already decided (supervisor_setup): a dflashd restarted after a failed
     * reattach then sets a partial run aside rather than refusing in a loop */
    if (resume > 0) argv[k++] = xstrdup("--resume");
    else if (resume < 0) argv[k++] = xstrdup("--fresh");
    argv[k] = NULL;
    return argv;
}

static int child_init(supervisor *s, child *c, const char *name, const char *binary, int index, int resume,
                      errbuf *err)
{
    snprintf(c->name, sizeof c->name, "%s", name);
    size_t n = strlen(s->o->bin_dir) + strlen(binary) + 2;
    c->path = xmalloc(n);
    snprintf(c->path, n, "%s/%s", s->o->bin_dir, binary);
    if (access(c->path, X_OK) < 0)
        return errbuf_set(err, errno, "%s: cannot execute: %s (set --bin-dir or DFLASH_BIN_DIR)", c->path,
                          strerror(errno));
    c->argv = argv_build(s->o, c->path, index, resume);
    return 0;
}

static int supervisor_setup(supervisor *s, errbuf *err)
{
    const job_config *cfg = s->o->cfg;
    int rc = mkdir_p(cfg->job.run_dir, err);
    if (rc) return rc;
    if (!realpath(cfg->job.run_dir, s->run_dir))
        return errbuf_set(err, errno, "job.run_dir: %s: %s", cfg->job.run_dir, strerror(errno));
    /* one dflash run per run_dir, and none beside a dflashd already running there (systemd's, or one started by
     * hand): before anything is started or replaced (the notify socket, the logs) */
    if ((rc = run_lock_open(&s->lock, s->run_dir, RUN_LOCK_SUPERVISOR, err))) return rc;
    if ((rc = run_lock_check(s->run_dir, RUN_LOCK_DFLASHD, err))) return rc;
    char what[PATH_MAX + 64], dest[PATH_MAX];
    if (!s->o->resume && run_dir_previous(s->run_dir, what, sizeof what)) { /* before the logs are opened */
        if (!s->o->fresh) return run_dir_refuse(s->run_dir, what, err);
        if ((rc = run_dir_set_aside(s->run_dir, 1, dest, sizeof dest, err))) return rc;
        fprintf(stderr, "dflash run: --fresh: the previous run (%s) is now in %s\n", what, dest);
    }
    snprintf(s->logs_dir, sizeof s->logs_dir, "%.*s/logs", PATH_MAX - 8, s->run_dir);
    if ((rc = mkdir_p(s->logs_dir, err))) return rc;
    snprintf(s->notify_path, sizeof s->notify_path, "%.*s/notify", PATH_MAX - 8, s->run_dir);
    snprintf(s->state_path, sizeof s->state_path, "%.*s/supervisor.state", PATH_MAX - 32, s->run_dir);

    const int ntargets = job_role_workers(cfg, JOB_ROLE_TARGET), ndrafters = job_role_workers(cfg, JOB_ROLE_DRAFTER);
    const int nevals = job_role_workers(cfg, JOB_ROLE_EVAL);
    s->n = 1 + job_role_workers(cfg, JOB_ROLE_PREFETCH) + ntargets + ndrafters + nevals;
    s->ch = xcalloc((size_t)s->n, sizeof *s->ch);
    int k = 0;
    char name[32];
    if ((rc = child_init(s, &s->ch[k++], "dflashd", "dflashd", -1, s->o->resume ? 1 : -1, err))) return rc;
    if ((rc = child_init(s, &s->ch[k++], "prefetch", "dflash-prefetch", -1, 0, err))) return rc;
    /* the CUDA backend's GPU workers are their own builds (they link the CUDA runtime) */
    const int gpu = cfg->job.backend == JOB_BACKEND_CUDA;
    for (int i = 0; i < ntargets; i++) {
        snprintf(name, sizeof name, "target-%d", i);
        if ((rc = child_init(s, &s->ch[k++], name, gpu ? "dflash-target-cuda" : "dflash-target", i, 0, err)))
            return rc;
    }
    for (int i = 0; i < ndrafters; i++) {
        snprintf(name, sizeof name, "drafter-%d", i);
        if ((rc = child_init(s, &s->ch[k++], name, gpu ? "dflash-drafter-cuda" : "dflash-drafter", i, 0, err)))
            return rc;
    }
    for (int i = 0; i < nevals; i++) { /* the evaluation worker (eval.prompts): on GPU 0 beside target-0, drafter-0 */
        snprintf(name, sizeof name, "eval-%d", i);
        if ((rc = child_init(s, &s->ch[k++], name, gpu ? "dflash-eval-cuda" : "dflash-eval", i, 0, err))) return rc;
    }

    s->notify_fd = notify_socket_open(s->notify_path, err);
    if (s->notify_fd < 0) return s->notify_fd;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    if (sigprocmask(SIG_BLOCK, &set, NULL) < 0) return errbuf_set(err, errno, "sigprocmask: %s", strerror(errno));
    s->sig_fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (s->sig_fd < 0) return errbuf_set(err, errno, "signalfd: %s", strerror(errno));
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

static void supervisor_teardown(supervisor *s)
{
    for (int i = 0; s->ch && i < s->n; i++) {
        child *c = &s->ch[i];
        for (int j = 0; j < c->nfds; j++) close(c->fds[j].fd);
        for (char **a = c->argv; a && *a; a++) free(*a);
        free(c->argv);
        free(c->path);
    }
    XFREE(s->ch);
    if (s->notify_fd >= 0) {
        close(s->notify_fd);
        unlink(s->notify_path);
    }
    if (s->sig_fd >= 0) close(s->sig_fd);
    run_lock_destroy(&s->lock);
}

/* Every child is gone: the job's shared memory can go too. The fd store lived in this process, so nothing could
 * reattach to it (a --resume makes them afresh); left in /dev/shm they would only hold memory. */
static void segments_remove(const supervisor *s)
{
    job_plan *p = xcalloc(1, sizeof *p);
    errbuf err = {{0}};
    if (job_plan_load(p, s->o->config_path, s->o->overrides, s->o->noverrides, &err) == 0) {
        char name[128];
        int n = 0;
        n += shm_segment_unlink(p->ring_name, NULL) == 0;
        n += shm_segment_unlink(p->state_name, NULL) == 0;
        for (int i = 0; i < p->cfg.workers.targets; i++) {
            job_plan_pool_name(p, i, name, sizeof name);
            n += slot_pool_unlink(name, NULL) == 0;
        }
        if (n) log_info("removed %d shared-memory segment(s) of the job (%s-*)", n, p->shm_prefix);
    }
    free(p);
}

int supervisor_run(const supervisor_opts *opts, errbuf *err)
{
    supervisor s = {.o = opts, .notify_fd = -1, .sig_fd = -1, .last_status_child = -1,
                    .last_print = -INFINITY};
    s.watchdog_sec = opts->cfg->workers.watchdog_sec;
    const char *rt = getenv("DFLASH_READY_TIMEOUT");
    s.ready_timeout = (rt && atof(rt) > 0) ? atof(rt) : READY_TIMEOUT_SEC;
    s.tty = isatty(STDERR_FILENO) && !getenv("JOURNAL_STREAM");
    int rc = supervisor_setup(&s, err);
    if (rc) {
        supervisor_teardown(&s);
        return 1;
    }
    log_info("job %s: run_dir %s, %d target(s), %d drafter(s), watchdog %.3g s, binaries from %s",
             opts->cfg->job.name, s.run_dir, opts->cfg->workers.targets, opts->cfg->workers.drafters,
             s.watchdog_sec, opts->bin_dir);
    double now = now_seconds();
    s.phase = PHASE_STARTUP;
    s.ready_deadline = now + s.ready_timeout;
    child_start(&s, &s.ch[0], now);
    int code = event_loop(&s);
    segments_remove(&s);
    progress_hide(&s);
    char text[sizeof s.shown];
    progress_text(&s, text, sizeof text);
    if (text[0]) log_info("last status %s", text);
    state_write(&s);
    if (s.gave_up[0]) {
        char latest[PATH_MAX + 32];
        snprintf(latest, sizeof latest, "%s/ckpt/latest", s.run_dir);
        char target[64] = "";
        ssize_t n = readlink(latest, target, sizeof target - 1);
        if (n > 0) target[n] = '\0';
        log_error("gave up on the job: %s", s.gave_up);
        if (n > 0)
            log_error("the last checkpoint is %s -> %s: fix the cause, then `dflash run --resume` continues from it",
                      latest, target);
        else
            log_error("no checkpoint was written: fix the cause, then start the job again");
    }
    log_info("dflash run: exit %d", code);
    supervisor_teardown(&s);
    return code;
}
