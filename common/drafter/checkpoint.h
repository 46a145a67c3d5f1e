/* checkpoint: training checkpoints of a job under <run_dir>/ckpt: step-NNNNNNNN/ holds the drafter in the z-lab
 * layout (model.safetensors bf16 + config.json, loadable by z-lab's and vLLM's code), optimizer.safetensors (fp32
 * master weights and AdamW moments as flat tensors "master", "adam_m", "adam_v") and trainer_state.json (step,
 * committed batch frontier, seed). A checkpoint is built in a temporary folder, fsynced and renamed into place, then
 * `latest` (a symlink) is switched atomically; a crash at any point leaves the previous checkpoint valid. */
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
/* Only trainer_state.json of `latest` (or dir): the step to resume from. */
int checkpoint_read_state(const char *root, const char *dir, checkpoint_state *st, errbuf *err);
/* Path of step's folder. */
void checkpoint_dir(const char *root, uint64_t step, char *out, size_t n);

#endif
