/* checkpoint: training checkpoints of a job under <run_dir>/ckpt: step-NNNNNNNN/ holds the drafter in the z-lab
 * layout (model.safetensors bf16 + config.json, loadable by z-lab's and vLLM's code), optimizer.safetensors (fp32
 * master weights and AdamW moments as flat tensors "master", "adam_m", "adam_v") and trainer_state.json (step,
 * committed batch frontier, seed). A checkpoint is built in a temporary folder, fsynced and renamed into place, then
 * `latest` (a symlink) is switched atomically; a crash at any point leaves the previous checkpoint valid. A reader
 * resolves `latest` once and holds that step folder (a shared flock) while it reads, so that retention
 * (checkpoint_prune) never removes a checkpoint being read. */
#ifndef DFLASH_CHECKPOINT_H
#define DFLASH_CHECKPOINT_H

#include <stdint.h>

#include "hf_config.h"
#include "util.h"

typedef struct checkpoint_state {
    uint64_t step;               /* optimizer steps applied */
    uint64_t batches_committed;  /* ledger frontier in batches */
    int seed;
} checkpoint_state;

/* Write step `st->step` from flat fp32 weights/moments (numel each) of a drafter with config `drafter`. */
int checkpoint_write(const char *root, const hf_config *drafter, const float *w, const float *m, const float *v,
                     uint64_t numel, const checkpoint_state *st, errbuf *err);
/* Whether root/step-NNNNNNNN exists (complete: it is renamed into place only when complete). */
int checkpoint_exists(const char *root, uint64_t step);
/* Read `latest` (or the given step folder when dir != NULL) into w/m/v (numel each) and *st. */
int checkpoint_read(const char *root, const char *dir, float *w, float *m, float *v, uint64_t numel,
                    checkpoint_state *st, errbuf *err);
/* Hold step's folder as a reader does (a shared flock on *fd; close(*fd) releases it) while something else reads it
 * (dflash-eval's drafter); -ENOENT when it is not there (not written yet, or pruned). */
int checkpoint_hold_step(const char *root, uint64_t step, int *fd, errbuf *err);
/* Only trainer_state.json of `latest` (or dir): the step to resume from. */
int checkpoint_read_state(const char *root, const char *dir, checkpoint_state *st, errbuf *err);
/* Retention (train.keep_checkpoints, train.keep_every). */
typedef struct checkpoint_retention {
    int keep_checkpoints;        /* the newest this many are kept (0: all) */
    int keep_every;              /* every step that is a multiple of this is kept too (0: none) */
} checkpoint_retention;
typedef struct checkpoint_disk {
    int kept, removed, busy;     /* busy: beyond the retention but held by a reader, left for the next prune */
    uint64_t bytes;              /* the disk the kept checkpoints take */
} checkpoint_disk;
/* After step `latest` is written and `latest` points to it: remove root's step folders beyond the retention (never
 * `latest`'s, never one a reader holds) and say what is kept in *disk. 0 or -errno (root unreadable) with err. */
int checkpoint_prune(const char *root, const checkpoint_retention *keep, uint64_t latest, checkpoint_disk *disk,
                     errbuf *err);
/* Path of step's folder. */
void checkpoint_dir(const char *root, uint64_t step, char *out, size_t n);

#endif
