/* job_plan: everything every process of a job derives from the job config the same way: the target's and the
 * drafter's model configs, the taps, the shared-memory names, the token-ring geometry and the hidden-state slot
 * layout. Computing it in one place keeps dflashd and the workers in agreement. A function of the config files
 * and of where run_dir is; errors name the file and field. Every shared-memory name of a job comes from here:
 * "/dflash-<job.name>-<hash of the canonical run_dir>-<what>", so jobs of the same name in different run_dirs never
 * share a segment (and one run_dir has one live dflashd: run_lock.h). */
#ifndef DFLASH_JOB_PLAN_H
#define DFLASH_JOB_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "hf_config.h"
#include "job_config.h"
#include "token_ring.h"
#include "util.h"

/* Byte offsets of one hidden-state slot's parts (the slot holds a copy of its token batch, so the drafter needs
 * nothing from the token ring). On the cuda backend the whole slot lives in GPU memory and aux is bf16. */
typedef struct hidden_slot_layout {
    int gpu;           /* job.backend = cuda: slots in a VMM allocation on the target's GPU, aux as bf16 */
    size_t aux_elem;   /* bytes per aux element: 4 (float) or 2 (bf16) */
    size_t aux;        /* float or bf16 (max_tokens, K*H), row stride K*H */
    size_t input_ids;  /* int32 (max_tokens) */
    size_t positions;  /* int32 (max_tokens) */
    size_t cu_seqlens; /* int32 (max_seqs+1) */
    size_t loss_mask;  /* uint8 (max_tokens) */
    size_t bytes;
} hidden_slot_layout;

typedef struct job_plan {
    job_config cfg;
    hf_config target;     /* the target's config.json */
    hf_config drafter;    /* the drafter's (from drafter.init, or derived from the target for a fresh one) */
    int ntaps, hidden, vocab;
    double gamma;
    uint64_t numel;       /* drafter parameters */
    struct token_ring_geometry ring;
    hidden_slot_layout slot;
    char run_dir[4096];        /* job.run_dir made absolute and canonical (realpath; it need not exist yet) */
    char shm_prefix[96];       /* "/dflash-<job.name, at most 64 characters>-<8 hex digits of run_dir's hash>" */
    char state_name[128];      /* <shm_prefix>-state: the job state (job_state.h) */
    char ring_name[128];       /* <shm_prefix>-tokens: the token ring */
    char keeper_socket[4096];  /* unix socket of dflashd for registration and fd passing */
} job_plan;

/* Load the job config (with overrides) and derive the plan. */
int job_plan_load(job_plan *p, const char *config_path, const char *const *overrides, int noverrides, errbuf *err);
/* Name of target worker i's pool control segment: <shm_prefix>-pool-<i>. */
void job_plan_pool_name(const job_plan *p, int i, char *out, size_t n);

#endif
