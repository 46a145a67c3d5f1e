/* target_model: the frozen target LLM (Hugging Face checkpoint) on the CPU backend, fp32 compute; its layers are
 * its family's (target_family.h: dense Qwen3 / Llama in target_dense.c, the hybrid Qwen3.5 / Qwen3.5-MoE /
 * Qwen3-Next in target_hybrid.c), chosen from its config at load
 * (bf16/f16 weights are upcast at load). The forward runs over a packed batch (cu_seqlens, positions restarting per
 * sequence) and writes tap i of token t straight into row t, columns [i*H, (i+1)*H) of a caller-owned (T, K*H)
 * buffer. It runs no layer deeper than the deepest one a call needs. One model per thread at a time (it owns its
 * scratch); errors name the checkpoint file and tensor. */
#ifndef DFLASH_TARGET_MODEL_H
#define DFLASH_TARGET_MODEL_H

#include <stdint.h>

#include "hf_config.h"
#include "util.h"

typedef struct target_model target_model;

/* A packed batch: T tokens in nseq sequences; positions restart at 0 in each sequence. */
typedef struct target_batch {
    int ntok, nseq;
    const int32_t *input_ids;   /* (T) */
    const int32_t *positions;   /* (T) */
    const int32_t *cu_seqlens;  /* (nseq+1) */
} target_batch;

/* Load what layers [0, max_layer] need (max_layer < 0: every layer, the final norm and lm_head). The embedding
 * and lm_head are always loaded (the drafter shares them). */
int target_model_load(target_model **out, const char *dir, int max_layer, errbuf *err);
void target_model_destroy(target_model **m);
const hf_config *target_model_config(const target_model *m);
/* Frozen tables shared with the drafter: (V, H) each; lm_head is the embedding when tied. */
const float *target_model_embedding(const target_model *m);
const float *target_model_lm_head(const target_model *m);
/* Deepest layer loaded (num_layers-1 when fully loaded). */
int target_model_loaded_layers(const target_model *m);

/* Forward. taps (ntaps ids, 0-based decoder layers) -> aux (T, ntaps*H) when aux != NULL; last (T, H): output of
 * the last layer before the final norm; logits (T, V). Either of last/logits may be NULL; asking for them needs a
 * fully loaded model. Token ids are checked against the vocabulary (error names the id and position). */
int target_model_forward(target_model *m, const target_batch *b, const int *taps, int ntaps, float *aux,
                         float *last, float *logits, errbuf *err);

/* Checks shared by the CPU and CUDA forwards. A packed batch: cu_seqlens from 0 to T, non-decreasing, token ids
 * inside the vocabulary (the message names the id and its position). */
int target_batch_check(const hf_config *c, const target_batch *b, errbuf *err);
/* The deepest layer a request needs (taps, plus every layer when last/logits are wanted), checked against what is
 * loaded: layers [0, nlayers), and the final norm + lm_head when full. */
int target_request_depth(const hf_config *c, int nlayers, int full, const int *taps, int ntaps, int want_output,
                         int *deepest, errbuf *err);

/* The spec's default taps: K layers evenly spaced from 1 to N-3, id_i = round(1 + i*(N-4)/(K-1)) (Python's
 * round-half-even); K = 1 gives N/2. */
void target_default_taps(int num_layers, int k, int *taps);

#endif
