/* target_decode: decoding with a KV cache (prefill, one token at a time, a verified block, a crop and a different
 * continuation) gives the logits and tapped hidden states of target_model_forward over the whole text, on the
 * golden Qwen3 target and on a Llama reading of it, and on the hybrid Qwen3.5 goldens (dense and MoE: a crop within
 * the last forward restores the recurrent states; one further back is refused); sequences of one cache do not see
 * each other; refused calls (capacity, crop bounds, bad ids, bad taps) change nothing; two threads may share one
 * model; sampling follows temperature, top_p and the suppressed ids. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>

#include "rng.h"
#include "target_decode.h"
#include "target_model.h"
#include "target_model_impl.h"
#include "tests/test.h"

static target_model *load(const char *dir)
{
    errbuf err = {{0}};
    target_model *m = NULL;
    if (target_model_load(&m, dir, -1, &err) != 0) {
        fprintf(stderr, "  load %s: %s\n", dir, err.msg);
        exit(1);
    }
    return m;
}

static void random_ids(int32_t *ids, int n, int vocab, uint64_t seed)
{
    rng r;
    rng_seed(&r, seed, 0, 0, 0);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)rng_below(&r, (uint64_t)vocab);
}

/* The full forward over ids[0..n): aux (n, ntaps*H), logits (n, V). */
static void full_forward(target_model *m, const int32_t *ids, int n, const int *taps, int ntaps, float *aux,
                         float *logits)
{
    int32_t *pos = malloc(sizeof *pos * (size_t)n), cu[2] = {0, n};
    for (int i = 0; i < n; i++) pos[i] = i;
    target_batch b = {.ntok = n, .nseq = 1, .input_ids = ids, .positions = pos, .cu_seqlens = cu};
    errbuf err = {{0}};
    int rc = target_model_forward(m, &b, taps, ntaps, aux, NULL, logits, &err);
    if (rc) fprintf(stderr, "  full forward: %s\n", err.msg);
    REQUIRE(rc == 0);
    free(pos);
}

/* Largest |a-b| / (1 + |b|) over n values. */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]) / (1.0 + fabs((double)b[i]));
        if (!(d <= worst)) worst = d; /* NaN wins */
    }
    return worst;
}

#define TOL 1e-4

/* Decode rows [from, from+n) of ids with cache seq and compare them with the full forward's rows. */
static void step_and_compare(target_cache *c, int seq, const int32_t *ids, int from, int n, const int *taps,
                             int ntaps, int H, int V, const float *ref_aux, const float *ref_logits, const char *what)
{
    errbuf err = {{0}};
    REQUIRE(target_cache_length(c, seq) == from);
    float *aux = malloc(sizeof *aux * (size_t)n * (size_t)ntaps * (size_t)H);
    float *logits = malloc(sizeof *logits * (size_t)n * (size_t)V);
    int rc = target_cache_forward(c, seq, ids + from, n, taps, ntaps, aux, logits, &err);
    if (rc) fprintf(stderr, "  %s: %s\n", what, err.msg);
    REQUIRE(rc == 0);
    EXPECT(target_cache_length(c, seq) == from + n);
    double da = rel_diff(aux, ref_aux + (size_t)from * (size_t)ntaps * (size_t)H, (size_t)n * (size_t)ntaps * H);
    double dl = rel_diff(logits, ref_logits + (size_t)from * (size_t)V, (size_t)n * (size_t)V);
    if (!(da <= TOL && dl <= TOL))
        fprintf(stderr, "  %s (positions %d..%d): taps differ by %g, logits by %g\n", what, from, from + n - 1, da, dl);
    EXPECT(da <= TOL);
    EXPECT(dl <= TOL);
    free(aux);
    free(logits);
}

/* What both decoding schedules share: texts a (20 tokens), b (a's first 14, then others), other (6 tokens, held by
 * sequence 0 meanwhile) and o7 = other + a[0]; the full forward of a, b and o7 over taps {0, 3, last, tap3}; a cache
 * of 2 x 24 with other in sequence 0 and, in sequence 1, a's prefill of 8, four single tokens and a block of 5, each
 * checked against the full forward. */
typedef struct decode_case {
    target_model *m;
    int H, V, ntaps, taps[4];
    int32_t a[20], b[20], other[6], o7[7];
    float *aux_a, *log_a, *aux_b, *log_b, *aux_o, *log_o;
    target_cache *c;
} decode_case;

static void decode_case_begin(decode_case *k, const char *dir, int tap3)
{
    const int L = 20;
    k->m = load(dir);
    const hf_config *cfg = target_model_config(k->m);
    k->H = cfg->hidden_size, k->V = cfg->vocab_size, k->ntaps = 4;
    memcpy(k->taps, (int[]){0, 3, cfg->num_layers - 1, tap3}, sizeof k->taps);
    const int H = k->H, V = k->V, ntaps = k->ntaps;
    random_ids(k->a, L, V, 1);
    memcpy(k->b, k->a, sizeof k->a);
    random_ids(k->b + 14, L - 14, V, 2); /* b shares a's first 14 tokens */
    random_ids(k->other, 6, V, 3);
    memcpy(k->o7, k->other, sizeof k->other);
    k->o7[6] = k->a[0];
    k->aux_a = malloc(sizeof(float) * L * ntaps * H), k->log_a = malloc(sizeof(float) * L * V);
    k->aux_b = malloc(sizeof(float) * L * ntaps * H), k->log_b = malloc(sizeof(float) * L * V);
    k->aux_o = malloc(sizeof(float) * 7 * ntaps * H), k->log_o = malloc(sizeof(float) * 7 * V);
    full_forward(k->m, k->a, L, k->taps, ntaps, k->aux_a, k->log_a);
    full_forward(k->m, k->b, L, k->taps, ntaps, k->aux_b, k->log_b);
    full_forward(k->m, k->o7, 7, k->taps, ntaps, k->aux_o, k->log_o);

    k->c = NULL;
    errbuf err = {{0}};
    int rc = target_cache_create(&k->c, k->m, 2, 24, &err);
    if (rc) fprintf(stderr, "  create: %s\n", err.msg);
    REQUIRE(rc == 0);
    EXPECT(target_cache_capacity(k->c) == 24);
    EXPECT(target_cache_length(k->c, 0) == 0 && target_cache_length(k->c, 1) == 0);
    REQUIRE(target_cache_forward(k->c, 0, k->other, 6, NULL, 0, NULL, NULL, &err) == 0);
    step_and_compare(k->c, 1, k->a, 0, 8, k->taps, ntaps, H, V, k->aux_a, k->log_a, "prefill");
    for (int t = 8; t < 12; t++)
        step_and_compare(k->c, 1, k->a, t, 1, k->taps, ntaps, H, V, k->aux_a, k->log_a, "decode");
    step_and_compare(k->c, 1, k->a, 12, 5, k->taps, ntaps, H, V, k->aux_a, k->log_a, "block");
}

/* Rows [from, from+n) of text ids in sequence seq against its full forward (aux, lg) */
#define STEP(k, seq, ids, from, n, aux, lg, what) \
    step_and_compare((k)->c, seq, (k)->ids, from, n, (k)->taps, (k)->ntaps, (k)->H, (k)->V, (k)->aux, (k)->lg, what)

static void decode_case_end(decode_case *k)
{
    target_cache_destroy(&k->c);
    EXPECT(k->c == NULL);
    free(k->aux_a); free(k->log_a); free(k->aux_b); free(k->log_b); free(k->aux_o); free(k->log_o);
    target_model_destroy(&k->m);
}

/* After decode_case_begin: crop to 14 and continue with b; sequence 0 continues undisturbed; logits only and taps
 * only. */
static void decode_matches_full(const char *dir)
{
    decode_case k;
    decode_case_begin(&k, dir, 3);
    errbuf err = {{0}};
    REQUIRE(target_cache_crop(k.c, 1, 14, &err) == 0);
    EXPECT(target_cache_length(k.c, 1) == 14);
    STEP(&k, 1, b, 14, 6, aux_b, log_b, "block after crop");
    EXPECT(target_cache_length(k.c, 0) == 6);
    /* sequence 0's next row equals the full forward of other + a[0] */
    STEP(&k, 0, o7, 6, 1, aux_o, log_o, "other sequence");
    /* logits only, taps only */
    const int H = k.H, V = k.V, ntaps = k.ntaps;
    REQUIRE(target_cache_crop(k.c, 0, 6, &err) == 0);
    float *lg = malloc(sizeof(float) * V), *ax = malloc(sizeof(float) * ntaps * H);
    REQUIRE(target_cache_forward(k.c, 0, k.o7 + 6, 1, NULL, 0, NULL, lg, &err) == 0);
    EXPECT(rel_diff(lg, k.log_o + 6 * V, (size_t)V) <= TOL);
    REQUIRE(target_cache_crop(k.c, 0, 6, &err) == 0);
    REQUIRE(target_cache_forward(k.c, 0, k.o7 + 6, 1, k.taps, ntaps, ax, NULL, &err) == 0);
    EXPECT(rel_diff(ax, k.aux_o + 6 * ntaps * H, (size_t)ntaps * H) <= TOL);
    free(lg); free(ax);
    decode_case_end(&k);
}

TEST(qwen3_decode_prefill_step_block_crop_match_full_forward) { decode_matches_full(test_golden("tiny/target")); }
/* qwen3_moe: the same attention cache, the MoE block on the new rows only */
TEST(qwen3moe_decode_prefill_step_block_crop_match_full_forward)
{
    decode_matches_full(test_golden("qwen3moe-tiny/target"));
    decode_matches_full(test_golden("qwen3moe-tiny-bf16/target"));
}

/* gpt_oss: the same attention cache, read through each sliding layer's window (6, shorter than the texts), sinks,
 * biases; MXFP4 experts */
TEST(gptoss_decode_prefill_step_block_crop_match_full_forward)
{
    decode_matches_full(test_golden("gptoss-tiny/target"));
    decode_matches_full(test_golden("gptoss-mxfp4/target"));
}

/* The same weights read as a Llama target (no q/k norm, the extra tensors ignored): the cache follows the family. */
TEST(llama_decode_matches_full_forward)
{
    const char *g = test_golden("tiny/target");
    char dir[] = "/tmp/dflash-decode-XXXXXX", path[700], src[700], cmd[1600];
    REQUIRE(mkdtemp(dir));
    snprintf(src, sizeof src, "%s/model.safetensors", g);
    char abs[600];
    REQUIRE(realpath(src, abs));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    REQUIRE(symlink(abs, path) == 0);
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c[\"model_type\"]=\"llama\"; "
             "c[\"architectures\"]=[\"LlamaForCausalLM\"]; json.dump(c, open(sys.argv[2], \"w\"))' "
             "%s/config.json %s/config.json",
             g, dir);
    REQUIRE(system(cmd) == 0);
    target_model *m = load(dir);
    EXPECT(target_model_config(m)->arch == HF_ARCH_LLAMA && !target_model_config(m)->has_qk_norm);
    target_model_destroy(&m);
    decode_matches_full(dir);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    REQUIRE(system(cmd) == 0);
}

TEST(refused_calls_change_nothing)
{
    target_model *m = load(test_golden("tiny/target"));
    const hf_config *cfg = target_model_config(m);
    const int V = cfg->vocab_size, H = cfg->hidden_size;
    int32_t ids[12];
    random_ids(ids, 12, V, 9);
    float *ref = malloc(sizeof(float) * 12 * V), *lg = malloc(sizeof(float) * 4 * V);
    full_forward(m, ids, 12, NULL, 0, NULL, ref);
    target_cache *c = NULL;
    errbuf err = {{0}};
    REQUIRE(target_cache_create(&c, m, 1, 10, &err) == 0);
    REQUIRE(target_cache_forward(c, 0, ids, 8, NULL, 0, NULL, NULL, &err) == 0);
    /* capacity: 8 + 3 > 10 */
    EXPECT(target_cache_forward(c, 0, ids + 8, 3, NULL, 0, NULL, lg, &err) == -ENOSPC);
    EXPECT_CONTAINS(err.msg, "sequence 0");
    EXPECT_CONTAINS(err.msg, "10");
    EXPECT(target_cache_length(c, 0) == 8);
    /* a bad id, a bad tap, a bad sequence, no token */
    int32_t bad[2] = {ids[8], V};
    EXPECT(target_cache_forward(c, 0, bad, 2, NULL, 0, NULL, lg, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "position 9");
    int tap = cfg->num_layers;
    float *ax = malloc(sizeof(float) * H);
    EXPECT(target_cache_forward(c, 0, ids + 8, 1, &tap, 1, ax, lg, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "tap");
    EXPECT(target_cache_forward(c, 1, ids + 8, 1, NULL, 0, NULL, lg, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "sequence 1");
    EXPECT(target_cache_forward(c, 0, ids + 8, 0, NULL, 0, NULL, lg, &err) == -EINVAL);
    EXPECT(target_cache_length(c, 0) == 8);
    /* crop bounds */
    EXPECT(target_cache_crop(c, 0, 9, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "holds 8");
    EXPECT(target_cache_crop(c, 0, -1, &err) == -EINVAL);
    EXPECT(target_cache_crop(c, 2, 0, &err) == -EINVAL);
    EXPECT(target_cache_length(c, 0) == 8);
    /* after all that the cache still continues the text exactly, up to its capacity */
    REQUIRE(target_cache_forward(c, 0, ids + 8, 2, NULL, 0, NULL, lg, &err) == 0);
    EXPECT(rel_diff(lg, ref + 8 * V, 2 * (size_t)V) <= TOL);
    EXPECT(target_cache_length(c, 0) == 10);
    EXPECT(target_cache_forward(c, 0, ids + 10, 1, NULL, 0, NULL, lg, &err) == -ENOSPC);
    /* crop to 0 and refill from scratch */
    REQUIRE(target_cache_crop(c, 0, 0, &err) == 0);
    REQUIRE(target_cache_forward(c, 0, ids, 3, NULL, 0, NULL, lg, &err) == 0);
    EXPECT(rel_diff(lg, ref, 3 * (size_t)V) <= TOL);
    /* forward_last: the logits of the last new token only (lg[V..] untouched) */
    REQUIRE(target_cache_crop(c, 0, 0, &err) == 0);
    lg[V] = 12345.0f;
    REQUIRE(target_cache_forward_last(c, 0, ids, 5, NULL, 0, NULL, lg, &err) == 0);
    EXPECT(rel_diff(lg, ref + 4 * V, (size_t)V) <= TOL);
    EXPECT(lg[V] == 12345.0f);
    EXPECT(target_cache_length(c, 0) == 5);
    target_cache_destroy(&c);
    target_cache_destroy(&c); /* idempotent on NULL */
    free(ref); free(lg); free(ax);
    target_model_destroy(&m);
}

TEST(create_refuses_partial_model_hybrid_family_and_bad_sizes)
{
    const char *g = test_golden("tiny/target");
    errbuf err = {{0}};
    target_model *part = NULL;
    REQUIRE(target_model_load(&part, g, 2, &err) == 0);
    target_cache *c = NULL;
    EXPECT(target_cache_create(&c, part, 1, 8, &err) == -EINVAL && c == NULL);
    EXPECT_CONTAINS(err.msg, "0..2");
    target_model_destroy(&part);
    target_model *m = load(g);
    EXPECT(target_cache_create(&c, m, 0, 8, &err) == -EINVAL && c == NULL);
    EXPECT(target_cache_create(&c, m, 1, 0, &err) == -EINVAL && c == NULL);
    /* a family it cannot decode (here: a Qwen3.5 model_type without the hybrid layers loaded): refused by name */
    m->cfg.arch = (enum hf_arch)(HF_ARCH_LLAMA + 1);
    snprintf(m->cfg.model_type, sizeof m->cfg.model_type, "qwen3_5_text");
    EXPECT(target_cache_create(&c, m, 1, 8, &err) == -ENOTSUP && c == NULL);
    EXPECT_CONTAINS(err.msg, "supports qwen3 and llama targets");
    EXPECT_CONTAINS(err.msg, "qwen3_5_text");
    target_model_destroy(&m);
}

TEST(argmax_lowest_id_on_ties_and_suppressed_ids)
{
    float row[6] = {1, 5, 2, 5, -1, 0};
    EXPECT(target_logits_argmax(row, 6, NULL, 0) == 1);
    int32_t s1[] = {1};
    EXPECT(target_logits_argmax(row, 6, s1, 1) == 3);
    int32_t s2[] = {3, 1};
    EXPECT(target_logits_argmax(row, 6, s2, 2) == 2);
    int32_t all[] = {0, 1, 2, 3, 4, 5};
    EXPECT(target_logits_argmax(row, 6, all, 6) == -1);
    /* NaN never wins, suppressed or not (as argmax_rows_cpu) */
    float nan_row[4] = {NAN, -2, NAN, -1};
    EXPECT(target_logits_argmax(nan_row, 4, NULL, 0) == 3);
    int32_t s3[] = {3};
    EXPECT(target_logits_argmax(nan_row, 4, s3, 1) == 1);
}

/* Sampling: over a grid of u, each id is picked as often as its probability says (temperature and top_p applied),
 * suppressed and NaN ids never; all at -inf is the greedy choice; everything suppressed is -1. */
static void sample_frequencies(const float *row, int V, const int32_t *sup, int nsup, double temp, double top_p,
                               double *freq)
{
    enum { N = 20000 };
    target_sample_item scratch[8];
    for (int v = 0; v < V; v++) freq[v] = 0;
    for (int i = 0; i < N; i++) {
        int32_t t = target_logits_sample(row, V, sup, nsup, temp, top_p, (i + 0.5) / N, scratch);
        REQUIRE(t >= 0 && t < V);
        freq[t] += 1.0 / N;
    }
}

TEST(sample_follows_temperature_top_p_and_suppression)
{
    /* probabilities at temperature 1: 0.1 0.2 0.3 0.4 (as logits log p) */
    float row[4] = {logf(0.1f), logf(0.2f), logf(0.3f), logf(0.4f)};
    double f[4];
    sample_frequencies(row, 4, NULL, 0, 1.0, 1.0, f);
    for (int v = 0; v < 4; v++) EXPECT_NEAR(f[v], 0.1 * (v + 1), 1e-3);
    /* temperature 0.5 squares the odds: 1 4 9 16 over 30 */
    sample_frequencies(row, 4, NULL, 0, 0.5, 1.0, f);
    EXPECT_NEAR(f[0], 1 / 30.0, 1e-3); EXPECT_NEAR(f[3], 16 / 30.0, 1e-3);
    /* top_p 0.6: the nucleus is {3, 2} (0.4 + 0.3 >= 0.6), renormalised to 4/7 and 3/7 */
    sample_frequencies(row, 4, NULL, 0, 1.0, 0.6, f);
    EXPECT(f[0] == 0 && f[1] == 0);
    EXPECT_NEAR(f[3], 4 / 7.0, 1e-3); EXPECT_NEAR(f[2], 3 / 7.0, 1e-3);
    /* top_p tiny: the most likely id alone */
    sample_frequencies(row, 4, NULL, 0, 1.0, 1e-9, f);
    EXPECT_NEAR(f[3], 1.0, 1e-9);
    /* a suppressed id and a NaN never come out; the rest keep their ratios (0.2 : 0.3) */
    float nan_row[4] = {logf(0.1f), logf(0.2f), logf(0.3f), NAN};
    int32_t s0[] = {0};
    sample_frequencies(nan_row, 4, s0, 1, 1.0, 1.0, f);
    EXPECT(f[0] == 0 && f[3] == 0);
    EXPECT_NEAR(f[1], 0.4, 1e-3); EXPECT_NEAR(f[2], 0.6, 1e-3);
    /* all left at -inf: the greedy rule (the lowest id left); everything suppressed: -1 */
    float inf_row[3] = {-INFINITY, -INFINITY, -INFINITY};
    target_sample_item scratch[4];
    int32_t s1[] = {0};
    EXPECT(target_logits_sample(inf_row, 3, s1, 1, 1.0, 1.0, 0.7, scratch) == 1);
    int32_t all[] = {0, 1, 2};
    EXPECT(target_logits_sample(inf_row, 3, all, 3, 1.0, 1.0, 0.7, scratch) == -1);
    /* the same inputs, the same id (a pure function) */
    EXPECT(target_logits_sample(row, 4, NULL, 0, 0.8, 0.9, 0.37, scratch) ==
           target_logits_sample(row, 4, NULL, 0, 0.8, 0.9, 0.37, scratch));
}

/* Two threads, each its own cache over one shared model, decode different texts at the same time: the same bits
 * as decoding them one after the other. */
struct thread_arg {
    target_model *m;
    const int32_t *ids;
    int n;
    float *logits; /* (n, V) */
    int rc;
};

static void *decode_thread(void *p)
{
    struct thread_arg *a = p;
    const int V = target_model_config(a->m)->vocab_size;
    target_cache *c = NULL;
    errbuf err = {{0}};
    a->rc = target_cache_create(&c, a->m, 1, a->n, &err);
    for (int rep = 0; rep < 20 && !a->rc; rep++) {
        a->rc = target_cache_crop(c, 0, 0, &err);
        a->rc = a->rc ? a->rc : target_cache_forward(c, 0, a->ids, 4, NULL, 0, NULL, a->logits, &err);
        for (int t = 4; t < a->n && !a->rc; t++)
            a->rc = target_cache_forward(c, 0, a->ids + t, 1, NULL, 0, NULL, a->logits + (size_t)t * V, &err);
    }
    target_cache_destroy(&c);
    return NULL;
}

static void two_threads_share(const char *dir)
{
    target_model *m = load(dir);
    const int V = target_model_config(m)->vocab_size, n = 16;
    int32_t ids[2][16];
    random_ids(ids[0], n, V, 21);
    random_ids(ids[1], n, V, 22);
    struct thread_arg seq[2], par[2];
    for (int i = 0; i < 2; i++) {
        seq[i] = (struct thread_arg){m, ids[i], n, malloc(sizeof(float) * n * V), 0};
        par[i] = (struct thread_arg){m, ids[i], n, malloc(sizeof(float) * n * V), 0};
        decode_thread(&seq[i]);
        REQUIRE(seq[i].rc == 0);
    }
    pthread_t th[2];
    for (int i = 0; i < 2; i++) REQUIRE(pthread_create(&th[i], NULL, decode_thread, &par[i]) == 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++) {
        EXPECT(par[i].rc == 0);
        EXPECT(memcmp(par[i].logits, seq[i].logits, sizeof(float) * n * V) == 0);
        free(seq[i].logits);
        free(par[i].logits);
    }
    target_model_destroy(&m);
}

TEST(two_threads_share_one_model) { two_threads_share(test_golden("tiny/target")); }

/* ---- the hybrid Qwen3.5 targets (Gated DeltaNet states beside the attention layers' KV cache) ---- */

/* After decode_case_begin: a crop back past the block's start is refused; the block cropped to 15 then to 14 (a
 * crop after a crop), a different continuation; crops to the whole length and to the block's start; sequence 0
 * continues undisturbed; a crop to 0 starts again. */
static void hybrid_decode_matches_full(const char *dir)
{
    decode_case k;
    decode_case_begin(&k, dir, 2);
    REQUIRE(target_model_config(k.m)->is_hybrid);
    errbuf err = {{0}};
    target_cache *c = k.c;
    /* back past the block's start (12): refused, nothing changed */
    EXPECT(target_cache_crop(c, 1, 11, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "sequence 1");
    EXPECT_CONTAINS(err.msg, "start (12) of its last forward");
    EXPECT(target_cache_length(c, 1) == 17);
    REQUIRE(target_cache_crop(c, 1, 15, &err) == 0);
    REQUIRE(target_cache_crop(c, 1, 14, &err) == 0);
    EXPECT(target_cache_crop(c, 1, 11, &err) == -EINVAL);
    EXPECT(target_cache_length(c, 1) == 14);
    STEP(&k, 1, b, 14, 6, aux_b, log_b, "block after crop");
    /* a crop to the whole length is a no-op; to the block's start keeps the states before it */
    REQUIRE(target_cache_crop(c, 1, 20, &err) == 0);
    REQUIRE(target_cache_crop(c, 1, 14, &err) == 0);
    STEP(&k, 1, b, 14, 1, aux_b, log_b, "single after crop to the block start");
    STEP(&k, 1, b, 15, 5, aux_b, log_b, "block after that");
    EXPECT(target_cache_length(c, 0) == 6);
    STEP(&k, 0, o7, 6, 1, aux_o, log_o, "other sequence");
    /* a crop to 0 starts again: prefill with forward_last (the last row's logits only) */
    const int V = k.V;
    REQUIRE(target_cache_crop(c, 1, 0, &err) == 0);
    float *lg = malloc(sizeof(float) * V);
    REQUIRE(target_cache_forward_last(c, 1, k.a, 9, NULL, 0, NULL, lg, &err) == 0);
    EXPECT(rel_diff(lg, k.log_a + 8 * V, (size_t)V) <= TOL);
    STEP(&k, 1, a, 9, 3, aux_a, log_a, "after a crop to 0");
    free(lg);
    decode_case_end(&k);
}

TEST(qwen35_decode_prefill_step_block_crop_match_full_forward)
{
    hybrid_decode_matches_full(test_golden("qwen35-tiny/target"));
}

TEST(qwen35moe_decode_prefill_step_block_crop_match_full_forward)
{
    hybrid_decode_matches_full(test_golden("qwen35moe-tiny/target"));
}

/* Refused forwards change no state: after them the sequence still continues the text exactly. */
TEST(hybrid_refused_calls_change_nothing)
{
    target_model *m = load(test_golden("qwen35-tiny/target"));
    const int V = target_model_config(m)->vocab_size;
    int32_t ids[12];
    random_ids(ids, 12, V, 9);
    float *ref = malloc(sizeof(float) * 12 * V), *lg = malloc(sizeof(float) * 4 * V);
    full_forward(m, ids, 12, NULL, 0, NULL, ref);
    target_cache *c = NULL;
    errbuf err = {{0}};
    REQUIRE(target_cache_create(&c, m, 1, 10, &err) == 0);
    EXPECT(target_cache_crop(c, 0, 0, &err) == 0);
    REQUIRE(target_cache_forward(c, 0, ids, 8, NULL, 0, NULL, NULL, &err) == 0);
    EXPECT(target_cache_forward(c, 0, ids + 8, 3, NULL, 0, NULL, lg, &err) == -ENOSPC);
    int32_t bad[2] = {ids[8], V};
    EXPECT(target_cache_forward(c, 0, bad, 2, NULL, 0, NULL, lg, &err) == -EINVAL);
    EXPECT(target_cache_crop(c, 0, 9, &err) == -EINVAL);
    EXPECT(target_cache_length(c, 0) == 8);
    REQUIRE(target_cache_forward(c, 0, ids + 8, 2, NULL, 0, NULL, lg, &err) == 0);
    EXPECT(rel_diff(lg, ref + 8 * V, 2 * (size_t)V) <= TOL);
    target_cache_destroy(&c);
    free(ref); free(lg);
    target_model_destroy(&m);
}

/* A hybrid model's decoding scratch is the cache's, not the model's: two threads, the same bits. */
TEST(two_threads_share_one_hybrid_model) { two_threads_share(test_golden("qwen35moe-tiny/target")); }

TEST_MAIN
