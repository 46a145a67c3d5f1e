/* target_family: the table of target families and the one place that picks a checkpoint's family from its
 * hf_config. A family is a row (target_families.def): its name, the configs it takes, what each backend can do with
 * it, where its checkpoint keeps the frozen tables (embedding, lm_head, final norm), and its operations per backend
 * (target_model_impl.h: CPU; target_model_cuda_impl.h: CUDA). What a family cannot do is said here and checked when
 * a job or command starts (target_family_require), not by a branch in a forward. No state; thread-safe; errors
 * name the model_type and the family. */
#ifndef DFLASH_TARGET_FAMILY_H
#define DFLASH_TARGET_FAMILY_H

#include "hf_config.h"
#include "safetensors.h"
#include "util.h"

enum target_backend { TARGET_BACKEND_CPU, TARGET_BACKEND_CUDA, TARGET_NBACKENDS };

/* What a family can do on a backend (bits of target_family.can). */
enum target_can {
    TARGET_CAN_FORWARD = 1 << 0,   /* the packed forward (taps, last hidden state, logits) */
    TARGET_CAN_DECODE = 1 << 1,    /* decoding with a cache: prefill, one token, a verified block, crop */
};

struct target_cpu_ops;

typedef struct target_family {
    const char *name;                        /* "dense", "hybrid": in messages */
    const char *about;                       /* what it covers, in messages: "qwen3 and llama targets" */
    int (*takes)(const hf_config *c);        /* whether this family runs the config */
    unsigned can[TARGET_NBACKENDS];          /* enum target_can bits per backend */
    /* The checkpoint: the text model's weight-name prefix ("model.", or "model.language_model." for the
     * vision-language checkpoints), under which the embedding and the final norm are (lm_head is top level). */
    const char *(*prefix)(const st_file *st);
    float norm_add;                          /* the final norm's scale is w + norm_add (1: zero-centred RMSNorm) */
    int (*rope_dims)(const hf_config *c);    /* the dimensions of a head that RoPE rotates */
    const struct target_cpu_ops *cpu;        /* target_model_impl.h */
} target_family;

/* The family of c: the first row that takes it; NULL when none does. */
const target_family *target_family_of(const hf_config *c);
/* The family of c when it can do `can` on backend be; else -ENOTSUP with a message that starts with `what` (e.g.
 * "decoding with a KV cache"), names c's model_type and, when c has a family, the family and what it can do on be.
 * *out may be NULL. */
int target_family_require(const hf_config *c, enum target_backend be, unsigned can, const char *what,
                          const target_family **out, errbuf *err);
const char *target_backend_name(enum target_backend be);

/* The frozen tables of the target checkpoint st of config c, as its family names them: embedding (V, H), lm_head
 * (V, H; the embedding when tied), final norm (H). Both drafter backends and both target backends take the names
 * from here (whoever loads a table reports it missing). -ENOTSUP when c has no family. */
typedef struct target_tables {
    char embed[192], lm_head[192], norm[192];
    int tied;                                /* lm_head is the embedding (lm_head[] names the embedding) */
    float norm_add;                          /* as the family's */
} target_tables;
int target_tables_find(const hf_config *c, const st_file *st, target_tables *t, errbuf *err);

#endif
