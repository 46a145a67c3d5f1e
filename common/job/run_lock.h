/* run_lock: one live owner per run_dir. dflashd holds <run_dir>/dflashd.lock and `dflash run` holds
 * <run_dir>/supervisor.lock while they live: a write lock (fcntl) on the file, which also holds the owner's pid for
 * people. The kernel drops the lock when its holder dies, so a dflashd restarted after a SIGKILL (by systemd or by
 * `dflash run`) takes it again, and a lock file left by a dead process means nothing. Not inherited by children;
 * one lock per process and file (closing any other fd of the same file in the holder would drop it). Errors: 0 /
 * -errno with an errbuf naming the run_dir, the live owner and its pid. */
#ifndef DFLASH_RUN_LOCK_H
#define DFLASH_RUN_LOCK_H

#include "util.h"

enum run_lock_owner { RUN_LOCK_DFLASHD, RUN_LOCK_SUPERVISOR };

typedef struct run_lock run_lock;

/* Take the owner's lock of run_dir (which must exist) for this process; -EBUSY (message with the live holder's
 * pid) when another process holds it. */
int run_lock_open(run_lock **out, const char *run_dir, enum run_lock_owner owner, errbuf *err);
/* Whether the owner's lock of run_dir is held by a live process, without taking it: 0 when not, -EBUSY (the same
 * message as run_lock_open) when it is. */
int run_lock_check(const char *run_dir, enum run_lock_owner owner, errbuf *err);
/* Release the lock (the file stays; it means nothing without a live holder) and NULL the pointer. */
void run_lock_destroy(run_lock **l);

#endif
