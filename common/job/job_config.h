/* job_config: the settings of one training job, read from one INI file shared by every process of the job. The
 * table in job_config.c is the single declaration of every setting (section = the service it configures, type,
 * bounds, default, help); it drives the file parser, `--set section.key=value` overrides and `--help-config`.
 * Errors name the file:line and section.key. */
#ifndef DFLASH_JOB_CONFIG_H
#define DFLASH_JOB_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "util.h"

/* job.backend: the index of its name in job_backend_names. */
enum job_backend { JOB_BACKEND_CPU = 0, JOB_BACKEND_CUDA = 1 };
extern const char *const job_backend_names[]; /* {"cpu", "cuda", NULL} */

typedef struct job_config {
    struct {
        char name[CONFIG_STRING_MAX];     /* with run_dir, names its shared-memory segments (job_plan) */
        char run_dir[CONFIG_STRING_MAX];  /* logs, ledger, checkpoints, sockets; one live dflashd each (run_lock) */
        int seed;
        enum job_backend backend;         /* a CONFIG_ENUM: stored as an int */
    } job;
    struct {
        char path[CONFIG_STRING_MAX];     /* a shard file or a folder of *.shard */
        int max_batch_tokens, max_batch_seqs;
    } data;
    struct {
        char model[CONFIG_STRING_MAX];    /* Hugging Face checkpoint folder */
        int keep_weights;                 /* cuda: device weights deposited with dflashd (target_cuda_load_kept) */
    } target;
    struct {
        char init[CONFIG_STRING_MAX];     /* z-lab checkpoint to start from; empty: fresh from the seed */
        int layers, block_size, mask_token_id, num_taps, max_anchors;
        config_int_list taps;             /* empty: the spec's rule from num_taps */
        double gamma;                     /* 0: the spec's value for the block size */
        char layer_types[CONFIG_STRING_MAX]; /* per layer full_attention | sliding_attention; empty: all full */
        int sliding_window;               /* window of the sliding layers; 0: none */
        unsigned char sliding[64];        /* layer_types as read by job_config_load: 1 for a sliding layer */
        int nlayer_types;                 /* entries in layer_types (0: empty) */
    } drafter;
    struct {
        int steps, warmup_steps, checkpoint_every, max_skipped_in_a_row;
        int keep_checkpoints, keep_every;  /* checkpoint retention (checkpoint_prune) */
        double checkpoint_retry_sec;
        double lr, min_lr, beta1, beta2, eps, weight_decay, clip;
    } train;
    struct {
        int targets, drafters;
        double watchdog_sec, heartbeat_timeout_sec, stall_warn_sec;
    } workers;
    struct {
        int token_slots, pool_slots;
    } ring;
    struct {
        char endpoint[CONFIG_STRING_MAX];              /* empty: ipc://<run_dir>/ctl */
        char curve_secret_key_file[CONFIG_STRING_MAX]; /* dflashd's CURVE secret key (Z85); required for tcp:// */
        char curve_public_key_file[CONFIG_STRING_MAX]; /* dflashd's CURVE public key, for clients */
        char curve_client_keys_file[CONFIG_STRING_MAX]; /* allowed client public keys (Z85 lines); empty: any */
        char curve_readonly_keys_file[CONFIG_STRING_MAX]; /* client keys admitted for status and config only */
        double heartbeat_sec;
        char metrics_listen[CONFIG_STRING_MAX];        /* Prometheus /metrics address (loopback); empty: off */
    } control;
    struct {
        int tensorboard;                               /* write <run_dir>/tensorboard/events.out.tfevents.* */
    } metrics;
    struct {
        char prompts[CONFIG_STRING_MAX];               /* held-out prompts (JSONL); empty: no evaluation worker */
        int every, limit, max_new_tokens;              /* every: 0 = each checkpoint */
    } eval;
} job_config;

extern const config_field job_config_table[];

/* Defaults, then the file, then each "section.key=value" override in order. */
int job_config_load(job_config *cfg, const char *path, const char *const *overrides, int noverrides, errbuf *err);
/* The evaluation worker's steps (eval.prompts set): every eval.every steps (each checkpoint when 0), and the last
 * step `last`: the first such step after `done` evaluated steps' last (done: that step + 1, 0 for none), or
 * UINT64_MAX when none is left up to last. The one rule dflash-eval and dflashd count by. */
uint64_t job_eval_next(const job_config *cfg, uint64_t done, uint64_t last);
/* A path below run_dir: snprintf(out, n, "%s/%s", run_dir, leaf). */
void job_config_path(const job_config *cfg, const char *leaf, char *out, size_t n);

#endif
