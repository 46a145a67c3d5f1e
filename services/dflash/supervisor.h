/* supervisor: the embedded default's supervising parent (`dflash run`). It plays systemd's part on a machine
 * without it: starts dflashd, waits for its READY=1, starts the configured workers (each in its own process group,
 * stdout/stderr appended to <run_dir>/logs/<name>.log), restarts whichever dies with backoff, speaks the notify
 * protocol (READY, STATUS, WATCHDOG, STOPPING, FDSTORE/FDSTOREREMOVE; stored fds go back as LISTEN_FDS) and keeps
 * <run_dir>/supervisor.state. dflashd's exit 0 ends the job only after it said X_DFLASH_FINISHED=1 (it also exits 0
 * when stopped by a signal: then it is started again). One per run_dir (run_lock.h), and none beside a live dflashd
 * there. Single-threaded: one poll loop with timers. Startup errors fill an errbuf. */
#ifndef DFLASH_SUPERVISOR_H
#define DFLASH_SUPERVISOR_H

#include "job_config.h"
#include "util.h"

typedef struct supervisor_opts {
    const job_config *cfg;         /* the loaded job (run_dir, workers.*) */
    const char *config_path;       /* absolute path passed to every child as -c */
    const char *bin_dir;           /* folder holding dflashd, dflash-prefetch, dflash-target, dflash-drafter */
    const char *const *overrides;  /* "section.key=value", passed to every child as --set */
    int noverrides;
    int resume;                    /* pass --resume to dflashd */
    int fresh;                     /* a previous run in run_dir is moved aside (run_dir.h), not refused */
} supervisor_opts;

/* Run the job. Returns the process exit status: 0 when dflashd finished the job and every child is gone,
 * 128+sig after SIGINT/SIGTERM/SIGHUP, 1 on a startup error (message in err) or when dflashd never got ready. */
int supervisor_run(const supervisor_opts *opts, errbuf *err);

#endif
