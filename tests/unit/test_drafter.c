/* drafter model: a finite-difference check of the gradient of every parameter kind on a small random configuration
 * (3 query heads over 1 kv head, block size 3, two layers, two taps: shapes unlike the goldens'), anchor sampling
 * properties, block construction and the mask structure, checkpoint round trip, and bad checkpoint input. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>

#include "anchors.h"
#include "checkpoint.h"
#include "drafter_model.h"
#include "hf_config.h"
#include "rng.h"
#include "safetensors.h"
#include "target_model.h"
#include "tests/test.h"
#include "util.h"

static hf_config small_config(void)
{
    hf_config c;
    memset(&c, 0, sizeof c);
    c.arch = HF_ARCH_QWEN3;
    snprintf(c.model_type, sizeof c.model_type, "qwen3");
    c.hidden_size = 12;
    c.num_layers = 2;
    c.num_heads = 3;
    c.num_kv_heads = 1;
    c.head_dim = 4;
    c.intermediate_size = 10;
    c.vocab_size = 23;
    c.rms_eps = 1e-6;
    c.rope_theta = 10000.0;
    c.has_qk_norm = 1;
    c.max_position = 4096;
    c.is_dflash = 1;
    c.block_size = 3;
    c.num_target_layers = 6;
    c.mask_token_id = 22;
    c.num_taps = 2;
    c.taps[0] = 1;
    c.taps[1] = 3;
    return c;
}

/* A packed batch of three sequences with a loss mask, its anchors and blocks, and random frozen tables. */
typedef struct fixture {
    hf_config cfg;
    drafter_model *m;
    int T, nseq;
    int32_t ids[40], pos[40], cu[4];
    uint8_t lm[40];
    float *aux, *embed, *lm_head;
    drafter_blocks blk;
    float wsum;
} fixture;

static void fixture_make(fixture *f)
{
    f->cfg = small_config();
    f->m = drafter_model_create(&f->cfg, 99);
    /* bigger than the 0.02 init so every path carries signal */
    rng r;
    rng_seed(&r, 3, 0, 0, 0);
    float *w = drafter_weights(f->m);
    for (int i = 0; i < drafter_param_count(f->m); i++) {
        const drafter_param *p = drafter_param_at(f->m, i);
        for (size_t k = 0; k < p->numel; k++)
            w[p->offset + k] = p->ndim == 2 ? (float)(0.4 * rng_normal(&r)) : (float)(1 + 0.2 * rng_normal(&r));
    }
    const int lens[3] = {9, 14, 7};
    f->nseq = 3;
    f->cu[0] = 0;
    for (int s = 0; s < 3; s++) {
        f->cu[s + 1] = f->cu[s] + lens[s];
        for (int t = 0; t < lens[s]; t++) {
            int i = f->cu[s] + t;
            f->ids[i] = (int32_t)rng_below(&r, 22);
            f->pos[i] = t;
            f->lm[i] = t >= 2;
        }
    }
    f->T = f->cu[3];
    const int H = f->cfg.hidden_size, V = f->cfg.vocab_size, K = f->cfg.num_taps;
    f->aux = malloc(sizeof(float) * (size_t)(f->T * K * H));
    f->embed = malloc(sizeof(float) * (size_t)(V * H));
    f->lm_head = malloc(sizeof(float) * (size_t)(V * H));
    for (int i = 0; i < f->T * K * H; i++) f->aux[i] = (float)rng_normal(&r);
    for (int i = 0; i < V * H; i++) f->embed[i] = (float)rng_normal(&r);
    for (int i = 0; i < V * H; i++) f->lm_head[i] = (float)(0.5 * rng_normal(&r));
    int32_t *anchors, *seq;
    int N = anchors_sample(f->cu, 3, f->lm, 4, 5, 0, 0, &anchors, &seq);
    drafter_blocks_build(&f->blk, f->ids, f->cu, f->lm, anchors, seq, N, 3, 22, 2.0);
    free(anchors);
    free(seq);
    f->wsum = 0;
    for (int i = 0; i < N * 3; i++) f->wsum += f->blk.weights[i];
}

static void fixture_free(fixture *f)
{
    drafter_model_destroy(&f->m);
    drafter_blocks_free(&f->blk);
    free(f->aux);
    free(f->embed);
    free(f->lm_head);
}

static double loss_at(fixture *f)
{
    drafter_frozen fz = {.embed = f->embed, .lm_head = f->lm_head, .vocab = f->cfg.vocab_size};
    drafter_metrics mt = {0};
    drafter_forward_backward(f->m, &fz, f->aux, f->T, f->pos, &f->blk, 0, 1.0f, &mt, NULL);
    return mt.loss_sum / mt.weight_sum;
}

TEST(gradient_matches_finite_differences_for_every_parameter_kind)
{
    fixture f;
    fixture_make(&f);
    REQUIRE(f.blk.nblocks > 3 && f.wsum > 0);
    drafter_frozen fz = {.embed = f.embed, .lm_head = f.lm_head, .vocab = f.cfg.vocab_size};
    drafter_grads_zero(f.m);
    drafter_forward_backward(f.m, &fz, f.aux, f.T, f.pos, &f.blk, 1, 1.0f / f.wsum, NULL, NULL);
    float *g = malloc(sizeof(float) * drafter_numel(f.m));
    memcpy(g, drafter_grads(f.m), sizeof(float) * drafter_numel(f.m));
    float *w = drafter_weights(f.m);
    int checked = 0;
    for (int i = 0; i < drafter_param_count(f.m); i++) {
        const drafter_param *p = drafter_param_at(f.m, i);
        /* the two largest gradient entries of the tensor and one fixed one */
        size_t pick[3] = {0, 0, p->numel / 2};
        for (size_t k = 0; k < p->numel; k++) {
            float a = fabsf(g[p->offset + k]);
            if (a > fabsf(g[p->offset + pick[0]])) { pick[1] = pick[0]; pick[0] = k; }
            else if (k != pick[0] && a > fabsf(g[p->offset + pick[1]])) pick[1] = k;
        }
        double gmax = fabs(g[p->offset + pick[0]]);
        for (int j = 0; j < 3; j++) {
            size_t e = p->offset + pick[j];
            float keep = w[e], h = 2e-3f * fmaxf(1.0f, fabsf(keep));
            w[e] = keep + h;
            double lp = loss_at(&f);
            w[e] = keep - h;
            double lm = loss_at(&f);
            w[e] = keep;
            double fd = (lp - lm) / (2.0 * h), an = g[e];
            if (!(fabs(fd - an) <= 2e-2 * fmax(fabs(fd), 0.05 * gmax) + 2e-5)) {
                fprintf(stderr, "  %s[%zu]: analytic %.6g, finite difference %.6g\n", p->name, pick[j], an, fd);
                test_failed_here = 1;
            }
            checked++;
        }
    }
    EXPECT(checked == 3 * drafter_param_count(f.m));
    free(g);
    fixture_free(&f);
}

/* A drafter big enough for the parallel fill gets, tensor by tensor, the values one random stream per tensor gives. */
TEST(fresh_weights_are_the_same_with_threads)
{
    hf_config c = small_config();
    c.hidden_size = 256;
    c.num_layers = 8;
    c.num_heads = 4;
    c.head_dim = 64;
    c.num_kv_heads = 2;
    c.intermediate_size = 1024;
    drafter_layout L;
    drafter_layout_init(&L, &c);
    REQUIRE(L.numel > ((size_t)1 << 22));
    float *w = xmalloc(sizeof(float) * L.numel);
    drafter_layout_init_weights(&L, w, 99);
    for (int i = 0; i < L.nparams; i += 7) {
        const drafter_param *p = &L.params[i];
        rng r;
        rng_seed(&r, 99, 0x5eed, (uint64_t)i, 0);
        int same = 1;
        for (size_t k = 0; k < p->numel && same; k++)
            same = w[p->offset + k] == (p->ndim >= 2 ? (float)(0.02 * rng_normal(&r)) : 1.0f);
        EXPECT(same);
    }
    free(w);
    drafter_layout_destroy(&L);
}

TEST(anchor_sampler_validity_cap_determinism_and_fresh_draws)
{
    /* two long sequences with masked stretches */
    enum { T = 300 };
    int32_t cu[3] = {0, 180, T};
    uint8_t lm[T];
    for (int t = 0; t < T; t++) lm[t] = (t % 37) > 5;
    int32_t *a1, *s1, *a2, *s2, *a3, *s3;
    int n1 = anchors_sample(cu, 2, lm, 40, 7, 0, 11, &a1, &s1);
    int n2 = anchors_sample(cu, 2, lm, 40, 7, 0, 11, &a2, &s2);
    int n3 = anchors_sample(cu, 2, lm, 40, 7, 1, 11, &a3, &s3);
    EXPECT(n1 == 80 && n2 == n1 && n3 == n1);
    EXPECT(memcmp(a1, a2, sizeof(int32_t) * (size_t)n1) == 0);        /* same seed, epoch, batch: same draw */
    EXPECT(memcmp(a1, a3, sizeof(int32_t) * (size_t)n1) != 0);        /* a new epoch draws afresh */
    int per_seq[2] = {0, 0};
    for (int i = 0; i < n1; i++) {
        int s = s1[i], a = a1[i], start = cu[s], len = cu[s + 1] - cu[s];
        per_seq[s]++;
        EXPECT(a >= 0 && a + 1 < len && lm[start + a] && lm[start + a + 1]);   /* valid */
        if (i > 0 && s1[i - 1] == s) EXPECT(a1[i - 1] < a);                    /* sorted, distinct */
    }
    EXPECT(per_seq[0] == 40 && per_seq[1] == 40);                             /* the cap */
    int32_t *a4, *s4;
    int n4 = anchors_sample(cu, 2, lm, 1000, 7, 0, 11, &a4, &s4);             /* no cap: every valid position */
    int valid = 0;
    for (int s = 0; s < 2; s++)
        for (int a = 0; a + 1 < cu[s + 1] - cu[s]; a++) valid += lm[cu[s] + a] && lm[cu[s] + a + 1];
    EXPECT(n4 == valid);
    free(a1); free(s1); free(a2); free(s2); free(a3); free(s3); free(a4); free(s4);
}

TEST(blocks_mask_labels_and_weights)
{
    int32_t ids[10] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, cu[3] = {0, 6, 10};
    uint8_t lm[10] = {0, 1, 1, 1, 0, 1, 1, 1, 1, 1};
    int32_t anchors[2] = {2, 1}, seq[2] = {0, 1};
    drafter_blocks b;
    drafter_blocks_build(&b, ids, cu, lm, anchors, seq, 2, 4, 99, 2.0);
    /* block 0: anchor 2 of sequence 0 sees context rows 0..1; block 1: anchor 1 of sequence 1 sees row 6 only */
    EXPECT(b.ctx_start[0] == 0 && b.ctx_len[0] == 2 && b.ctx_start[1] == 6 && b.ctx_len[1] == 1);
    EXPECT(b.block_ids[0] == 7 && b.block_ids[1] == 99 && b.block_ids[4] == 12 && b.block_ids[7] == 99);
    EXPECT(b.block_pos[0] == 2 && b.block_pos[3] == 5 && b.block_pos[4] == 1);
    /* slot 1 of block 0 predicts token 3 (id 8); slot 2 would predict token 4, masked out; slot 3 token 5 */
    EXPECT(b.labels[1] == 8 && b.weights[1] == 1.0f);
    EXPECT(b.weights[2] == 0.0f);
    EXPECT(b.labels[3] == 10 && fabsf(b.weights[3] - expf(-1.0f)) < 1e-7f);
    /* block 1: slots past the end of sequence 1 (positions 4..) are not trained */
    EXPECT(b.labels[5] == 13 && b.labels[6] == 14 && b.weights[7] == 0.0f);
    EXPECT(b.weights[0] == 0.0f && b.weights[4] == 0.0f);   /* slot 0, the anchor itself, never */
    drafter_blocks_free(&b);
}

TEST(default_taps_follow_the_spec_rule)
{
    int t[5];
    target_default_taps(36, 5, t);
    EXPECT(t[0] == 1 && t[1] == 9 && t[2] == 17 && t[3] == 25 && t[4] == 33);
    target_default_taps(32, 5, t);  /* Llama-3.1-8B: [1, 8, 15, 22, 29] */
    EXPECT(t[0] == 1 && t[1] == 8 && t[2] == 15 && t[3] == 22 && t[4] == 29);
    target_default_taps(30, 5, t);  /* 1 + i*6.5: 7.5 and 20.5 round half to even like Python */
    EXPECT(t[1] == 8 && t[3] == 20);
    target_default_taps(36, 1, t);
    EXPECT(t[0] == 18);
}

static char *tmp_dir(void)
{
    static char d[64];
    snprintf(d, sizeof d, "/tmp/dflash-drafter-XXXXXX");
    REQUIRE(mkdtemp(d));
    return d;
}

TEST(checkpoint_round_trip_zlab_layout_and_optimizer_state)
{
    hf_config c = small_config();
    drafter_model *m = drafter_model_create(&c, 5);
    char *dir = tmp_dir(), path[256];
    errbuf err = {{0}};
    snprintf(path, sizeof path, "%s/d", dir);
    REQUIRE(drafter_model_save(m, path, ST_F32, &err) == 0);
    drafter_model *back = NULL;
    REQUIRE(drafter_model_load(&back, path, NULL, &err) == 0);
    EXPECT(drafter_numel(back) == drafter_numel(m));
    EXPECT(memcmp(drafter_weights(back), drafter_weights(m), sizeof(float) * drafter_numel(m)) == 0);
    EXPECT(drafter_model_config(back)->block_size == 3 && drafter_model_config(back)->taps[1] == 3);
    /* the z-lab names are the file's tensor names */
    st_file *st = NULL;
    snprintf(path, sizeof path, "%s/d/model.safetensors", dir);
    REQUIRE(st_open(&st, path, &err) == 0);
    EXPECT(st_find(st, "fc.weight") && st_find(st, "layers.1.self_attn.k_norm.weight") && st_find(st, "norm.weight"));
    EXPECT(!st_find(st, "embed_tokens.weight") && !st_find(st, "lm_head.weight"));   /* frozen: never copied */
    st_close(&st);
    /* a training checkpoint: bf16 export + exact fp32 state */
    size_t n = drafter_numel(m);
    float *mm = calloc(n, sizeof(float)), *vv = calloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++) { mm[i] = (float)i * 1e-3f; vv[i] = (float)i * 1e-6f; }
    checkpoint_state cs = {.step = 42, .batches_committed = 84, .seed = 9}, got;
    snprintf(path, sizeof path, "%s/ckpt", dir);
    REQUIRE(checkpoint_write(path, &c, drafter_weights(m), mm, vv, n, &cs, &err) == 0);
    EXPECT(checkpoint_exists(path, 42));
    float *w2 = malloc(sizeof(float) * n), *m2 = malloc(sizeof(float) * n), *v2 = malloc(sizeof(float) * n);
    REQUIRE(checkpoint_read(path, NULL, w2, m2, v2, n, &got, &err) == 0);
    EXPECT(got.step == 42 && got.batches_committed == 84 && got.seed == 9);
    EXPECT(!memcmp(w2, drafter_weights(m), sizeof(float) * n) && !memcmp(m2, mm, sizeof(float) * n) &&
           !memcmp(v2, vv, sizeof(float) * n));
    drafter_model *bf = NULL;
    snprintf(path, sizeof path, "%s/ckpt/latest", dir);
    REQUIRE(drafter_model_load(&bf, path, NULL, &err) == 0);   /* the bf16 export loads as a drafter */
    float maxd = 0;
    for (size_t i = 0; i < n; i++) maxd = fmaxf(maxd, fabsf(drafter_weights(bf)[i] - drafter_weights(m)[i]));
    EXPECT(maxd < 0.01f);
    drafter_model_destroy(&bf);
    drafter_model_destroy(&back);
    drafter_model_destroy(&m);
    free(mm); free(vv); free(w2); free(m2); free(v2);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    REQUIRE(system(cmd) == 0);
}

/* Retention: the newest keep_checkpoints and every keep_every-th step stay, latest always; a folder a reader holds
 * (the shared flock checkpoint_read takes while it reads) is left for the next prune, which then removes it. */
TEST(checkpoint_retention_keeps_newest_every_kth_latest_and_what_is_read)
{
    hf_config c = small_config();
    drafter_model *m = drafter_model_create(&c, 5);
    size_t n = drafter_numel(m);
    float *mm = calloc(n, sizeof(float)), *vv = calloc(n, sizeof(float));
    char *dir = tmp_dir(), root[256], p[512];
    errbuf err = {{0}};
    snprintf(root, sizeof root, "%s/ckpt", dir);
    for (uint64_t k = 2; k <= 12; k += 2) {
        checkpoint_state cs = {.step = k, .batches_committed = 2 * k, .seed = 9};
        REQUIRE(checkpoint_write(root, &c, drafter_weights(m), mm, vv, n, &cs, &err) == 0);
    }
    /* a reader holds step 4 as checkpoint_read does */
    checkpoint_dir(root, 4, p, sizeof p);
    int fd = open(p, O_RDONLY | O_DIRECTORY);
    REQUIRE(fd >= 0 && flock(fd, LOCK_SH) == 0);
    checkpoint_retention keep = {.keep_checkpoints = 2, .keep_every = 6};
    checkpoint_disk disk;
    REQUIRE(checkpoint_prune(root, &keep, 12, &disk, &err) == 0);
    /* kept: 12, 10 (newest two), 6, 12 (every 6th), 4 (held); removed: 2, 8 */
    EXPECT(checkpoint_exists(root, 12) && checkpoint_exists(root, 10) && checkpoint_exists(root, 6));
    EXPECT(checkpoint_exists(root, 4) && !checkpoint_exists(root, 2) && !checkpoint_exists(root, 8));
    EXPECT(disk.kept == 4 && disk.removed == 2 && disk.busy == 1 && disk.bytes > 0);
    close(fd);
    REQUIRE(checkpoint_prune(root, &keep, 12, &disk, &err) == 0);
    EXPECT(!checkpoint_exists(root, 4) && disk.removed == 1 && disk.busy == 0 && disk.kept == 3);
    /* latest is never removed, even where the retention would not keep it (a resume from an older step) */
    keep = (checkpoint_retention){.keep_checkpoints = 1};
    REQUIRE(checkpoint_prune(root, &keep, 6, &disk, &err) == 0);
    EXPECT(checkpoint_exists(root, 12) && checkpoint_exists(root, 6) && !checkpoint_exists(root, 10));
    /* all kept when keep_checkpoints is 0; what is read afterwards is latest's */
    keep = (checkpoint_retention){0};
    REQUIRE(checkpoint_prune(root, &keep, 12, &disk, &err) == 0);
    EXPECT(disk.kept == 2 && disk.removed == 0);
    checkpoint_state got;
    float *w2 = malloc(sizeof(float) * n), *m2 = malloc(sizeof(float) * n), *v2 = malloc(sizeof(float) * n);
    REQUIRE(checkpoint_read(root, NULL, w2, m2, v2, n, &got, &err) == 0);
    EXPECT(got.step == 12 && got.batches_committed == 24);
    /* an unreadable root is an error naming it */
    EXPECT(checkpoint_prune("/nonexistent/ckpt", &keep, 1, &disk, &err) != 0);
    EXPECT_CONTAINS(err.msg, "/nonexistent/ckpt");
    free(w2); free(m2); free(v2); free(mm); free(vv);
    drafter_model_destroy(&m);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    REQUIRE(system(cmd) == 0);
}

TEST(bad_checkpoints_get_clear_errors)
{
    hf_config c = small_config();
    drafter_model *m = drafter_model_create(&c, 5);
    char *dir = tmp_dir(), path[256];
    errbuf err = {{0}};
    snprintf(path, sizeof path, "%s/d", dir);
    REQUIRE(drafter_model_save(m, path, ST_F32, &err) == 0);
    /* config disagreeing with the target: hidden size, vocab */
    hf_config target = c;
    target.is_dflash = 0;
    target.hidden_size = 16;
    drafter_model *x = NULL;
    EXPECT(drafter_model_load(&x, path, &target, &err) != 0);
    EXPECT_CONTAINS(err.msg, "hidden_size");
    EXPECT_CONTAINS(err.msg, path);
    target.hidden_size = 12;
    target.vocab_size = 50;
    EXPECT(drafter_model_load(&x, path, &target, &err) != 0);
    EXPECT_CONTAINS(err.msg, "vocab_size");
    /* a missing tensor, then a tensor of the wrong shape */
    st_write_tensor t[64];
    int nt = 0;
    for (int i = 0; i < drafter_param_count(m); i++) {
        const drafter_param *p = drafter_param_at(m, i);
        if (!strcmp(p->name, "layers.1.mlp.up_proj.weight")) continue;
        t[nt++] = (st_write_tensor){.name = p->name, .dtype = ST_F32, .ndim = p->ndim,
                                    .shape = {p->shape[0], p->shape[1]}, .data = drafter_weights(m) + p->offset};
    }
    snprintf(path, sizeof path, "%s/d/model.safetensors", dir);
    REQUIRE(st_write(path, t, nt, NULL, &err) == 0);
    snprintf(path, sizeof path, "%s/d", dir);
    EXPECT(drafter_model_load(&x, path, NULL, &err) != 0);
    EXPECT_CONTAINS(err.msg, "layers.1.mlp.up_proj.weight");
    EXPECT_CONTAINS(err.msg, "model.safetensors");
    const drafter_param *up = drafter_param_find(m, "layers.1.mlp.up_proj.weight");
    t[nt++] = (st_write_tensor){.name = up->name, .dtype = ST_F32, .ndim = 2, .shape = {up->shape[1], up->shape[0]},
                                .data = drafter_weights(m) + up->offset};
    snprintf(path, sizeof path, "%s/d/model.safetensors", dir);
    REQUIRE(st_write(path, t, nt, NULL, &err) == 0);
    snprintf(path, sizeof path, "%s/d", dir);
    EXPECT(drafter_model_load(&x, path, NULL, &err) != 0);
    EXPECT_CONTAINS(err.msg, "up_proj");
    EXPECT_CONTAINS(err.msg, "shape");
    drafter_model_destroy(&m);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    REQUIRE(system(cmd) == 0);
}

TEST(target_checkpoint_missing_tensor_names_file_and_tensor)
{
    const char *goldens = test_goldens();
    char src[512], dir[64], path[600];
    snprintf(src, sizeof src, "%s/tiny/target", goldens);
    snprintf(dir, sizeof dir, "%s", tmp_dir());
    errbuf err = {{0}};
    st_file *st = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    REQUIRE(st_open(&st, path, &err) == 0);
    /* copy every tensor but one layer's k_norm into a new checkpoint */
    int n = st_count(st), nt = 0;
    st_write_tensor *t = calloc((size_t)n, sizeof *t);
    float **bufs = calloc((size_t)n, sizeof *bufs);
    for (int i = 0; i < n; i++) {
        const st_tensor *x = st_at(st, i);
        if (!strcmp(x->name, "model.layers.2.self_attn.k_norm.weight")) continue;
        size_t cnt;
        REQUIRE(st_load_f32(st, x->name, &bufs[i], -1, NULL, &cnt, &err) == 0);
        t[nt] = (st_write_tensor){.name = x->name, .dtype = ST_F32, .ndim = x->ndim, .data = bufs[i]};
        memcpy(t[nt].shape, x->shape, sizeof x->shape);
        nt++;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    REQUIRE(st_write(path, t, nt, NULL, &err) == 0);
    snprintf(path, sizeof path, "cp %s/config.json %s/", src, dir);
    REQUIRE(system(path) == 0);
    target_model *tm = NULL;
    EXPECT(target_model_load(&tm, dir, 1, &err) == 0);      /* layers 0..1 need nothing missing */
    target_model_destroy(&tm);
    EXPECT(target_model_load(&tm, dir, -1, &err) != 0);
    EXPECT_CONTAINS(err.msg, "model.layers.2.self_attn.k_norm.weight");
    EXPECT_CONTAINS(err.msg, dir);
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    free(t);
    st_close(&st);
    snprintf(path, sizeof path, "rm -rf %s", dir);
    REQUIRE(system(path) == 0);
}

TEST_MAIN
