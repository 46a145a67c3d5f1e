/* Speculative decoding (common/decode/spec_decode.h) and the drafter's inference forward (drafter_infer.h) on the
 * goldens' tiny target and drafter: one drafted block is the training forward with a single anchor at the block's
 * position; speculative decoding commits exactly the target-only greedy tokens; the walk over that greedy text gives
 * the same accepted lengths, also when EOS stops generation early; a drafter made for another target is refused,
 * naming its config.json and the field. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anchors.h"
#include "drafter_infer.h"
#include "drafter_model.h"
#include "rng.h"
#include "spec_decode.h"
#include "target_decode.h"
#include "target_model.h"
#include "tests/test.h"
#include "util.h"

typedef struct fixture {
    target_model *tm;
    drafter_infer *d;
    const hf_config *dc;
} fixture;

static void fixture_load(fixture *f)
{
    errbuf err = {{0}};
    memset(f, 0, sizeof *f);
    if (target_model_load(&f->tm, test_golden("tiny/target"), -1, &err)) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(f->tm);
    if (drafter_infer_load(&f->d, test_golden("tiny/drafter"), f->tm, &err)) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(f->d);
    f->dc = drafter_infer_config(f->d);
}

static void fixture_free(fixture *f)
{
    drafter_infer_destroy(&f->d);
    target_model_destroy(&f->tm);
}

static void random_ids(int32_t *ids, int n, int vocab, uint64_t seed)
{
    rng r;
    rng_seed(&r, seed, 0, 0, 0);
    for (int t = 0; t < n; t++) ids[t] = (int32_t)rng_below(&r, (uint64_t)vocab - 20);
}

TEST(drafted_block_is_the_training_forward_with_one_anchor)
{
    fixture f;
    fixture_load(&f);
    const hf_config *dc = f.dc;
    const int T = 21, B = dc->block_size, V = dc->vocab_size, KH = dc->num_taps * dc->hidden_size;
    int32_t ids[21], pos[21], cu[2] = {0, T};
    uint8_t lm[21];
    random_ids(ids, T, V, 1);
    for (int t = 0; t < T; t++) pos[t] = t, lm[t] = 1;
    float *aux = malloc(sizeof(float) * (size_t)T * KH);
    target_batch tb = {.ntok = T, .nseq = 1, .input_ids = ids, .positions = pos, .cu_seqlens = cu};
    errbuf err = {{0}};
    REQUIRE(target_model_forward(f.tm, &tb, dc->taps, dc->num_taps, aux, NULL, NULL, &err) == 0);
    /* the training forward's view of the drafter: the same checkpoint as a drafter_model */
    drafter_model *m = NULL;
    REQUIRE(drafter_model_load(&m, test_golden("tiny/drafter"), target_model_config(f.tm), &err) == 0);
    drafter_frozen fz = {.embed = target_model_embedding(f.tm), .lm_head = target_model_lm_head(f.tm), .vocab = V};
    float *want = malloc(sizeof(float) * (size_t)B * V), *got = malloc(sizeof(float) * (size_t)B * V);
    const int anchors[] = {1, 7, 16};
    for (int i = 0; i < 3; i++) {
        int32_t a = anchors[i], s = 0;
        drafter_blocks blk;
        drafter_blocks_build(&blk, ids, cu, lm, &a, &s, 1, B, dc->mask_token_id, 2.0);
        drafter_outputs o = {.logits = want};
        drafter_forward_backward(m, &fz, aux, T, pos, &blk, 0, 1.0f, NULL, &o);
        drafter_blocks_free(&blk);
        int32_t draft[DFLASH_MAX_BLOCK];
        drafter_infer_block(f.d, aux, a, ids[a], got, draft);
        double maxd = 0, maxa = 0;
        for (int k = 0; k < B * V; k++) {
            maxd = fmax(maxd, fabs((double)want[k] - got[k]));
            maxa = fmax(maxa, fabs((double)want[k]));
        }
        EXPECT(maxa > 0);
        EXPECT(maxd <= 1e-5 * maxa);
        for (int k = 0; k < B; k++) {
            int32_t best = 0;
            for (int v = 1; v < V; v++)
                if (got[(size_t)k * V + v] > got[(size_t)k * V + best]) best = v;
            EXPECT(draft[k] == best);
        }
    }
    free(want);
    free(got);
    free(aux);
    drafter_model_destroy(&m);
    fixture_free(&f);
}

/* Decode, target-only greedy and the walk of one prompt agree: tokens, and accepted lengths. */
static void check_prompt(fixture *f, target_cache *c, const int32_t *prompt, int plen, const spec_opts *o)
{
    errbuf err = {{0}};
    spec_result r = {0}, g = {0}, w = {0};
    REQUIRE(spec_decode(c, f->d, prompt, plen, o, &r, &err) == 0);
    REQUIRE(spec_target_greedy(c, f->tm, prompt, plen, o, &g, &err) == 0);
    EXPECT(r.ntokens == g.ntokens && memcmp(r.tokens, g.tokens, sizeof(int32_t) * (size_t)r.ntokens) == 0);
    int sum = 0;
    for (int i = 0; i < r.nblocks; i++) sum += r.accepted[i];
    EXPECT(sum + 1 == r.ntokens); /* the prefill's token, then what the blocks committed */
    int32_t *text = malloc(sizeof(int32_t) * (size_t)(plen + g.ntokens));
    memcpy(text, prompt, sizeof(int32_t) * (size_t)plen);
    memcpy(text + plen, g.tokens, sizeof(int32_t) * (size_t)g.ntokens);
    if (spec_walk(f->tm, f->d, text, plen, plen + g.ntokens, o, &w, &err)) fprintf(stderr, "  %s\n", err.msg);
    EXPECT(w.nblocks == r.nblocks && memcmp(w.accepted, r.accepted, sizeof(int) * (size_t)r.nblocks) == 0);
    /* a text that is not the target's greedy continuation is refused, naming the position */
    text[plen + g.ntokens - 1] = (text[plen + g.ntokens - 1] + 1) % 400;
    spec_result_free(&w);
    if (g.ntokens > 1) {
        EXPECT(spec_walk(f->tm, f->d, text, plen, plen + g.ntokens, o, &w, &err) == -EINVAL);
        EXPECT_CONTAINS(err.msg, "greedy");
    }
    spec_result_free(&w);
    spec_result_free(&r);
    spec_result_free(&g);
    free(text);
}

TEST(decoding_commits_the_greedy_tokens_and_the_walk_agrees)
{
    fixture f;
    fixture_load(&f);
    errbuf err = {{0}};
    target_cache *c = NULL;
    REQUIRE(target_cache_create(&c, f.tm, 1, 64, &err) == 0);
    spec_opts o = {.max_new = 30, .reserved = f.dc->mask_token_id};
    for (int i = 0; i < 4; i++) {
        int32_t prompt[20];
        int plen = 5 + 4 * i;
        random_ids(prompt, plen, f.dc->vocab_size, 10 + (uint64_t)i);
        check_prompt(&f, c, prompt, plen, &o);
    }
    /* a short budget: the last blocks are cut to the positions left */
    int32_t prompt[9];
    random_ids(prompt, 9, f.dc->vocab_size, 99);
    for (int m = 1; m <= 6; m++) {
        o.max_new = m;
        check_prompt(&f, c, prompt, 9, &o);
    }
    /* the prompt + new tokens must fit the cache */
    o.max_new = 60;
    spec_result r = {0};
    EXPECT(spec_decode(c, f.d, prompt, 9, &o, &r, &err) == -ENOSPC);
    EXPECT_CONTAINS(err.msg, "64 positions");
    spec_result_free(&r);
    target_cache_destroy(&c);
    fixture_free(&f);
}

TEST(eos_stops_decoding_and_the_walk_alike)
{
    fixture f;
    fixture_load(&f);
    errbuf err = {{0}};
    target_cache *c = NULL;
    REQUIRE(target_cache_create(&c, f.tm, 1, 64, &err) == 0);
    int32_t prompt[12];
    random_ids(prompt, 12, f.dc->vocab_size, 5);
    spec_opts o = {.max_new = 30, .reserved = f.dc->mask_token_id};
    spec_result g = {0};
    REQUIRE(spec_target_greedy(c, f.tm, prompt, 12, &o, &g, &err) == 0);
    REQUIRE(g.ntokens == 30);
    for (int at = 0; at < 30; at += 7) {
        int32_t eos = g.tokens[at];
        int first = 0;
        while (g.tokens[first] != eos) first++;
        o.eos = &eos;
        o.neos = 1;
        spec_result r = {0};
        REQUIRE(spec_decode(c, f.d, prompt, 12, &o, &r, &err) == 0);
        EXPECT(r.ntokens == first + 1 && r.tokens[first] == eos);
        spec_result_free(&r);
        check_prompt(&f, c, prompt, 12, &o);
    }
    spec_result_free(&g);
    target_cache_destroy(&c);
    fixture_free(&f);
}

static void write_drafter_variant(const char *dir, const char *sed_expr)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s && cp %s/model.safetensors %s/ && sed -e '%s' %s/config.json "
             "> %s/config.json", dir, dir, test_golden("tiny/drafter"), dir, sed_expr, test_golden("tiny/drafter"), dir);
    REQUIRE(system(cmd) == 0);
}

TEST(drafter_for_another_target_is_refused_naming_config_and_field)
{
    fixture f;
    fixture_load(&f);
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/dflash-test-spec-%d", (int)getpid());
    const struct { const char *sed, *field, *value; } cases[] = {
        {"s/\"num_target_layers\": 8/\"num_target_layers\": 12/", "num_target_layers", "8"},
        {"s/\"hidden_size\": 64/\"hidden_size\": 48/", "hidden_size", "64"},
        {"s/\"vocab_size\": 512/\"vocab_size\": 600/", "vocab_size", "512"},
        {"s/\"num_target_layers\": 8/\"num_target_layers\": 12/; s/^      5$/      9/", "target_layer_ids", "8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_drafter_variant(dir, cases[i].sed);
        errbuf err = {{0}};
        drafter_infer *d = NULL;
        EXPECT(drafter_infer_load(&d, dir, f.tm, &err) == -EINVAL);
        EXPECT_CONTAINS(err.msg, "config.json");
        EXPECT_CONTAINS(err.msg, dir);
        EXPECT_CONTAINS(err.msg, cases[i].field);
        EXPECT_CONTAINS(err.msg, cases[i].value);
        EXPECT(d == NULL);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    REQUIRE(system(cmd) == 0);
    fixture_free(&f);
}

TEST_MAIN
