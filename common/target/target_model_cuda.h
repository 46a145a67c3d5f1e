/* target_model_cuda: the frozen target LLM on one CUDA device, its layers its family's (target_family.h: dense Qwen3 /
 * Llama in target_dense_cuda.c; the hybrid Qwen3.5 family in target_hybrid_cuda.c), bf16 weights and activations
 * with fp32 accumulation; the same forward as target_model.c. Every workspace is allocated once for the largest batch
 * (max_tokens, max_seqs), so forwards allocate nothing. A forward is enqueued on the model's stream and returns
 * without waiting: the caller records an event after it to publish what it wrote. Tap i of token t is written by
 * the kernel that produces it straight into row t, columns [i*H, (i+1)*H) of a caller-given device buffer. */
#ifndef DFLASH_TARGET_MODEL_CUDA_H
#define DFLASH_TARGET_MODEL_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "hf_config.h"
#include "target_model.h"
#include "util.h"

typedef struct target_cuda target_cuda;

/* Kernel classes timed by the profiling mode. */
enum target_cuda_class { TARGET_CUDA_MATMUL, TARGET_CUDA_ATTENTION, TARGET_CUDA_OTHER, TARGET_CUDA_COPY,
                         TARGET_CUDA_DELTA_RULE, /* hybrid targets: the chunked gated delta rule */
                         TARGET_CUDA_NCLASS };

/* Load a Hugging Face checkpoint (what layers [0, max_layer] need; max_layer < 0: all layers, final norm and
 * lm_head) as bf16 on the current device. stream (a cudaStream_t, NULL: the model creates its own) is where every
 * forward runs. Errors name the checkpoint file, tensor or value. */
int target_cuda_load(target_cuda **out, const char *dir, int max_layer, int max_tokens, int max_seqs, void *stream,
                     errbuf *err);
/* Device weights that outlive the process (dflash-target-cuda deposits them with dflashd): every buffer of the model
 * (weights and workspaces, allocated by the generic code and the family in one deterministic order) is carved from
 * one VMM allocation (target_arena_cuda.h) whose first 4 KiB say what it holds: the checkpoint identity the caller
 * gives (which checkpoint, its digests and files) and the layout (family, layers, dtype, workspace shape, every
 * buffer's size in order). A deposited allocation that holds this identity and layout is re-imported as it is, with
 * no checkpoint read; one that differs, or whose load was interrupted, is reloaded (in place when its size is the
 * same, else into a new allocation) and `why` says what differed. */
enum target_keep_result {
    TARGET_KEEP_REIMPORTED, /* the weights were there: nothing read from the checkpoint */
    TARGET_KEEP_RELOADED,   /* the deposited allocation, loaded again from the checkpoint (why says why) */
    TARGET_KEEP_NEW,        /* a new allocation, loaded: deposit it (target_cuda_keep_export) */
};
typedef struct target_cuda_keep {
    const char *identity;   /* in: the checkpoint's identity, in words (at most ~1.5 KiB) */
    int fd;                 /* in: the deposited allocation to re-import (-1: none); the fd stays the caller's */
    size_t bytes;           /* in: its size */
    enum target_keep_result result; /* out */
    char why[1024];         /* out: why the deposited allocation was not re-imported as it is ("" when it was;
                                * also logged, before the load starts) */
} target_cuda_keep;
/* target_cuda_load into kept memory on the current device (as above; keep says how it went). */
int target_cuda_load_kept(target_cuda **out, const char *dir, int max_layer, int max_tokens, int max_seqs, void *stream,
                          target_cuda_keep *keep, errbuf *err);
/* A new fd of a kept model's allocation (the caller's, for fdpass) and its size; -EINVAL for a model without one. */
int target_cuda_keep_export(const target_cuda *m, int *fd, size_t *bytes, errbuf *err);
/* A model of the shape cfg with deterministic random bf16 weights made on the device (rand_fill, seed): linear
 * weights uniform with standard deviation init_std, norms 1, lm_head untied unless cfg->tie_embeddings. */
int target_cuda_init_random(target_cuda **out, const hf_config *cfg, uint64_t seed, float init_std, int max_tokens,
                            int max_seqs, void *stream, errbuf *err);
void target_cuda_destroy(target_cuda **m);
/* Copy tensor `name` of a checkpoint (F32/BF16/F16, shape (d0[, d1]); d1 = 0 for one dimension) to device memory dst
 * as bf16 (the target's own tables, and the drafter's frozen embedding and lm_head). */
struct st_file;
int target_cuda_upload_tensor(const struct st_file *st, const char *name, uint16_t *dst, int64_t d0, int64_t d1,
                              errbuf *err);
const hf_config *target_cuda_config(const target_cuda *m);
/* The model's stream (a cudaStream_t). */
void *target_cuda_stream(const target_cuda *m);
/* Device tables shared with the drafter: (V, H) bf16 each; lm_head is the embedding when tied. */
const uint16_t *target_cuda_embedding(const target_cuda *m);
const uint16_t *target_cuda_lm_head(const target_cuda *m);
/* Device bytes the model allocated (weights + workspaces + cuBLASLt workspace). */
size_t target_cuda_device_bytes(const target_cuda *m);

/* Forward over a packed batch (host arrays, checked as on the CPU). taps (ntaps layer ids) -> aux: device bf16
 * (T, ntaps*H) with row stride ld_aux >= ntaps*H (NULL: no taps); last: device bf16 (T, H), the last layer's output
 * before the final norm; logits: device bf16 (T, V). last/logits may be NULL and need a fully loaded model. Runs no
 * layer deeper than needed. Enqueued on the model's stream; returns before the device has finished. */
int target_cuda_forward(target_cuda *m, const target_batch *b, const int *taps, int ntaps, uint16_t *aux, int ld_aux,
                        uint16_t *last, uint16_t *logits, errbuf *err);

/* Linear layers of at most rows rows (at most GEMV_MAX_M, gemv.h) run the GEMV kernels, more rows cuBLASLt; 0:
 * cuBLASLt for every layer; the default GEMV_DEFAULT_ROWS (gemv.h: where the GEMV beats cuBLASLt on the H200). Set it before a decoding cache captures steps (target_decode_cuda.h: a
 * captured step keeps the kernels it was captured with until its graphs are dropped). bench_decode compares both. */
void target_cuda_set_gemv_rows(target_cuda *m, int rows);
/* A target that checks speculative decoding against greedy decoding (spec_cuda_create sets it, for dflash eval and
 * the evaluation worker): every linear layer through cuBLASLt, so that a one-row greedy step rounds as the verified
 * blocks of block_size rows do (the one-row GEMV's other summation order flips near-ties of the argmax: on the H200 5
 * of 12 eval_gpu prompts and every qwen35moe-tiny one diverged from greedy with it). Call before the decoding cache
 * captures steps. */
void target_cuda_set_for_verification(target_cuda *m);
/* Profiling: while on, a forward records an event around every kernel and waits for the device at its end; then
 * target_cuda_profile gives the last forward's device milliseconds per class (enum target_cuda_class). */
void target_cuda_set_profiling(target_cuda *m, int on);
void target_cuda_profile(const target_cuda *m, double ms[TARGET_CUDA_NCLASS]);

#endif
