#include "eval.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drafter_infer.h"
#include "log.h"
#include "nonfinite.h"
#include "prompt_file.h"
#include "spec_decode.h"
#include "spec_eval.h"
#include "target_decode.h"
#include "target_family.h"
#include "target_model.h"
#include "util.h"
#include "weights_check.h"
#ifdef DFLASH_CUDA
#include "drafter_infer_cuda.h"
#include "spec_decode_cuda.h"
#include "spec_eval_cuda.h"
#include "target_decode_cuda.h"
#include "target_model_cuda.h"
#endif

#define PROG "dflash eval"
#define MAX_EOS 16

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " --target DIR --drafter DIR --prompts FILE [--limit N] [--max-new-tokens N] [--json]\n"
            "                   [--walk] [--untrained | --init-seed N] [--cache-len N]\n"
            "                   [--eos ID]... [--no-eos] [--backend cpu|cuda]\n"
            "\n"
            "Measures the acceptance length tau of a DFlash drafter (z-lab checkpoint layout: config.json +\n"
            "model.safetensors) the way the DFlash authors do: one prompt at a time, temperature 0; the target's\n"
            "prefill gives the first token; then per block [last committed token, MASK x (B-1)], the drafter drafts\n"
            "on the target's tapped hidden states of every committed position, the target verifies the block in one\n"
            "forward against its KV cache, the longest prefix of the draft equal to the target's own next tokens is\n"
            "accepted and accepted+1 tokens are committed (the target's bonus token last). tau is the mean over\n"
            "prompts of each prompt's mean committed tokens per block. Also: the histogram of those lengths, the\n"
            "per-slot acceptance (the share of blocks whose accepted draft reaches slot k), and the wall-clock\n"
            "speedup of the decoding (prefill excluded) against target-only greedy decoding of the same prompts in\n"
            "the same run, whose output must be the same tokens.\n"
            "\n"
            "  --target DIR          target checkpoint (Hugging Face layout)\n"
            "  --drafter DIR         drafter checkpoint; its hidden size, vocab, tap layers and num_target_layers\n"
            "                        must match the target\n"
            "  --prompts FILE        JSONL as dflash-prepare reads it: a line's prompt is its leading run of\n"
            "                        loss_mask 0 (labels -100) tokens; a line with input_ids only is all prompt\n"
            "  --limit N             the first N prompts only\n"
            "  --max-new-tokens N    new tokens per prompt at most (default 128); generation also stops at EOS\n"
            "  --json                one JSON object on stdout (top-level \"tau\") instead of the table\n"
            "  --walk                no decoding: walk each line's text (prompt + continuation, which must be the\n"
            "                        target's own greedy continuation, e.g. dflash-demo make-data's) block by block\n"
            "                        with one target forward over the text; gives the same accepted lengths\n"
            "  --untrained           the drafter of DIR's config with the fresh weights of its job's step 0 (the\n"
            "                        seed of DIR/trainer_state.json): the untrained baseline\n"
            "  --init-seed N         the same with seed N (a job's job.seed)\n"
            "  --cache-len N         KV cache positions (default: the target's max_position_embeddings); a prompt\n"
            "                        plus --max-new-tokens must fit\n"
            "  --eos ID              an end-of-sequence token id (repeatable; default: eos_token_id of the\n"
            "                        target's generation_config.json, else of its config.json)\n"
            "  --no-eos              do not stop at any EOS\n"
            "  --backend cpu|cuda    where the target and the drafter run (default cpu). cuda (the dflash-cuda\n"
            "                        build): both in bf16 on GPU 0, the target with a KV cache; no --walk\n"
            "  -h, --help            this help\n"
            "\n"
            "The target's greedy choice skips the drafter's mask token (a reserved id). Exit status: 0 done, 1 error\n"
            "(the message names the file and field), 2 usage error.\n");
}

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, PROG ": ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(try '" PROG " --help')\n");
    return 2;
}

static int parse_int(const char *flag, const char *s, long lo, long hi, long *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !end || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, PROG ": %s \"%s\": want an integer in [%ld, %ld]\n(try '" PROG " --help')\n", flag, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int read_job_seed(const char *dir, long *seed, errbuf *err)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return errbuf_set(err, ENOENT, "--untrained: %s: %s (not a dflash checkpoint? give --init-seed N)", path,
                          je.text);
    json_t *s = json_object_get(root, "seed");
    int ok = json_is_integer(s);
    if (ok) *seed = (long)json_integer_value(s);
    json_decref(root);
    return ok ? 0 : errbuf_set(err, EINVAL, "%s: seed: missing or not an integer", path);
}

/* Before any decoding (cpu): the target's logits over the first tokens of the first prompt must be finite, else an
 * error naming the first weight that is not (poisoned weights would give a tau of garbage and exit 0). */
static int target_probe(target_model *tm, const char *dir, const prompt_line *pl, errbuf *err)
{
    enum { PROBE = 8 };
    const int V = target_model_config(tm)->vocab_size, T = pl->plen < PROBE ? pl->plen : PROBE;
    int32_t pos[PROBE], cu[2] = {0, T};
    for (int t = 0; t < T; t++) pos[t] = t;
    float *logits = xmalloc(sizeof *logits * (size_t)T * (size_t)V);
    target_batch b = {.ntok = T, .nseq = 1, .input_ids = pl->ids, .positions = pos, .cu_seqlens = cu};
    int rc = target_model_forward(tm, &b, NULL, 0, NULL, NULL, logits, err);
    if (!rc && nonfinite_groups_cpu(NULL, logits, V, T, 1, V) >= 0) {
        char why[400];
        weights_explain_nonfinite(dir, why, sizeof why);
        rc = errbuf_set(err, ERANGE, "the target's logits on the first %d tokens of line %d are not finite: %s", T,
                        pl->lineno, why);
    }
    free(logits);
    return rc;
}

static void report(const spec_eval_stats *st, int walk, int json, const char *drafter, const char *prompts,
                   const hf_config *dc, int max_new, const char *which)
{
    double tau = spec_eval_tau(st);
    double spec_tps = st->spec_s > 0 ? st->spec_tokens / st->spec_s : 0;
    double base_tps = st->base_s > 0 ? st->base_tokens / st->base_s : 0;
    if (json) {
        json_t *o = spec_eval_json(st);
        json_object_set_new(o, "mode", json_string(walk ? "walk" : "decode"));
        json_object_set_new(o, "drafter", json_string(drafter));
        json_object_set_new(o, "weights", json_string(which));
        json_object_set_new(o, "prompts_file", json_string(prompts));
        json_object_set_new(o, "max_new_tokens", json_integer(max_new));
        json_object_set(o, "per_prompt", st->per_prompt);
        char *s = json_dumps(o, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
        json_decref(o);
        return;
    }
    printf("dflash eval: %s drafter %s (%s; block %d, %d taps), %d prompts of %s, max %d new tokens\n",
           walk ? "walk of the" : "decoding with the", drafter, which, st->B, dc->num_taps, st->nprompts, prompts,
           max_new);
    printf("  tau (acceptance length)   %.3f   mean over %d prompts of each prompt's mean; %ld blocks\n", tau,
           st->counted, st->blocks);
    printf("  accepted length           ");
    for (int a = 1; a <= st->B; a++) printf("%d: %.1f%%  ", a, st->blocks ? 100.0 * st->hist[a] / st->blocks : 0);
    printf("\n  per-slot acceptance       ");
    for (int k = 1; k < st->B; k++) printf("%d: %.3f  ", k, spec_eval_slot(st, k));
    printf("\n");
    if (!walk) {
        printf("  speculative decoding      %ld tokens in %.3f s (%.1f tokens/s; prefill %.3f s apart)\n",
               st->spec_tokens, st->spec_s, spec_tps, st->spec_prefill_s);
        printf("  target-only greedy        %ld tokens in %.3f s (%.1f tokens/s; prefill %.3f s apart)\n",
               st->base_tokens, st->base_s, base_tps, st->base_prefill_s);
        printf("  speedup                   %.2fx\n", spec_eval_speedup(st));
        if (st->mismatched)
            printf("  WARNING: %ld prompts' speculative output differs from target-only greedy decoding\n",
                   st->mismatched);
        else
            printf("  outputs                   identical to target-only greedy decoding (%d prompts)\n",
                   st->nprompts);
    }
}

/* every 2 s, and the final count: always under the table, under --json when a count was shown before */
typedef struct eval_progress {
    int json, shown;
    double last_print;
} eval_progress;

static int progress_print(void *ctx, int done, int n, errbuf *err)
{
    eval_progress *p = ctx;
    if ((now_seconds() - p->last_print >= 2.0 && done < n) || (done == n && (!p->json || p->shown))) {
        fprintf(stderr, PROG ": %d/%d prompts\n", done, n);
        p->last_print = now_seconds();
        p->shown = 1;
    }
    return 0;
}

int cmd_eval(int argc, char **argv)
{
    enum { OPT_TARGET = 256, OPT_DRAFTER, OPT_PROMPTS, OPT_LIMIT, OPT_MAX_NEW, OPT_JSON, OPT_WALK, OPT_UNTRAINED,
           OPT_INIT_SEED, OPT_CACHE_LEN, OPT_NO_EOS, OPT_EOS, OPT_BACKEND };
    static const struct option longopts[] = {
        {"target", required_argument, NULL, OPT_TARGET},   {"drafter", required_argument, NULL, OPT_DRAFTER},
        {"prompts", required_argument, NULL, OPT_PROMPTS}, {"limit", required_argument, NULL, OPT_LIMIT},
        {"max-new-tokens", required_argument, NULL, OPT_MAX_NEW},
        {"json", no_argument, NULL, OPT_JSON},             {"walk", no_argument, NULL, OPT_WALK},
        {"untrained", no_argument, NULL, OPT_UNTRAINED},   {"init-seed", required_argument, NULL, OPT_INIT_SEED},
        {"cache-len", required_argument, NULL, OPT_CACHE_LEN}, {"no-eos", no_argument, NULL, OPT_NO_EOS},
        {"eos", required_argument, NULL, OPT_EOS},         {"backend", required_argument, NULL, OPT_BACKEND},
        {"help", no_argument, NULL, 'h'},                  {NULL, 0, NULL, 0},
    };
    const char *target_dir = NULL, *drafter_dir = NULL, *prompts_path = NULL;
    long limit = 0, max_new = 128, init_seed = -1, cache_len = 0;
    int json = 0, walk = 0, untrained = 0, no_eos = 0, use_cuda = 0, opt;
    int32_t eos[MAX_EOS];
    int neos = 0;
    opterr = 0;
    optind = 1;
    while ((opt = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (opt) {
        case OPT_TARGET: target_dir = optarg; break;
        case OPT_DRAFTER: drafter_dir = optarg; break;
        case OPT_PROMPTS: prompts_path = optarg; break;
        case OPT_LIMIT: if (parse_int("--limit", optarg, 1, INT_MAX, &limit)) return 2; break;
        case OPT_MAX_NEW: if (parse_int("--max-new-tokens", optarg, 1, 1 << 24, &max_new)) return 2; break;
        case OPT_JSON: json = 1; break;
        case OPT_WALK: walk = 1; break;
        case OPT_UNTRAINED: untrained = 1; break;
        case OPT_INIT_SEED: if (parse_int("--init-seed", optarg, 0, LONG_MAX, &init_seed)) return 2; break;
        case OPT_CACHE_LEN: if (parse_int("--cache-len", optarg, 2, 1 << 24, &cache_len)) return 2; break;
        case OPT_NO_EOS: no_eos = 1; break;
        case OPT_BACKEND:
            if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda"))
                return usage_error("--backend: '%s' is not cpu or cuda", optarg);
            use_cuda = !strcmp(optarg, "cuda");
            break;
        case OPT_EOS: {
            long v;
            if (parse_int("--eos", optarg, 0, INT32_MAX, &v)) return 2;
            if (neos == MAX_EOS) return usage_error("too many --eos ids (%s)", optarg);
            eos[neos++] = (int32_t)v;
            break;
        }
        case 'h': usage(stdout); return 0;
        case ':': return usage_error("option %s needs a value", argv[optind - 1]);
        default: return usage_error("unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc) return usage_error("unexpected argument \"%s\"", argv[optind]);
    if (!target_dir) return usage_error("%s", "missing --target DIR");
    if (!drafter_dir) return usage_error("%s", "missing --drafter DIR");
    if (!prompts_path) return usage_error("%s", "missing --prompts FILE");
    if (untrained && init_seed >= 0) return usage_error("%s", "--untrained and --init-seed exclude each other");
    if (no_eos && neos) return usage_error("%s", "--eos and --no-eos exclude each other");
    if (use_cuda && walk) return usage_error("%s", "--walk runs on the CPU backend only (it needs no decoding)");
#ifndef DFLASH_CUDA
    if (use_cuda) {
        fprintf(stderr, PROG ": error: --backend cuda: this build of dflash has no CUDA backend; run dflash-cuda "
                "(built beside dflash when nvcc is found)\n");
        return 1;
    }
#endif
    log_init("eval", LOG_LEVEL_INFO);

    errbuf err = {{0}};
    target_model *tm = NULL;
    drafter_infer *d = NULL;
    target_cache *cache = NULL;
    prompt_set ps = {0};
    spec_eval_stats st = {0};
    int rc = 1;
    char which[96] = "trained weights";
    const hf_config *tc = NULL, *dc = NULL;
    hf_config tcfg;
#ifdef DFLASH_CUDA
    target_cuda *tg = NULL; /* --backend cuda: the target, its cache, the drafter and the loop's buffers */
    target_cuda_cache *cache_g = NULL;
    drafter_infer_cuda *dg = NULL;
    spec_cuda *sg = NULL;
#endif
    if (use_cuda) { /* loaded on the GPU once the prompts give the cache's length */
        /* a family that cannot decode on the GPU is refused before anything is loaded */
        if (hf_config_load(&tcfg, target_dir, &err) ||
            target_family_require(&tcfg, TARGET_BACKEND_CUDA, TARGET_CAN_DECODE, "decoding with a KV cache", NULL,
                                  &err))
            goto fail;
        tc = &tcfg;
    } else {
        if (target_model_load(&tm, target_dir, -1, &err)) goto fail;
        tc = target_model_config(tm);
    }
    if (untrained && read_job_seed(drafter_dir, &init_seed, &err)) goto fail;
    if (init_seed >= 0) {
        snprintf(which, sizeof which, "untrained: fresh weights of seed %ld", init_seed);
        if (!use_cuda && drafter_infer_load_fresh(&d, drafter_dir, (uint64_t)init_seed, tm, &err)) goto fail;
    } else if (!use_cuda && drafter_infer_load(&d, drafter_dir, tm, &err)) {
        goto fail;
    }
    if (!use_cuda) dc = drafter_infer_config(d);
    for (int i = 0; i < neos; i++)
        if (eos[i] >= tc->vocab_size) {
            errbuf_set(&err, EINVAL, "--eos %d: outside the target's vocabulary (%d)", eos[i], tc->vocab_size);
            goto fail;
        }
    if (!no_eos && !neos && hf_eos_tokens(target_dir, tc->vocab_size, eos, MAX_EOS, &neos, &err)) goto fail;
    if (prompt_file_read(&ps, prompts_path, tc->vocab_size, (int)limit, &err)) goto fail;

    /* every prompt must fit before anything runs: the cache for decoding, a continuation for the walk */
    long limit_len = cache_len ? cache_len : tc->max_position > 0 ? tc->max_position : LONG_MAX;
    int need = 0;
    if (spec_eval_check_fit(&ps, prompts_path, walk, (int)max_new, limit_len,
                            cache_len ? "--cache-len" : "the target's max_position_embeddings", &need, &err))
        goto fail;
#ifdef DFLASH_CUDA
    if (use_cuda) {
        if (target_cuda_load(&tg, target_dir, -1, need, 1, NULL, &err) ||
            target_cuda_cache_create(&cache_g, tg, 1, need, need, &err) ||
            drafter_infer_cuda_load(&dg, drafter_dir, target_dir, tc, init_seed >= 0, (uint64_t)init_seed, need,
                                    &err) ||
            spec_cuda_create(&sg, tg, cache_g, dg, need, &err))
            goto fail;
        dc = drafter_infer_cuda_config(dg);
        size_t at = strlen(which);
        snprintf(which + at, sizeof which - at, ", on the GPU (bf16)");
    }
#endif
    if (!use_cuda && !walk && target_cache_create(&cache, tm, 1, need, &err)) goto fail;
    if (!use_cuda && target_probe(tm, target_dir, &ps.v[0], &err)) goto fail;

    spec_opts so = {.max_new = (int)max_new, .eos = eos, .neos = neos, .reserved = hf_reserved_token(tc, dc)};
    spec_eval_cpu cpu = {.cache = cache, .tm = tm, .d = d};
    const spec_eval_ops *ops = walk ? &spec_eval_walk_ops : &spec_eval_cpu_ops;
    void *engine = &cpu;
#ifdef DFLASH_CUDA
    if (use_cuda) {
        ops = &spec_eval_cuda_ops;
        engine = sg;
    }
#endif
    eval_progress pr = {.json = json, .last_print = now_seconds()};
    if (spec_eval_run(&st, ops, engine, dc->block_size, &ps, prompts_path, &so, progress_print, &pr, &err)) goto fail;
    report(&st, walk, json, drafter_dir, prompts_path, dc, (int)max_new, which);
    rc = 0;
fail:
    if (rc) fprintf(stderr, PROG ": %s\n", err.msg);
    spec_eval_stats_free(&st);
    prompt_set_free(&ps);
    target_cache_destroy(&cache);
    drafter_infer_destroy(&d);
    target_model_destroy(&tm);
#ifdef DFLASH_CUDA
    spec_cuda_destroy(&sg);
    drafter_infer_cuda_destroy(&dg);
    target_cuda_cache_destroy(&cache_g);
    target_cuda_destroy(&tg);
#endif
    return rc;
}
