/* generate_impl: what generate.c (options, resume, the in-order writer, progress, the CPU workers) shares with the
 * GPU decoding loop of generate_cuda.c. A decoder fills res[i] for todo[i] and publishes it (gen_job_publish); the
 * writer thread writes the published results in todo order. A decoder that fails records why once
 * (gen_job_fail) and stops; every decoder stops when j->failed is set. */
#ifndef DFLASH_GENERATE_IMPL_H
#define DFLASH_GENERATE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "prompt_file.h"
#include "target_model.h"
#include "util.h"

typedef struct result {
    int32_t *gen; /* generated tokens */
    int n;
    const char *stop;
    atomic_int ready;
} result;

typedef struct gen_job {
    target_model *m;         /* the CPU target (NULL on the GPU backend) */
    const char *target_dir;  /* the GPU backend loads its own target from here */
    const prompt_set *prompts;
    const int64_t *todo; /* indices into prompts, in file order */
    int64_t ntodo;
    result *res;         /* (ntodo) */
    int max_new, max_len, cache_len, vocab, longest, batch;
    const int32_t *eos, *suppress;
    int neos, nsuppress;
    double temperature, top_p; /* temperature 0: greedy (the GPU backend's only mode) */
    uint64_t seed;
    atomic_llong next, tokens;
    atomic_int failed;
    pthread_mutex_t lock; /* guards err; with done_cond, the writer's wait */
    pthread_cond_t done_cond;
    errbuf err;
} gen_job;

/* Whether id ends an answer. */
int gen_job_is_eos(const gen_job *j, int32_t id);
/* Start result r of prompt p (its token buffer, the stop reason of the length limit); returns the limit on its
 * answer's tokens (>= 1). */
int gen_result_begin(const gen_job *j, const prompt_line *p, result *r);
/* res[i] is complete: hand it to the writer. */
void gen_job_publish(gen_job *j, int64_t i);
/* A decoder failed with err: the first failure is kept for the message; every decoder and the writer stop. */
void gen_job_fail(gen_job *j, const errbuf *err);

#ifdef DFLASH_CUDA
/* The GPU decoder (a thread body, arg: gen_job *): loads the target from j->target_dir onto the current device and
 * decodes j->todo with continuous batching over a KV cache of j->batch sequences. */
void *generate_cuda_worker(void *arg);
#endif

#endif
