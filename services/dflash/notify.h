/* notify: the receiving side of systemd's notify protocol (sd_notify(3)) for `dflash run`. One AF_UNIX datagram
 * socket with SO_PASSCRED: each message carries its sender's pid (SCM_CREDENTIALS), newline-separated KEY=VALUE
 * text and optionally fds (SCM_RIGHTS). Received fds are close-on-exec and owned by the caller (notify_msg_close_fds).
 * Not thread-safe (one caller: the supervisor's event loop); errors are -errno with an errbuf naming the path. */
#ifndef DFLASH_NOTIFY_H
#define DFLASH_NOTIFY_H

#include <stddef.h>
#include <sys/types.h>

#include "util.h"

#define NOTIFY_MSG_MAX 4096     /* systemd's limit for one notify datagram */
#define NOTIFY_MAX_FDS 253      /* SCM_MAX_FD */
#define NOTIFY_TEXT_MAX 256     /* STATUS= and FDNAME= values are cut to this (with the NUL) */
#define NOTIFY_ALERT_MAX 1024   /* X_DFLASH_STALLED= values (a reason with its file names) */

/* One parsed message. Flags are 1 when the key was present with the value systemd acts on. */
typedef struct notify_msg {
    pid_t pid;                   /* sender, from SCM_CREDENTIALS; 0 when the message had none */
    int ready, stopping, watchdog, watchdog_trigger, fdstore, fdstore_remove;
    int finished;                /* X_DFLASH_FINISHED=1: dflashd says the job is done (systemd ignores X_ keys) */
    int has_stalled;             /* X_DFLASH_STALLED=<text>: dflashd says no step commits, and why (or that a
                                  * checkpoint cannot be written, or is written again) */
    char stalled[NOTIFY_ALERT_MAX];
    int has_warn;                /* X_DFLASH_WARN=<text>: a warning for the console (a torn ledger line cut...) */
    char warn[NOTIFY_ALERT_MAX];
    int has_note;                /* X_DFLASH_NOTE=<text>: a line for the console (the evaluation worker's tau) */
    char note[NOTIFY_TEXT_MAX];
    int has_killed;              /* X_DFLASH_KILLED=<pid> <reason>: dflashd killed that worker for missed heartbeats */
    pid_t killed_pid;
    char killed_why[NOTIFY_TEXT_MAX];
    int has_step;                /* X_DFLASH_STEP=<n>: dflashd's committed step */
    unsigned long long step;
    int has_status, has_fdname;
    char status[NOTIFY_TEXT_MAX]; /* control characters replaced by spaces */
    char fdname[NOTIFY_TEXT_MAX];
    int nfds;
    int fds[NOTIFY_MAX_FDS];
} notify_msg;

/* Bind a non-blocking datagram socket at path (a stale socket file there is replaced) with SO_PASSCRED on.
 * Returns the fd or -errno. */
int notify_socket_open(const char *path, errbuf *err);
/* Receive one message without blocking: 1 one message in *m, 0 none pending, -errno on error. A truncated message
 * is dropped (its fds closed) and reported as -EMSGSIZE. */
int notify_recv(int sock, notify_msg *m);
/* Parse the text of a message (n bytes, need not be NUL-terminated) into m's flags and values; fds untouched. */
void notify_parse(const char *text, size_t n, notify_msg *m);
/* 1 when name is a valid FDNAME (1..255 printable characters, no ':'), else 0. */
int notify_fdname_valid(const char *name);
/* Close every fd the message carried and set nfds to 0. */
void notify_msg_close_fds(notify_msg *m);

#endif
