/* target_model_impl: the CPU target model as the generic code (target_model.c, target_decode.c) and the families'
 * CPU files (target_dense.c, target_hybrid.c) share it, and the operations a family gives the CPU backend. The
 * generic code owns the frozen tables, RoPE frequencies and the residual stream; the family owns its layers
 * (m->layers) and their scratch. Only common/target includes it (and tests that poke a model's config). */
#ifndef DFLASH_TARGET_MODEL_IMPL_H
#define DFLASH_TARGET_MODEL_IMPL_H

#include "hf_config.h"
#include "safetensors.h"
#include "target_family.h"
#include "target_model.h"

struct target_model {
    hf_config cfg;
    const target_family *fam;            /* chosen at load from cfg (target_family_of) */
    int nlayers;                         /* layers loaded: [0, nlayers) */
    int full;                            /* final norm + all layers loaded */
    float *embed, *lm_head, *final_norm;
    double *inv_freq;                    /* (fam->rope_dims(cfg)/2) */
    void *layers;                        /* the family's layers (fam->cpu) */
    /* the packed forward's residual stream and final-norm rows, grown to the largest batch seen */
    int scratch_tokens;
    float *x, *u;
};

/* A family's operations on the CPU backend. The cache operations are NULL when the family cannot decode on the
 * CPU (its can[TARGET_BACKEND_CPU] says so, and target_cache_create checks that first). */
typedef struct target_cpu_ops {
    /* Layers [0, m->nlayers) of m->cfg from st (names under prefix) into m->layers. */
    int (*load)(target_model *m, const st_file *st, const char *prefix, errbuf *err);
    void (*destroy)(target_model *m);
    /* Layer li over the packed batch b: the residual stream x (T, H) updated in place (one call at a time per
     * model: the layers' scratch is the model's). */
    void (*layer)(target_model *m, int li, float *x, const target_batch *b);
    /* The family's part of a decoding cache of nseq sequences x max_len positions (only reads m). */
    void *(*cache_new)(const target_model *m, int nseq, int max_len);
    void (*cache_destroy)(void *cs);
    /* Before a forward of ids[0..n) of sequence seq from position past (scratch for n rows); keep: remember what
     * a later crop into this forward needs (0 while a crop re-runs tokens). NULL: nothing to do. */
    void (*cache_begin)(void *cs, int seq, int past, const int32_t *ids, int n, int keep);
    /* Layer li over the forward's n new rows x (n, H) of sequence seq at positions pos (n) (seqs (n): seq). */
    void (*cache_layer)(void *cs, const target_model *m, int li, float *x, int seq, int past, int n,
                        const int32_t *pos, const int32_t *seqs);
    /* Sequence seq holding `held` positions keeps len (0 <= len <= held): returns how many tokens the caller must
     * run again (keep = 0) from position *rerun_from, *rerun_ids, to rebuild the states (0: none; the caller sets
     * the length to *rerun_from first), or -EINVAL with nothing changed. */
    int (*cache_crop)(void *cs, const target_model *m, int seq, int len, int held, int *rerun_from,
                      const int32_t **rerun_ids, errbuf *err);
} target_cpu_ops;

/* Tap capture: the residual stream x (T, H) goes to the column block of every tap equal to layer li in aux
 * (T, ntaps*H). */
void target_capture_taps_cpu(float *aux, const int *taps, int ntaps, int li, const float *x, int T, int H);

#endif
