/* ledger: the batch ledger of a job, <run_dir>/ledger.jsonl, one JSON line per committed optimizer step:
 * {"step": k, "batches": [ids...], "tokens": n, "loss": x, "slot_accuracy": a, "acceptance": t, "grad_norm": g}.
 * Written by dflashd alone, in step order, from the drafters' step records in the job state; each line is fsynced
 * before the shared frontier advances, so a crash of dflashd at any point neither loses nor repeats a line (a torn
 * last line is cut off at reopen). Beside it, metrics.jsonl gets the training metrics of the same steps, one line
 * each: loss, per-slot accuracy (slots 1..B-1), simulated acceptance length, gradient norm, learning rate.
 * Single-threaded. */
#ifndef DFLASH_LEDGER_H
#define DFLASH_LEDGER_H

#include <stdint.h>

#include "job_state.h"
#include "util.h"

typedef struct ledger ledger;

/* Open (create) the ledger and reconcile it with the job state: lines beyond the committed step (from an earlier
 * run, or steps a resume will redo) are cut off, and the shared frontier is set to the lines kept. A ledger whose
 * lines are not steps 0, 1, 2... in order (a line deleted, edited, garbage) is refused untouched, naming the first
 * bad line; a torn last line is cut (ledger_notice says so). */
int ledger_open(ledger **out, const char *path, job_state *js, uint32_t ndrafters, errbuf *err);
/* What ledger_open cut that the operator should be told of (a torn last line), or "". */
const char *ledger_notice(const ledger *l);
/* Say what the metrics lines need beyond the records: the block size (the learning rate comes with each record). */
void ledger_set_block_size(ledger *l, int block_size);
/* metrics.tensorboard: also write each metrics line's scalars into a new TensorBoard event file in dir. */
int ledger_tensorboard_open(ledger *l, const char *dir, errbuf *err);
/* Append the lines of every step committed since the last call; returns lines written or -errno. */
int ledger_append_committed(ledger *l, job_state *js);
/* The evaluation worker's results not yet written (eval.jsonl's lines up to the job state's eval.done): one
 * metrics.jsonl line each {"step", "decoded_tau",
 * "decoded_slot_acceptance", "decoded_speedup", "decoded_prompts", "eval_seconds"} (no "loss": an evaluation, not
 * a training step) and the TensorBoard scalars decoded_tau and decoded_speedup at its step. Returns lines written. */
int ledger_append_eval(ledger *l, job_state *js);
void ledger_destroy(ledger **l);

#endif
