/* demo: the embedded default's tiny model and data. demo_target_write makes a Qwen3 target in Hugging Face layout,
 * random or constructed so that its greedy continuation repeats the token `period` positions back (a rule a drafter
 * can learn) (config.json + model.safetensors); demo_data_write answers random prompts with that target's own greedy
 * continuation and writes them as JSONL for dflash-prepare. Both are pure functions of their options (seed
 * included); files are written atomically (tmp + rename). Errors return -errno and fill an errbuf naming the
 * file, flag or tensor. demo_data_write runs its own worker threads (one target model each) and sets OpenBLAS to
 * one thread when it uses several; the output does not depend on the thread count or the batch size. */
#ifndef DFLASH_DEMO_H
#define DFLASH_DEMO_H

#include <stdint.h>

#include "safetensors.h"
#include "util.h"

/* The kinds of target make-target writes (a row each in demo_target.c's table). */
enum demo_target_kind { DEMO_TARGET_RANDOM, DEMO_TARGET_REPEAT };

typedef struct demo_target_opts {
    enum demo_target_kind kind;
    int period; /* DEMO_TARGET_REPEAT: the next token is the one `period` positions back */
    uint64_t seed;
    int hidden, layers, heads, kv_heads, head_dim, intermediate, vocab;
    enum st_dtype dtype; /* ST_F32 or ST_BF16 */
} demo_target_opts;

typedef struct demo_data_opts {
    const char *target_dir, *out_path;
    int samples, prompt_min, prompt_max, answer_len;
    int batch;    /* samples decoded together in one packed forward (at most) */
    int threads;  /* worker threads, one target model each */
    int progress; /* print progress lines on stderr */
    uint64_t seed;
} demo_data_opts;

typedef struct demo_data_stats {
    int64_t samples, tokens, answer_tokens;
    double distinct_ratio; /* mean over answers of (distinct tokens in the answer) / (answer length) */
    int vocab_used;        /* distinct token ids over all answers */
    int repeated_answers;  /* answers made of one token repeated */
} demo_data_stats;

/* Defaults of make-target (kind random, period 8, hidden 64, 8 layers, 4 heads, 2 kv heads, head_dim 16, intermediate 160, vocab 512). */
void demo_target_defaults(demo_target_opts *o);
/* The kind named NAME (DEMO_TARGET_*), or -1 when there is none. */
int demo_target_kind_parse(const char *name);
const char *demo_target_kind_name(enum demo_target_kind kind);
/* Check the shape options; the message names the offending flag. */
int demo_target_check(const demo_target_opts *o, errbuf *err);
/* Write outdir/config.json and outdir/model.safetensors (outdir is created when missing). */
int demo_target_write(const char *outdir, const demo_target_opts *o, errbuf *err);

/* Defaults of make-data (256 samples, prompts 8..24 tokens, answers of 48, batch 32, one thread per CPU up to 16). */
void demo_data_defaults(demo_data_opts *o);
/* Generate o->samples prompts, answer each greedily with the target in o->target_dir, write o->out_path. */
int demo_data_write(const demo_data_opts *o, demo_data_stats *stats, errbuf *err);

#endif
