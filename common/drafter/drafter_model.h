/* drafter_model: the trainable DFlash drafter on the CPU backend (docs/drafter.md). Parameters, gradients and the
 * AdamW moments are fp32 flat arrays laid out by drafter_layout (z-lab names), so that optimizer steps, reductions
 * and checkpoints work on whole buffers; a view model (drafter_model_create_view) works on buffers it does not own. The frozen embedding and lm_head belong to the target and are
 * passed in; they are never copied into the drafter. One model per thread; errors name the file and tensor. */
#ifndef DFLASH_DRAFTER_MODEL_H
#define DFLASH_DRAFTER_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "anchors.h"
#include "drafter_layout.h"
#include "hf_config.h"
#include "safetensors.h"
#include "util.h"

typedef struct drafter_model drafter_model;

/* Frozen tables of the target, shared by reference. */
typedef struct drafter_frozen {
    const float *embed;    /* (V, H) */
    const float *lm_head;  /* (V, H) */
    int vocab;
} drafter_frozen;

/* Fresh model: matrices normal(0, 0.02), norm weights 1, from the seed. cfg must be a DFlash config. */
drafter_model *drafter_model_create(const hf_config *cfg, uint64_t seed);
/* A model without buffers of its own: its weights and gradients are views bound by drafter_model_bind (the
 * training state of the reducer), so a drafter rank keeps no second copy of the parameters. */
drafter_model *drafter_model_create_view(const hf_config *cfg);
/* Point the model at weights (read only, numel floats) and a gradient buffer (numel floats, accumulated into). */
void drafter_model_bind(drafter_model *m, const float *weights, float *grads);
/* Load a z-lab checkpoint directory (config.json + model.safetensors, bf16 or f32). When target is given, the
 * drafter's hidden size, vocab and tap layers are checked against it. */
int drafter_model_load(drafter_model **out, const char *dir, const hf_config *target, errbuf *err);
/* Write config.json + model.safetensors (dtype ST_BF16 or ST_F32) into dir (created), atomically per file. */
int drafter_model_save(const drafter_model *m, const char *dir, enum st_dtype dtype, errbuf *err);
/* The same from flat fp32 weights laid out by drafter_layout for this config (no model needed). */
int drafter_weights_save(const hf_config *drafter, const float *w, const char *dir, enum st_dtype dtype, errbuf *err);
void drafter_model_destroy(drafter_model **m);

const hf_config *drafter_model_config(const drafter_model *m);
const drafter_layout *drafter_model_layout(const drafter_model *m);
int drafter_param_count(const drafter_model *m);
const drafter_param *drafter_param_at(const drafter_model *m, int i);
const drafter_param *drafter_param_find(const drafter_model *m, const char *name);
/* Flat buffers, drafter_numel() floats each. */
size_t drafter_numel(const drafter_model *m);
float *drafter_weights(drafter_model *m);
float *drafter_grads(drafter_model *m);
float *drafter_adam_m(drafter_model *m);
float *drafter_adam_v(drafter_model *m);
void drafter_grads_zero(drafter_model *m);

/* Per-batch results of a forward(+backward). */
#define DRAFTER_MAX_BLOCK DFLASH_MAX_BLOCK
typedef struct drafter_metrics {
    double loss_sum;       /* Σ w·CE over valid slots */
    double weight_sum;     /* Σ w */
    long slot_total[DRAFTER_MAX_BLOCK], slot_correct[DRAFTER_MAX_BLOCK];  /* per slot k, valid slots only */
    double accept_sum;     /* Σ over blocks of 1 + run of correct slots from slot 1 */
    long nblocks;
} drafter_metrics;

/* Optional full outputs for tests and goldens (each may be NULL): context F (T, H), final hidden (N*B, H),
 * logits (N*B, V), slot CE (N*B; 0 where not trained). */
typedef struct drafter_outputs {
    float *context, *final_hidden, *logits, *slot_ce;
} drafter_outputs;

/* Forward over one packed batch, and when backward != 0 the gradients of loss_scale·Σ w·CE, added into the
 * model's gradient buffer. aux (T, K*H) are the target taps; positions (T) restart per sequence. Metrics are
 * added into *metrics (may be NULL). */
void drafter_forward_backward(drafter_model *m, const drafter_frozen *fz, const float *aux, int ntok,
                              const int32_t *positions, const drafter_blocks *blk, int backward, float loss_scale,
                              drafter_metrics *metrics, drafter_outputs *out);

/* Simulated acceptance length of the metrics, and per-slot accuracy of slot k (NaN when no valid slot). */
double drafter_metrics_acceptance(const drafter_metrics *mt);
double drafter_metrics_slot_accuracy(const drafter_metrics *mt, int k);

#endif
