/* run_dir: whether a run_dir holds a previous run (a ledger or a checkpoint), and setting that run aside for a fresh
 * one (`--fresh`): its ledger, metrics, checkpoints (and, for `dflash run`, logs and supervisor.state) move into
 * <run_dir>/previous-<UTC time>/, nothing is deleted. Called before anything of the new run exists; not thread
 * safe. Errors: 0 / -errno with an errbuf naming the path. */
#ifndef DFLASH_RUN_DIR_H
#define DFLASH_RUN_DIR_H

#include <stddef.h>

#include "util.h"

/* 1 when run_dir holds a previous run (ledger.jsonl not empty, or ckpt/latest), with what it holds in `what`;
 * 0 when not. */
int run_dir_previous(const char *run_dir, char *what, size_t n);
/* Move the previous run's files into a new <run_dir>/previous-YYYYMMDD-HHMMSS[-N]/ (its path in dest). */
int run_dir_set_aside(const char *run_dir, int with_logs, char *dest, size_t n, errbuf *err);
/* The refusal of a fresh start over a previous run, for `dflash run` and dflashd alike. */
int run_dir_refuse(const char *run_dir, const char *what, errbuf *err);

#endif
