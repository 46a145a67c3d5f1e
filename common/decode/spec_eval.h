/* spec_eval: the evaluation of a drafter by decoding, the one loop `dflash eval` and the evaluation worker
 * (dflash-eval) run: for each prompt of a prompt file, speculative decoding (spec_decode's loop) and target-only
 * greedy decoding of the same prompt on one backend (spec_eval_ops: the CPU one here, spec_eval_cuda.h's on the
 * GPU), summed into tau (the mean over prompts of each prompt's mean committed tokens per block), the histogram of
 * accepted lengths, the per-slot acceptance and the wall-clock speedup against greedy decoding. Single-threaded;
 * errors 0 / -errno with an errbuf naming the prompt file and line. */
#ifndef DFLASH_SPEC_EVAL_H
#define DFLASH_SPEC_EVAL_H

#include <jansson.h>
#include <stdint.h>

#include "drafter_infer.h"
#include "prompt_file.h"
#include "spec_decode.h"
#include "target_decode.h"
#include "target_model.h"
#include "util.h"

/* One backend's way to decode a prompt: speculatively (or the walk), and target-only greedy (NULL: no baseline). */
typedef struct spec_eval_ops {
    int (*decode)(void *e, const prompt_line *pl, const spec_opts *o, spec_result *r, errbuf *err);
    int (*greedy)(void *e, const prompt_line *pl, const spec_opts *o, spec_result *r, errbuf *err);
} spec_eval_ops;

/* The CPU backend: decoding with sequence 0 of cache (target tm) and drafter d; walk: spec_walk instead, no
 * baseline (cache unused). */
typedef struct spec_eval_cpu {
    target_cache *cache;
    target_model *tm;
    drafter_infer *d;
} spec_eval_cpu;
extern const spec_eval_ops spec_eval_cpu_ops, spec_eval_walk_ops;

/* Results, summed over prompts. */
typedef struct spec_eval_stats {
    int B, nprompts, counted;         /* counted: prompts with at least one block */
    int has_base;                     /* target-only greedy decoding ran beside (not the walk) */
    double tau_sum;
    long blocks, hist[DFLASH_MAX_BLOCK + 1], slot_ok[DFLASH_MAX_BLOCK];
    long spec_tokens, base_tokens, mismatched;
    double spec_s, base_s, spec_prefill_s, base_prefill_s;
    json_t *per_prompt;               /* array of {"line", "prompt_tokens", "new_tokens", "accepted": [...]} */
} spec_eval_stats;

/* Called after each prompt (done of n); a non-zero return stops the run with that status (its message in err). */
typedef int (*spec_eval_progress)(void *ctx, int done, int n, errbuf *err);

/* Every prompt must fit before anything runs: prompt + max_new positions (the walk: the line, cut to max_new new
 * tokens) within limit positions (what limit_src names). *need: the most positions a prompt takes. */
int spec_eval_check_fit(const prompt_set *ps, const char *path, int walk, int max_new, long limit,
                        const char *limit_src, int *need, errbuf *err);
/* Decode every prompt of ps with block size B into st (initialised here; free with spec_eval_stats_free). */
int spec_eval_run(spec_eval_stats *st, const spec_eval_ops *ops, void *e, int B, const prompt_set *ps,
                  const char *path, const spec_opts *so, spec_eval_progress progress, void *ctx, errbuf *err);
void spec_eval_stats_free(spec_eval_stats *st);
double spec_eval_tau(const spec_eval_stats *st);
/* Tokens/s of speculative decoding over target-only greedy decoding (prefill excluded); 0 without a baseline. */
double spec_eval_speedup(const spec_eval_stats *st);
/* Share of blocks whose accepted draft reaches slot k (1..B-1). */
double spec_eval_slot(const spec_eval_stats *st, int k);
/* The figures as JSON: "tau", "prompts", "prompts_with_blocks", "block_size", "blocks", "histogram" (count per
 * committed length 1..B), "slot_acceptance" (slots 1..B-1), "new_tokens", and with a baseline "speedup",
 * "tokens_per_s", "target_only_tokens_per_s", "outputs_differ". A new reference. */
json_t *spec_eval_json(const spec_eval_stats *st);

#endif
