/* drafter_layout: the one table of the DFlash drafter's trainable parameters (z-lab names, shapes, offsets into the
 * flat fp32 buffers, weight decay), derived from its config. Initialisation, the job plan's parameter count,
 * checkpoint export, every model backend and the optimizer read it; nothing else lays the parameters out. Tensor
 * order: fc, hidden_norm, norm, then per layer the LP_* tensors below. */
#ifndef DFLASH_DRAFTER_LAYOUT_H
#define DFLASH_DRAFTER_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "hf_config.h"

/* One named parameter tensor inside the flat buffers. */
typedef struct drafter_param {
    char name[96];
    int ndim;
    int64_t shape[2];
    size_t offset, numel;
    int decay;  /* matrices get weight decay, norm weights do not */
} drafter_param;

typedef struct drafter_layout {
    drafter_param *params;
    int nparams;
    size_t numel;
} drafter_layout;

enum { DRAFTER_PARAM_FC, DRAFTER_PARAM_HIDDEN_NORM, DRAFTER_PARAM_NORM, DRAFTER_PARAM_LAYER0 };
enum { LP_IN_NORM, LP_POST_NORM, LP_WQ, LP_WK, LP_WV, LP_WO, LP_Q_NORM, LP_K_NORM, LP_GATE, LP_UP, LP_DOWN, LP_COUNT };

/* Lay out the parameters of a drafter with this config (allocates the table). */
void drafter_layout_init(drafter_layout *L, const hf_config *cfg);
void drafter_layout_destroy(drafter_layout *L);
/* Parameter count without keeping the table. */
size_t drafter_layout_numel(const hf_config *cfg);
/* Tensor j (LP_*) of layer l. */
const drafter_param *drafter_layout_layer(const drafter_layout *L, int l, int j);
const drafter_param *drafter_layout_find(const drafter_layout *L, const char *name);
/* Fresh weights into w (numel): matrices normal(0, 0.02), norm weights 1, from the seed; the same values whatever
 * the number of threads it uses (one random stream per tensor). */
void drafter_layout_init_weights(const drafter_layout *L, float *w, uint64_t seed);

#endif
