/* The CUDA drafter backend's whole step against the CPU reference (drafter_forward_backward in fp32, run exactly as
 * drafter_cpu.c runs it: same anchors, same blocks, loss_scale 1). Both see the same numbers: the drafter weights,
 * the taps and the frozen tables are rounded to bf16 once and the reference gets those values in fp32; what differs
 * is the CUDA step's bf16 activations (one rounding per stored tensor, 2^-9 relative) and fp32 summation order.
 * Cases: the golden cases tiny and tiny-bf16 (target, drafter weights, taps and batch of tests/goldens), the
 * sliding-window ones swa-tiny and swa-narrow when present, and mid-size random drafters (GQA 3 with head_dim 64;
 * GQA 4 with head_dim 128; GQA 3 with a sliding layer of window 48) on ~700 tokens in 3 sequences.
 * Per case: loss, weight sum, per-slot totals and correct counts, acceptance, gradient norm, every gradient tensor;
 * then the same step twice must give bitwise-identical gradients. Also block_accept_cuda against its CPU reference.
 * Tolerances (relative to each tensor's own scale, as bf16 compute against fp32 allows):
 *   loss and gradient norm: |Δ| <= 1e-2 relative; weight sum and slot totals: exact (computed on the host);
 *   correct counts per slot: <= 2 + 2% of the slot's total (argmax ties flip under bf16); acceptance sum: the same;
 *   gradient matrices: max_abs_err <= 5e-2 * max|ref| and ‖Δ‖₂ <= 3e-2 * ‖ref‖₂;
 *   norm-weight gradients (sums over every row, with cancellation): 1e-1 * max|ref| and 5e-2 * ‖ref‖₂.
 * Prints "<name> max_abs_err=... tol=... ok|FAIL"; exit status 0 only when everything passed.
 * usage: test_drafter_gpu [GOLDENS_DIR]   (default tests/goldens) */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "anchors.h"
#include "block_accept.h"
#include "cuda_check.h"
#include "drafter_cuda.h"
#include "drafter_layout.h"
#include "drafter_model.h"
#include "hf_config.h"
#include "safetensors.h"
#include "util.h"

static int failures;
static uint64_t rng_state = 0x5851f42d4c957f2dull;

static double rnd_uniform(void) /* [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static void report(const char *name, double err, double tol)
{
    int ok = err <= tol; /* NaN fails */
    printf("%s max_abs_err=%.3e tol=%.3e %s\n", name, err, tol, ok ? "ok" : "FAIL");
    fflush(stdout);
    if (!ok) failures++;
}

static void *dev_upload(const void *src, size_t bytes)
{
    void *d = NULL;
    CHECK_CUDA(cudaMalloc(&d, bytes ? bytes : 16));
    if (bytes) CHECK_CUDA(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* Round to bf16 in place; the bf16 bits into out (may be NULL). */
static void round_bf16(float *x, size_t n, uint16_t *out)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t b = f32_to_bf16(x[i]);
        x[i] = bf16_to_f32(b);
        if (out) out[i] = b;
    }
}

/* One step's inputs, the same for both backends. */
typedef struct step_case {
    char name[64];
    hf_config cfg;                    /* the drafter */
    char target_dir[4096];            /* frozen tables for the CUDA backend */
    float *w;                         /* (numel) bf16-rounded weights */
    float *embed, *lm_head;           /* (V, H) bf16-rounded */
    int T, nseq;
    int32_t *ids, *pos, *cu;
    uint8_t *lmask;
    float *aux;                       /* (T, K*H) bf16-rounded */
    int max_anchors;
    double gamma;
    uint64_t seed, batch_id;
} step_case;

static void step_case_free(step_case *c)
{
    free(c->w), free(c->embed), free(c->lm_head), free(c->ids), free(c->pos), free(c->cu), free(c->lmask);
    free(c->aux);
}

/* Compare one gradient tensor: max abs error against max|ref| and the relative L2 error. */
static void compare_tensor(const char *case_name, const drafter_param *p, const float *got, const float *ref)
{
    double mx = 0, err = 0, e2 = 0, r2 = 0;
    for (size_t i = 0; i < p->numel; i++) {
        double e = fabs((double)got[i] - ref[i]);
        if (isnan(got[i])) e = INFINITY;
        mx = fmax(mx, fabs(ref[i])), err = fmax(err, e);
        e2 += e * e, r2 += (double)ref[i] * ref[i];
    }
    const int vec = p->ndim == 1;
    const double tol_max = (vec ? 1e-1 : 5e-2) * mx, tol_l2 = vec ? 5e-2 : 3e-2;
    const double rel_l2 = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
    char name[320];
    snprintf(name, sizeof name, "%s grad.%s (max|ref| %.3g, rel_l2 %.2e <= %.0e)", case_name, p->name, mx, rel_l2,
             tol_l2);
    report(name, rel_l2 <= tol_l2 ? err : INFINITY, tol_max);
}

static void run_case(const step_case *c)
{
    const hf_config *cfg = &c->cfg;
    drafter_layout L;
    drafter_layout_init(&L, cfg);
    const size_t numel = L.numel;
    const int K = cfg->num_taps, H = cfg->hidden_size, B = cfg->block_size;
    char name[192];

    /* ---- the CPU reference, as drafter_cpu.c ---- */
    int32_t *anchors = NULL, *anchor_seq = NULL;
    int N = anchors_sample(c->cu, c->nseq, c->lmask, c->max_anchors, c->seed, 0, c->batch_id, &anchors, &anchor_seq);
    drafter_blocks blk;
    drafter_blocks_build(&blk, c->ids, c->cu, c->lmask, anchors, anchor_seq, N, B, cfg->mask_token_id, c->gamma);
    drafter_model *view = drafter_model_create_view(cfg);
    float *g_ref = xcalloc(numel, sizeof(float));
    drafter_model_bind(view, c->w, g_ref);
    drafter_frozen fz = {.embed = c->embed, .lm_head = c->lm_head, .vocab = cfg->vocab_size};
    drafter_metrics mr = {0};
    double t0 = now_seconds();
    drafter_forward_backward(view, &fz, c->aux, c->T, c->pos, &blk, 1, 1.0f, &mr, NULL);
    double t_cpu = now_seconds() - t0;
    drafter_model_destroy(&view);
    drafter_blocks_free(&blk);
    free(anchors), free(anchor_seq);

    /* ---- the CUDA backend ---- */
    drafter_train_config tc = {.drafter = cfg, .max_anchors = c->max_anchors, .seed = c->seed, .gamma = c->gamma};
    drafter_backend *be = NULL;
    errbuf err = {{0}};
    if (drafter_cuda_create(&be, &tc, c->target_dir, 0, c->T, c->nseq, &err)) {
        printf("%s create max_abs_err=nan tol=0 FAIL (%s)\n", c->name, err.msg);
        failures++;
        free(g_ref);
        drafter_layout_destroy(&L);
        return;
    }
    uint16_t *wb = xmalloc(numel * 2), *auxb = xmalloc((size_t)c->T * K * H * 2);
    for (size_t i = 0; i < numel; i++) wb[i] = f32_to_bf16(c->w[i]);
    for (size_t i = 0; i < (size_t)c->T * K * H; i++) auxb[i] = f32_to_bf16(c->aux[i]);
    uint16_t *d_w = dev_upload(wb, numel * 2), *d_aux = dev_upload(auxb, (size_t)c->T * K * H * 2);
    float *d_g = NULL;
    CHECK_CUDA(cudaMalloc((void **)&d_g, numel * sizeof(float)));
    /* poisoned (every byte 0xff: NaN): the step must write every element (the ops' contract), so an element it
     * misses shows as NaN in the comparisons below */
    CHECK_CUDA(cudaMemset(d_g, 0xff, numel * sizeof(float)));
    drafter_batch bt = {.id = c->batch_id, .ntok = c->T, .nseq = c->nseq, .aux = d_aux, .input_ids = c->ids,
                        .positions = c->pos, .cu_seqlens = c->cu, .loss_mask = c->lmask};
    drafter_metrics mg;
    t0 = now_seconds();
    int rc = be->ops->forward_backward(be, d_w, d_g, &bt, &mg, &err);
    double t_gpu = now_seconds() - t0;
    if (rc) {
        printf("%s forward_backward max_abs_err=nan tol=0 FAIL (%s)\n", c->name, err.msg);
        failures++;
    }
    float *g = xmalloc(numel * sizeof(float));
    CHECK_CUDA(cudaMemcpy(g, d_g, numel * sizeof(float), cudaMemcpyDeviceToHost));
    printf("# %s: %d tokens, %d sequences, %d anchors x %d, %zu parameters; cpu %.2fs, gpu (first call) %.3fs\n",
           c->name, c->T, c->nseq, N, B, numel, t_cpu, t_gpu);

    /* metrics */
    double loss_r = mr.loss_sum / mr.weight_sum, loss_g = mg.loss_sum / mg.weight_sum;
    snprintf(name, sizeof name, "%s loss (ref %.6f, gpu %.6f; relative)", c->name, loss_r, loss_g);
    report(name, fabs(loss_g - loss_r) / fabs(loss_r), 1e-2);
    snprintf(name, sizeof name, "%s weight_sum (ref %.6f)", c->name, mr.weight_sum);
    report(name, fabs(mg.weight_sum - mr.weight_sum), 0.0);
    long tot_err = labs(mg.nblocks - mr.nblocks), cor_err = 0, cor_tol = 2, cor_sum = 0;
    double worst = -1;
    for (int k = 1; k < B; k++) { /* report the slot whose error is the largest share of its tolerance */
        tot_err += labs(mg.slot_total[k] - mr.slot_total[k]);
        long e = labs(mg.slot_correct[k] - mr.slot_correct[k]), tol = 2 + mr.slot_total[k] / 50;
        cor_sum += mr.slot_correct[k];
        if ((double)e / tol > worst) worst = (double)e / tol, cor_err = e, cor_tol = tol;
    }
    snprintf(name, sizeof name, "%s slot_total+nblocks (%ld blocks)", c->name, mr.nblocks);
    report(name, (double)tot_err, 0.0);
    snprintf(name, sizeof name, "%s slot_correct worst slot (ref %ld correct in all)", c->name, cor_sum);
    report(name, (double)cor_err, (double)cor_tol);
    snprintf(name, sizeof name, "%s accept_sum (ref %.1f, gpu %.1f)", c->name, mr.accept_sum, mg.accept_sum);
    report(name, fabs(mg.accept_sum - mr.accept_sum), 2.0 + 0.02 * mr.nblocks);

    /* gradients */
    double n2r = 0, n2g = 0;
    for (size_t i = 0; i < numel; i++) n2r += (double)g_ref[i] * g_ref[i], n2g += (double)g[i] * g[i];
    snprintf(name, sizeof name, "%s grad_norm (ref %.6g, gpu %.6g; relative)", c->name, sqrt(n2r), sqrt(n2g));
    report(name, fabs(sqrt(n2g) - sqrt(n2r)) / sqrt(n2r), 1e-2);
    for (int i = 0; i < L.nparams; i++)
        compare_tensor(c->name, &L.params[i], g + L.params[i].offset, g_ref + L.params[i].offset);

    /* determinism: the same step again, into a buffer holding other values (zeros), gives the same bits */
    CHECK_CUDA(cudaMemset(d_g, 0, numel * sizeof(float)));
    drafter_metrics mg2;
    rc = be->ops->forward_backward(be, d_w, d_g, &bt, &mg2, &err);
    float *g2 = xmalloc(numel * sizeof(float));
    CHECK_CUDA(cudaMemcpy(g2, d_g, numel * sizeof(float), cudaMemcpyDeviceToHost));
    size_t ndiff = 0;
    for (size_t i = 0; i < numel; i++) ndiff += memcmp(&g[i], &g2[i], 4) != 0;
    int met_same = !memcmp(&mg.loss_sum, &mg2.loss_sum, sizeof mg.loss_sum) && mg.accept_sum == mg2.accept_sum;
    snprintf(name, sizeof name, "%s deterministic (gradient elements that differ between two identical steps; "
             "metrics %s)", c->name, met_same ? "same" : "DIFFER");
    report(name, rc || !met_same ? INFINITY : (double)ndiff, 0.0);

    /* overwriting: a third step into the same buffer (holding the second's gradients) gives the first's bits, not
     * their sum */
    rc = be->ops->forward_backward(be, d_w, d_g, &bt, &mg2, &err);
    CHECK_CUDA(cudaMemcpy(g2, d_g, numel * sizeof(float), cudaMemcpyDeviceToHost));
    ndiff = 0;
    for (size_t i = 0; i < numel; i++) ndiff += memcmp(&g[i], &g2[i], 4) != 0;
    snprintf(name, sizeof name, "%s overwrites (gradient elements of a step into a used buffer that differ from the "
             "first step's)", c->name);
    report(name, rc ? INFINITY : (double)ndiff, 0.0);

    drafter_backend_destroy(&be);
    CHECK_CUDA(cudaFree(d_w));
    CHECK_CUDA(cudaFree(d_aux));
    CHECK_CUDA(cudaFree(d_g));
    free(wb), free(auxb), free(g), free(g2), free(g_ref);
    drafter_layout_destroy(&L);
}

/* The frozen tables of a target checkpoint, bf16-rounded. */
static int load_tables(step_case *c, errbuf *err)
{
    hf_config tcfg;
    st_file *st = NULL;
    int rc = hf_config_load(&tcfg, c->target_dir, err);
    if (!rc) rc = st_open(&st, c->target_dir, err);
    if (rc) return rc;
    const int64_t shape[2] = {tcfg.vocab_size, tcfg.hidden_size};
    size_t n = (size_t)shape[0] * shape[1];
    rc = st_load_f32(st, "model.embed_tokens.weight", &c->embed, 2, shape, NULL, err);
    if (!rc && !tcfg.tie_embeddings) rc = st_load_f32(st, "lm_head.weight", &c->lm_head, 2, shape, NULL, err);
    if (!rc && tcfg.tie_embeddings) {
        c->lm_head = xmalloc(n * sizeof(float));
        memcpy(c->lm_head, c->embed, n * sizeof(float));
    }
    st_close(&st);
    if (rc) return rc;
    round_bf16(c->embed, n, NULL);
    round_bf16(c->lm_head, n, NULL);
    return 0;
}

static int load_ints(const st_file *st, const char *name, int32_t **out, size_t *n, errbuf *err)
{
    return st_load_i32(st, name, out, n, err);
}

/* A golden case (tests/goldens/<name>): target tables, drafter weights, taps and batch. */
static void golden_case(const char *goldens, const char *case_name)
{
    step_case c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "%s", case_name);
    errbuf err = {{0}};
    char path[4096];
    st_file *cs = NULL;
    drafter_model *dm = NULL;
    snprintf(path, sizeof path, "%s/%s/drafter", goldens, case_name);
    int rc = drafter_model_load(&dm, path, NULL, &err);
    snprintf(c.target_dir, sizeof c.target_dir, "%s/%s/target", goldens, case_name);
    if (!rc) rc = load_tables(&c, &err);
    snprintf(path, sizeof path, "%s/%s/case.safetensors", goldens, case_name);
    if (!rc) rc = st_open(&cs, path, &err);
    size_t T = 0, np = 0, ncu = 0, nlm = 0, naux = 0;
    int32_t *lm32 = NULL;
    if (!rc) rc = load_ints(cs, "input_ids", &c.ids, &T, &err);
    if (!rc) rc = load_ints(cs, "position_ids", &c.pos, &np, &err);
    if (!rc) rc = load_ints(cs, "cu_seqlens", &c.cu, &ncu, &err);
    if (!rc) rc = load_ints(cs, "loss_mask", &lm32, &nlm, &err);
    if (!rc) rc = st_load_f32(cs, "target.aux_hidden", &c.aux, -1, NULL, &naux, &err);
    c.gamma = 0;
    if (!rc) {
        json_t *root = json_loads(st_metadata(cs, "json") ? st_metadata(cs, "json") : "", 0, NULL);
        json_t *gm = root ? json_object_get(root, "gamma") : NULL;
        if (json_is_number(gm)) c.gamma = json_number_value(gm);
        if (root) json_decref(root);
        if (c.gamma <= 0) rc = errbuf_set(&err, EINVAL, "%s: metadata json has no gamma", path);
    }
    if (rc) {
        printf("%s load max_abs_err=nan tol=0 FAIL (%s)\n", case_name, err.msg);
        failures++;
        goto out;
    }
    c.cfg = *drafter_model_config(dm);
    c.T = (int)T, c.nseq = (int)ncu - 1;
    DF_ASSERT(np == T && nlm == T && naux == T * (size_t)c.cfg.num_taps * c.cfg.hidden_size);
    c.lmask = xmalloc(T);
    for (size_t t = 0; t < T; t++) c.lmask[t] = lm32[t] != 0;
    size_t numel = drafter_numel(dm);
    c.w = xmalloc(numel * sizeof(float));
    memcpy(c.w, drafter_weights(dm), numel * sizeof(float));
    round_bf16(c.w, numel, NULL);
    round_bf16(c.aux, naux, NULL);
    c.max_anchors = 8, c.seed = 42, c.batch_id = 3;
    run_case(&c);
out:
    free(lm32);
    st_close(&cs);
    drafter_model_destroy(&dm);
    step_case_free(&c);
}

/* Write a Qwen3 "target" holding only what the drafter takes from it: config.json, embedding and lm_head (bf16). */
static int write_target(const char *dir, int H, int V, const float *embed, const float *lm_head, errbuf *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return errbuf_set(err, errno, "%s: %s", path, strerror(errno));
    fprintf(f, "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": %d, "
               "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": %d, "
               "\"intermediate_size\": %d, \"vocab_size\": %d, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, "
               "\"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\"}\n",
            H, H / 4, 2 * H, V);
    fclose(f);
    st_write_tensor t[2] = {
        {.name = "model.embed_tokens.weight", .dtype = ST_BF16, .ndim = 2, .shape = {V, H}, .data = embed},
        {.name = "lm_head.weight", .dtype = ST_BF16, .ndim = 2, .shape = {V, H}, .data = lm_head}};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    return st_write(path, t, 2, NULL, err);
}

/* A random drafter of the given shape on 3 sequences (lengths lens), K = 5 taps, block 16, vocab V; with window > 0
 * its odd layers are sliding_attention layers of that window. */
static void random_case(const char *case_name, int H, int layers, int nh, int nkv, int hd, int I, int V,
                        const int *lens, int max_anchors, int window)
{
    step_case c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "%s", case_name);
    hf_config *cfg = &c.cfg;
    cfg->arch = HF_ARCH_QWEN3;
    snprintf(cfg->model_type, sizeof cfg->model_type, "qwen3");
    cfg->hidden_size = H, cfg->num_layers = layers, cfg->num_heads = nh, cfg->num_kv_heads = nkv, cfg->head_dim = hd;
    cfg->intermediate_size = I, cfg->vocab_size = V, cfg->rms_eps = 1e-6, cfg->rope_theta = 1e6;
    cfg->has_qk_norm = 1, cfg->is_dflash = 1, cfg->block_size = 16, cfg->num_target_layers = 8;
    cfg->mask_token_id = V - 1, cfg->num_taps = 5;
    for (int i = 0; i < 5; i++) cfg->taps[i] = 1 + i;
    snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "bfloat16");
    cfg->sliding_window = window;
    for (int l = 0; l < layers; l++) cfg->layer_sliding[l] = window > 0 && l % 2 == 1;

    /* weights: matrices normal(0, 0.02), norm weights 1 + 0.2u (so their gradients are exercised off 1) */
    drafter_layout L;
    drafter_layout_init(&L, cfg);
    c.w = xmalloc(L.numel * sizeof(float));
    drafter_layout_init_weights(&L, c.w, 1234);
    for (int i = 0; i < L.nparams; i++)
        if (L.params[i].ndim == 1)
            for (size_t j = 0; j < L.params[i].numel; j++) c.w[L.params[i].offset + j] = 1.0f + 0.2f * rnd_uniform();
    round_bf16(c.w, L.numel, NULL);
    drafter_layout_destroy(&L);

    size_t nt = (size_t)V * H;
    c.embed = xmalloc(nt * sizeof(float)), c.lm_head = xmalloc(nt * sizeof(float));
    for (size_t i = 0; i < nt; i++)
        c.embed[i] = (float)(0.05 * rnd_uniform()), c.lm_head[i] = (float)(0.1 * rnd_uniform());
    round_bf16(c.embed, nt, NULL);
    round_bf16(c.lm_head, nt, NULL);
    snprintf(c.target_dir, sizeof c.target_dir, "/tmp/dflash-test-drafter-gpu-XXXXXX");
    errbuf err = {{0}};
    if (!mkdtemp(c.target_dir) || write_target(c.target_dir, H, V, c.embed, c.lm_head, &err)) {
        printf("%s target max_abs_err=nan tol=0 FAIL (%s)\n", case_name, err.msg[0] ? err.msg : strerror(errno));
        failures++;
        step_case_free(&c);
        return;
    }

    c.nseq = 3;
    c.cu = xmalloc(4 * sizeof(int32_t));
    c.cu[0] = 0;
    for (int s = 0; s < 3; s++) c.cu[s + 1] = c.cu[s] + lens[s];
    c.T = c.cu[3];
    c.ids = xmalloc((size_t)c.T * sizeof(int32_t)), c.pos = xmalloc((size_t)c.T * sizeof(int32_t));
    c.lmask = xmalloc((size_t)c.T);
    for (int s = 0; s < 3; s++)
        for (int j = 0; j < lens[s]; j++) {
            int t = c.cu[s] + j;
            c.ids[t] = (int32_t)((rnd_uniform() + 1.0) * 0.5 * (V - 1)) % (V - 1);
            c.pos[t] = j;
            /* a prompt (first fifth) and a hole in the response are not trained */
            c.lmask[t] = j >= lens[s] / 5 && !(j >= lens[s] / 2 && j < lens[s] / 2 + 7);
        }
    size_t na = (size_t)c.T * 5 * H;
    c.aux = xmalloc(na * sizeof(float));
    for (size_t i = 0; i < na; i++) c.aux[i] = (float)(2.0 * rnd_uniform());
    round_bf16(c.aux, na, NULL);
    c.max_anchors = max_anchors, c.gamma = 7.0, c.seed = 7, c.batch_id = 11;
    run_case(&c);

    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", c.target_dir), unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", c.target_dir), unlink(path);
    rmdir(c.target_dir);
    step_case_free(&c);
}

static void check_block_accept(int nblocks, int B, int vocab)
{
    size_t n = (size_t)nblocks * B;
    int32_t *am = xmalloc((n + 1) * 4), *lab = xmalloc((n + 1) * 4);
    float *w = xmalloc((n + 1) * 4);
    for (size_t i = 0; i < n; i++) {
        lab[i] = (int32_t)((rnd_uniform() + 1) * 0.5 * vocab) % vocab;
        am[i] = rnd_uniform() < 0.5 ? lab[i] : (int32_t)((rnd_uniform() + 1) * 0.5 * vocab) % vocab;
        w[i] = (i % B) == 0 || rnd_uniform() > 0.8 ? 0.0f : 1.0f;
    }
    int64_t ref[DFLASH_MAX_BLOCK + 1], got[DFLASH_MAX_BLOCK + 1];
    block_accept_cpu(ref, &ref[B], am, lab, w, nblocks, B);
    int32_t *d_am = dev_upload(am, n * 4), *d_lab = dev_upload(lab, n * 4);
    float *d_w = dev_upload(w, n * 4);
    int64_t *d_out = NULL;
    CHECK_CUDA(cudaMalloc((void **)&d_out, sizeof got));
    block_accept_cuda(d_out, d_am, d_lab, d_w, nblocks, B, NULL);
    CHECK_CUDA(cudaMemcpy(got, d_out, (size_t)(B + 1) * 8, cudaMemcpyDeviceToHost));
    double e = 0;
    for (int k = 0; k <= B; k++) e = fmax(e, fabs((double)(got[k] - ref[k])));
    char name[128];
    snprintf(name, sizeof name, "block_accept_cuda nblocks=%d B=%d (run sum %lld)", nblocks, B, (long long)ref[B]);
    report(name, e, 0.0);
    CHECK_CUDA(cudaFree(d_am));
    CHECK_CUDA(cudaFree(d_lab));
    CHECK_CUDA(cudaFree(d_w));
    CHECK_CUDA(cudaFree(d_out));
    free(am), free(lab), free(w);
}

int main(int argc, char **argv)
{
    const char *goldens = argc > 1 ? argv[1] : "tests/goldens";
    CHECK_CUDA(cudaSetDevice(0));
    check_block_accept(1000, 16, 3);
    check_block_accept(3, 4, 2);
    check_block_accept(517, 64, 2);
    check_block_accept(0, 16, 2);
    struct stat sb;
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/tiny/case.safetensors", goldens);
    if (stat(probe, &sb) != 0) {
        printf("goldens %s max_abs_err=nan tol=0 FAIL (no %s)\n", goldens, probe);
        failures++;
    } else {
        golden_case(goldens, "tiny");
        golden_case(goldens, "tiny-bf16");
    }
    static const char *const swa[] = {"swa-tiny", "swa-narrow"}; /* sliding-window layers (make_swa_golden.py) */
    for (int i = 0; i < 2; i++) {
        snprintf(probe, sizeof probe, "%s/%s/case.safetensors", goldens, swa[i]);
        if (stat(probe, &sb) == 0) golden_case(goldens, swa[i]);
        else printf("%s load max_abs_err=nan tol=0 FAIL (no %s)\n", swa[i], probe), failures++;
    }
    static const int lens[3] = {250, 211, 239};
    random_case("mid-gqa3-hd64", 512, 2, 6, 2, 64, 1024, 5000, lens, 48, 0);
    random_case("mid-gqa4-hd128", 512, 2, 8, 2, 128, 1024, 5000, lens, 48, 0);
    random_case("mid-gqa3-hd64-w48", 512, 2, 6, 2, 64, 1024, 5000, lens, 48, 48);
    printf("test_drafter_gpu: %d failed\n", failures);
    return failures ? 1 : 0;
}
