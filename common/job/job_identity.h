/* job_identity: what a job's checkpoints were trained against, so that --resume can refuse another target. The
 * identity is the target's shape (layers, hidden size, vocabulary), the taps, the drafter's parameter count, a
 * digest of the target's config.json and a sampled digest of its weights (each *.safetensors file's size, header
 * and 64 KiB samples at 16 offsets: cheap on a large target, different for other weights of the same shape). dflashd
 * writes it to <run_dir>/ckpt/identity.json when a run starts from scratch, and checks it at --resume. Errors: 0 /
 * -errno with an errbuf naming the file or the mismatch (both sides). */
#ifndef DFLASH_JOB_IDENTITY_H
#define DFLASH_JOB_IDENTITY_H

#include <stdint.h>

#include "hf_config.h"
#include "job_plan.h"
#include "util.h"

typedef struct job_identity {
    char target[4096];              /* target.model as configured */
    int layers, hidden, vocab;
    int ntaps, taps[HF_MAX_TAPS];
    uint64_t drafter_parameters;
    /* the drafter's attention windows in words ("full" or "layer_types ... sliding_window W"): the same parameters
     * with other windows are another model; "" when read from an identity written before windows existed (not
     * compared then) */
    char drafter_windows[320];
    char config_digest[17], weights_digest[17]; /* 64-bit hex */
} job_identity;

/* The digests of target folder dir's config.json and weights (16 hex digits each): the one rule of "the same
 * target" (a job's --resume, dflash generate's resume). */
int job_identity_target(const char *dir, char config_digest[17], char weights_digest[17], errbuf *err);
/* Checkpoint folder dir in words, for device weights kept across a target worker's restart (target_cuda_keep): its
 * real path, the two digests above, and a digest of every *.safetensors file's name, size, modification time and
 * inode (a file rewritten in place changes them even where the sampled digest would not). */
int job_identity_checkpoint(const char *dir, char *out, size_t n, errbuf *err);
/* The identity of this job's target and drafter (reads the target's files). */
int job_identity_compute(job_identity *id, const job_plan *p, errbuf *err);
/* Write it to path (temporary file + rename). */
int job_identity_write(const job_identity *id, const char *path, errbuf *err);
/* Read path into *id: -ENOENT when there is none. */
int job_identity_read(job_identity *id, const char *path, errbuf *err);
/* 0 when `now` may resume what `was` trained; -EINVAL with both identities described otherwise. */
int job_identity_check(const job_identity *was, const job_identity *now, const char *path, errbuf *err);

#endif
