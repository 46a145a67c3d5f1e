#include "drafter_model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cross_entropy.h"
#include "dflash_attention.h"
#include "embedding.h"
#include "matmul.h"
#include "rmsnorm.h"
#include "rng.h"
#include "rope.h"
#include "swiglu.h"

struct drafter_model {
    hf_config cfg;
    int K;                      /* taps */
    drafter_layout L;
    float *w, *g;               /* bound views (drafter_model_bind) or the owned buffers below */
    float *own_w, *own_g, *adam_m, *adam_v; /* NULL in a view model */
    double *inv_freq;           /* (hd/2) */
};

/* Pointers to one layer's tensors inside a flat buffer (weights or gradients). */
typedef struct layer_view {
    float *in_norm, *post_norm, *wq, *wk, *wv, *wo, *q_norm, *k_norm, *w_gate, *w_up, *w_down;
} layer_view;

static layer_view layer_at(const drafter_model *m, float *base, int l)
{
    const drafter_param *p = drafter_layout_layer(&m->L, l, 0);
    layer_view v = {base + p[LP_IN_NORM].offset, base + p[LP_POST_NORM].offset, base + p[LP_WQ].offset,
                    base + p[LP_WK].offset, base + p[LP_WV].offset, base + p[LP_WO].offset,
                    base + p[LP_Q_NORM].offset, base + p[LP_K_NORM].offset, base + p[LP_GATE].offset,
                    base + p[LP_UP].offset, base + p[LP_DOWN].offset};
    return v;
}

/* The layout and the rope table; buffers only when owned (a view model gets its weights from drafter_model_bind). */
static drafter_model *drafter_alloc(const hf_config *cfg, int owned)
{
    drafter_model *m = xcalloc(1, sizeof *m);
    m->cfg = *cfg;
    m->K = cfg->num_taps;
    drafter_layout_init(&m->L, cfg);
    if (owned) {
        m->w = m->own_w = xcalloc(m->L.numel, sizeof(float));
        m->g = m->own_g = xcalloc(m->L.numel, sizeof(float));
        m->adam_m = xcalloc(m->L.numel, sizeof(float));
        m->adam_v = xcalloc(m->L.numel, sizeof(float));
    }
    const int64_t hd = cfg->head_dim;
    m->inv_freq = xmalloc(sizeof(double) * (size_t)(hd / 2 > 0 ? hd / 2 : 1));
    rope_params rp = {.theta = cfg->rope_theta, .llama3 = cfg->rope_llama3, .factor = cfg->rope_factor,
                      .low_freq_factor = cfg->rope_low_freq_factor, .high_freq_factor = cfg->rope_high_freq_factor,
                      .original_max_position = cfg->rope_original_max_position};
    rope_inv_freq(m->inv_freq, (int)hd, &rp);
    return m;
}

static int check_config(const hf_config *c, const char *where, errbuf *err)
{
    if (!c->is_dflash) return errbuf_set(err, EINVAL, "%s: not a DFlash drafter config (architectures)", where);
    if (c->num_taps < 1) return errbuf_set(err, EINVAL, "%s: dflash_config.target_layer_ids is empty", where);
    if (c->block_size < 2 || c->block_size > DRAFTER_MAX_BLOCK)
        return errbuf_set(err, EINVAL, "%s: block_size %d outside [2, %d]", where, c->block_size, DRAFTER_MAX_BLOCK);
    if (c->num_heads % c->num_kv_heads != 0)
        return errbuf_set(err, EINVAL, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                          where, c->num_heads, c->num_kv_heads);
    if (c->head_dim % 2 != 0) return errbuf_set(err, EINVAL, "%s: head_dim %d is odd", where, c->head_dim);
    return 0;
}

drafter_model *drafter_model_create(const hf_config *cfg, uint64_t seed)
{
    drafter_model *m = drafter_alloc(cfg, 1);
    drafter_layout_init_weights(&m->L, m->w, seed);
    return m;
}

drafter_model *drafter_model_create_view(const hf_config *cfg) { return drafter_alloc(cfg, 0); }

void drafter_model_bind(drafter_model *m, const float *weights, float *grads)
{
    m->w = (float *)weights; /* read only: the forward and backward never write the weights */
    m->g = grads;
}

int drafter_model_load(drafter_model **out, const char *dir, const hf_config *target, errbuf *err)
{
    hf_config cfg;
    st_file *st = NULL;
    drafter_model *m = NULL;
    int rc = hf_config_load(&cfg, dir, err);
    if (rc) return rc;
    if ((rc = check_config(&cfg, dir, err))) return rc;
    if (target) {
        if (cfg.hidden_size != target->hidden_size)
            return errbuf_set(err, EINVAL, "%s/config.json: hidden_size %d disagrees with the target's %d", dir,
                              cfg.hidden_size, target->hidden_size);
        if (cfg.vocab_size != target->vocab_size)
            return errbuf_set(err, EINVAL, "%s/config.json: vocab_size %d disagrees with the target's %d", dir,
                              cfg.vocab_size, target->vocab_size);
        for (int i = 0; i < cfg.num_taps; i++)
            if (cfg.taps[i] < 0 || cfg.taps[i] >= target->num_layers)
                return errbuf_set(err, EINVAL, "%s/config.json: target_layer_ids[%d] = %d outside the target's %d "
                                  "layers", dir, i, cfg.taps[i], target->num_layers);
        if (cfg.mask_token_id < 0 || cfg.mask_token_id >= target->vocab_size)
            return errbuf_set(err, EINVAL, "%s/config.json: mask_token_id %d outside the vocabulary (%d)", dir,
                              cfg.mask_token_id, target->vocab_size);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if ((rc = st_open(&st, path, err))) return rc;
    m = drafter_alloc(&cfg, 1);
    for (int i = 0; i < m->L.nparams; i++) {
        const drafter_param *p = &m->L.params[i];
        rc = st_read_f32(st, p->name, m->w + p->offset, p->ndim, p->shape, err);
        if (rc) goto fail;
    }
    st_close(&st);
    *out = m;
    return 0;
fail:
    st_close(&st);
    drafter_model_destroy(&m);
    return rc;
}

int drafter_model_save(const drafter_model *m, const char *dir, enum st_dtype dtype, errbuf *err)
{
    return drafter_weights_save(&m->cfg, m->w, dir, dtype, err);
}

int drafter_weights_save(const hf_config *drafter, const float *w, const char *dir, enum st_dtype dtype, errbuf *err)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return errbuf_set(err, errno, "%s: %s", dir, strerror(errno));
    drafter_layout L;
    drafter_layout_init(&L, drafter);
    st_write_tensor *t = xcalloc((size_t)L.nparams, sizeof *t);
    for (int i = 0; i < L.nparams; i++) {
        const drafter_param *p = &L.params[i];
        t[i].name = p->name;
        t[i].dtype = dtype;
        t[i].ndim = p->ndim;
        t[i].shape[0] = p->shape[0];
        t[i].shape[1] = p->shape[1];
        t[i].data = w + p->offset;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = st_write(path, t, L.nparams, NULL, err);
    free(t);
    drafter_layout_destroy(&L);
    if (rc) return rc;
    hf_config cfg = *drafter;
    snprintf(cfg.torch_dtype, sizeof cfg.torch_dtype, "%s", dtype == ST_BF16 ? "bfloat16" : "float32");
    snprintf(path, sizeof path, "%s/config.json", dir);
    return hf_config_write_dflash(&cfg, path, err);
}

void drafter_model_destroy(drafter_model **mp)
{
    drafter_model *m = *mp;
    if (!m) return;
    drafter_layout_destroy(&m->L);
    free(m->own_w);
    free(m->own_g);
    free(m->adam_m);
    free(m->adam_v);
    free(m->inv_freq);
    free(m);
    *mp = NULL;
}

const hf_config *drafter_model_config(const drafter_model *m) { return &m->cfg; }
const drafter_layout *drafter_model_layout(const drafter_model *m) { return &m->L; }
int drafter_param_count(const drafter_model *m) { return m->L.nparams; }
const drafter_param *drafter_param_at(const drafter_model *m, int i) { return &m->L.params[i]; }
size_t drafter_numel(const drafter_model *m) { return m->L.numel; }
float *drafter_weights(drafter_model *m) { return m->w; }
float *drafter_grads(drafter_model *m) { return m->g; }
float *drafter_adam_m(drafter_model *m) { return m->adam_m; }
float *drafter_adam_v(drafter_model *m) { return m->adam_v; }
void drafter_grads_zero(drafter_model *m) { memset(m->g, 0, sizeof(float) * m->L.numel); }
const drafter_param *drafter_param_find(const drafter_model *m, const char *name)
{
    return drafter_layout_find(&m->L, name);
}

/* Saved activations of one layer for the backward. Shapes: NB = N*B block rows, T context rows. */
typedef struct layer_acts {
    float *x_in, *u;            /* (NB, H) residual in, input-normed */
    float *q_raw, *q;           /* (NB, qd) before q_norm; after q_norm + rope */
    float *kc_raw, *kc, *vc;    /* (T, kd) context keys before/after k_norm+rope, values */
    float *kb_raw, *kb, *vb;    /* (NB, kd) block keys before/after, values */
    float *attn, *lse;          /* (NB, qd), (NB, nh) */
    float *x_mid, *y;           /* (NB, H) after the attention residual; post-normed */
    float *gate, *up, *act;     /* (NB, I) */
} layer_acts;

static float *fbuf(size_t n) { return xmalloc(sizeof(float) * (n ? n : 1)); }

static void layer_acts_alloc(layer_acts *a, size_t NB, size_t T, const hf_config *c)
{
    size_t H = (size_t)c->hidden_size, qd = (size_t)c->num_heads * (size_t)c->head_dim;
    size_t kd = (size_t)c->num_kv_heads * (size_t)c->head_dim, I = (size_t)c->intermediate_size;
    a->x_in = fbuf(NB * H); a->u = fbuf(NB * H);
    a->q_raw = fbuf(NB * qd); a->q = fbuf(NB * qd);
    a->kc_raw = fbuf(T * kd); a->kc = fbuf(T * kd); a->vc = fbuf(T * kd);
    a->kb_raw = fbuf(NB * kd); a->kb = fbuf(NB * kd); a->vb = fbuf(NB * kd);
    a->attn = fbuf(NB * qd); a->lse = fbuf(NB * (size_t)c->num_heads);
    a->x_mid = fbuf(NB * H); a->y = fbuf(NB * H);
    a->gate = fbuf(NB * I); a->up = fbuf(NB * I); a->act = fbuf(NB * I);
}

static void layer_acts_free(layer_acts *a)
{
    float *p[] = {a->x_in, a->u, a->q_raw, a->q, a->kc_raw, a->kc, a->vc, a->kb_raw, a->kb, a->vb,
                  a->attn, a->lse, a->x_mid, a->y, a->gate, a->up, a->act};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

/* Rows per chunk of the loss head: (CE_CHUNK, V) logits exist at a time. */
#define CE_CHUNK 256

void drafter_forward_backward(drafter_model *m, const drafter_frozen *fz, const float *aux, int ntok,
                              const int32_t *positions, const drafter_blocks *blk, int backward, float loss_scale,
                              drafter_metrics *metrics, drafter_outputs *out)
{
    const hf_config *c = &m->cfg;
    const int H = c->hidden_size, hd = c->head_dim, nh = c->num_heads, nkv = c->num_kv_heads, I = c->intermediate_size;
    const int qd = nh * hd, kd = nkv * hd, K = m->K, L = c->num_layers, B = blk->block_size, V = fz->vocab;
    const int N = blk->nblocks, NB = N * B, T = ntok;
    const float eps = (float)c->rms_eps;
    const dflash_attn_shape as = {.nblocks = N, .block_size = B, .nh = nh, .nkv = nkv, .hd = hd,
                                  .scale = 1.0f / sqrtf((float)hd)};
    DF_ASSERT(B == c->block_size && V == c->vocab_size);
    const float *fc = m->w + m->L.params[DRAFTER_PARAM_FC].offset, *hn = m->w + m->L.params[DRAFTER_PARAM_HIDDEN_NORM].offset;
    const float *fnorm = m->w + m->L.params[DRAFTER_PARAM_NORM].offset;

    /* context: F = hidden_norm(aux · fcᵀ), shared by every layer */
    float *fc_out = fbuf((size_t)T * H), *F = fbuf((size_t)T * H);
    matmul_forward_cpu(fc_out, H, aux, K * H, fc, T, H, K * H, 0);
    rmsnorm_forward_cpu(F, H, fc_out, H, hn, T, H, eps);
    if (out && out->context) memcpy(out->context, F, sizeof(float) * (size_t)T * H);

    layer_acts *acts = xcalloc((size_t)(L > 0 ? L : 1), sizeof *acts);
    float *x = fbuf((size_t)NB * H);
    embedding_forward_cpu(x, blk->block_ids, NB, fz->embed, V, H);
    for (int l = 0; l < L; l++) {
        layer_acts *a = &acts[l];
        layer_view w = layer_at(m, m->w, l);
        layer_acts_alloc(a, (size_t)NB, (size_t)T, c);
        memcpy(a->x_in, x, sizeof(float) * (size_t)NB * H);
        rmsnorm_forward_cpu(a->u, H, x, H, w.in_norm, NB, H, eps);
        matmul_forward_cpu(a->q_raw, qd, a->u, H, w.wq, NB, qd, H, 0);
        rmsnorm_forward_cpu(a->q, hd, a->q_raw, hd, w.q_norm, NB * nh, hd, eps);
        rope_apply_cpu(a->q, qd, NB, nh, hd, blk->block_pos, m->inv_freq, 0);
        /* the same W_k, W_v and k_norm for context rows (from F) and block rows (from u) */
        matmul_forward_cpu(a->kc_raw, kd, F, H, w.wk, T, kd, H, 0);
        matmul_forward_cpu(a->vc, kd, F, H, w.wv, T, kd, H, 0);
        rmsnorm_forward_cpu(a->kc, hd, a->kc_raw, hd, w.k_norm, T * nkv, hd, eps);
        rope_apply_cpu(a->kc, kd, T, nkv, hd, positions, m->inv_freq, 0);
        matmul_forward_cpu(a->kb_raw, kd, a->u, H, w.wk, NB, kd, H, 0);
        matmul_forward_cpu(a->vb, kd, a->u, H, w.wv, NB, kd, H, 0);
        rmsnorm_forward_cpu(a->kb, hd, a->kb_raw, hd, w.k_norm, NB * nkv, hd, eps);
        rope_apply_cpu(a->kb, kd, NB, nkv, hd, blk->block_pos, m->inv_freq, 0);
        dflash_attn_shape las = as;
        las.window = hf_layer_window(c, l);
        dflash_attention_forward_cpu(a->attn, a->lse, a->q, a->kc, a->vc, a->kb, a->vb, blk->ctx_start, blk->ctx_len,
                                     &las);
        matmul_forward_cpu(x, H, a->attn, qd, w.wo, NB, H, qd, 1);
        memcpy(a->x_mid, x, sizeof(float) * (size_t)NB * H);
        rmsnorm_forward_cpu(a->y, H, x, H, w.post_norm, NB, H, eps);
        matmul_forward_cpu(a->gate, I, a->y, H, w.w_gate, NB, I, H, 0);
        matmul_forward_cpu(a->up, I, a->y, H, w.w_up, NB, I, H, 0);
        swiglu_forward_cpu(a->act, a->gate, a->up, (size_t)NB * I);
        matmul_forward_cpu(x, H, a->act, I, w.w_down, NB, H, I, 1);
    }
    float *h = fbuf((size_t)NB * H);
    rmsnorm_forward_cpu(h, H, x, H, fnorm, NB, H, eps);
    if (out && out->final_hidden) memcpy(out->final_hidden, h, sizeof(float) * (size_t)NB * H);
    if (out && out->logits) matmul_forward_cpu(out->logits, V, h, H, fz->lm_head, NB, V, H, 0);

    /* loss head in chunks of rows: only (CE_CHUNK, V) logits at a time */
    float *ce = fbuf((size_t)NB), *dh = backward ? fbuf((size_t)NB * H) : NULL;
    int32_t *argmax = xmalloc(sizeof(int32_t) * (size_t)(NB ? NB : 1));
    float *ws = fbuf((size_t)CE_CHUNK * V);
    for (int r0 = 0; r0 < NB; r0 += CE_CHUNK) {
        int n = NB - r0 < CE_CHUNK ? NB - r0 : CE_CHUNK;
        cross_entropy_chunk_cpu(ce + r0, argmax + r0, dh ? dh + (size_t)r0 * H : NULL, h + (size_t)r0 * H, n, H,
                                fz->lm_head, V, blk->labels + r0, blk->weights + r0, loss_scale, ws);
    }
    free(ws);
    if (out && out->slot_ce) memcpy(out->slot_ce, ce, sizeof(float) * (size_t)NB);
    if (metrics) {
        for (int j = 0; j < N; j++) {
            int run = 0, running = 1;
            for (int k = 1; k < B; k++) {
                int q = j * B + k;
                int valid = blk->weights[q] != 0.0f, correct = valid && argmax[q] == blk->labels[q];
                if (valid) {
                    metrics->loss_sum += (double)blk->weights[q] * ce[q];
                    metrics->weight_sum += blk->weights[q];
                    metrics->slot_total[k]++;
                    metrics->slot_correct[k] += correct;
                }
                if (running && correct) run++;
                else running = 0;
            }
            metrics->accept_sum += 1.0 + run;
            metrics->nblocks++;
        }
    }
    free(ce);
    free(argmax);

    if (backward) {
        float *dx = fbuf((size_t)NB * H), *dF = xcalloc((size_t)T * H, sizeof(float));
        float *d1 = fbuf((size_t)NB * (qd > I ? (qd > H ? qd : H) : (I > H ? I : H)));
        float *dgate = fbuf((size_t)NB * I), *dup = fbuf((size_t)NB * I), *dy = fbuf((size_t)NB * H);
        float *dq = fbuf((size_t)NB * qd), *dq_raw = fbuf((size_t)NB * qd);
        float *dkc = fbuf((size_t)T * kd), *dvc = fbuf((size_t)T * kd), *dkc_raw = fbuf((size_t)T * kd);
        float *dkb = fbuf((size_t)NB * kd), *dvb = fbuf((size_t)NB * kd), *dkb_raw = fbuf((size_t)NB * kd);
        float *du = fbuf((size_t)NB * H);
        rmsnorm_backward_cpu(dx, H, 0, m->g + m->L.params[DRAFTER_PARAM_NORM].offset, dh, H, x, H, fnorm, NB, H, eps);
        for (int l = L - 1; l >= 0; l--) {
            layer_acts *a = &acts[l];
            layer_view w = layer_at(m, m->w, l), g = layer_at(m, m->g, l);
            /* MLP: x_out = x_mid + act · W_downᵀ */
            matmul_backward_cpu(d1, I, 0, g.w_down, dx, H, a->act, I, w.w_down, NB, H, I);
            swiglu_backward_cpu(dgate, dup, d1, a->gate, a->up, (size_t)NB * I);
            matmul_backward_cpu(dy, H, 0, g.w_gate, dgate, I, a->y, H, w.w_gate, NB, I, H);
            matmul_backward_cpu(dy, H, 1, g.w_up, dup, I, a->y, H, w.w_up, NB, I, H);
            rmsnorm_backward_cpu(dx, H, 1, g.post_norm, dy, H, a->x_mid, H, w.post_norm, NB, H, eps);
            /* attention: x_mid = x_in + attn · W_oᵀ */
            matmul_backward_cpu(d1, qd, 0, g.wo, dx, H, a->attn, qd, w.wo, NB, H, qd);
            memset(dkc, 0, sizeof(float) * (size_t)T * kd);
            memset(dvc, 0, sizeof(float) * (size_t)T * kd);
            memset(dkb, 0, sizeof(float) * (size_t)NB * kd);
            memset(dvb, 0, sizeof(float) * (size_t)NB * kd);
            dflash_attn_shape las = as;
            las.window = hf_layer_window(c, l);
            dflash_attention_backward_cpu(dq, dkc, dvc, dkb, dvb, d1, a->attn, a->lse, a->q, a->kc, a->vc, a->kb,
                                          a->vb, blk->ctx_start, blk->ctx_len, &las);
            /* rope is a rotation: its backward is the inverse rotation */
            rope_apply_cpu(dq, qd, NB, nh, hd, blk->block_pos, m->inv_freq, 1);
            rope_apply_cpu(dkc, kd, T, nkv, hd, positions, m->inv_freq, 1);
            rope_apply_cpu(dkb, kd, NB, nkv, hd, blk->block_pos, m->inv_freq, 1);
            rmsnorm_backward_cpu(dq_raw, hd, 0, g.q_norm, dq, hd, a->q_raw, hd, w.q_norm, NB * nh, hd, eps);
            rmsnorm_backward_cpu(dkc_raw, hd, 0, g.k_norm, dkc, hd, a->kc_raw, hd, w.k_norm, T * nkv, hd, eps);
            rmsnorm_backward_cpu(dkb_raw, hd, 0, g.k_norm, dkb, hd, a->kb_raw, hd, w.k_norm, NB * nkv, hd, eps);
            /* projections: q, kb, vb from u; kc, vc from F */
            matmul_backward_cpu(du, H, 0, g.wq, dq_raw, qd, a->u, H, w.wq, NB, qd, H);
            matmul_backward_cpu(du, H, 1, g.wk, dkb_raw, kd, a->u, H, w.wk, NB, kd, H);
            matmul_backward_cpu(du, H, 1, g.wv, dvb, kd, a->u, H, w.wv, NB, kd, H);
            matmul_backward_cpu(dF, H, 1, g.wk, dkc_raw, kd, F, H, w.wk, T, kd, H);
            matmul_backward_cpu(dF, H, 1, g.wv, dvc, kd, F, H, w.wv, T, kd, H);
            rmsnorm_backward_cpu(dx, H, 1, g.in_norm, du, H, a->x_in, H, w.in_norm, NB, H, eps);
        }
        /* context fusion: F = hidden_norm(fc_out), fc_out = aux · fcᵀ; aux and the embedding are frozen */
        float *dfc_out = fbuf((size_t)T * H);
        rmsnorm_backward_cpu(dfc_out, H, 0, m->g + m->L.params[DRAFTER_PARAM_HIDDEN_NORM].offset, dF, H, fc_out, H, hn, T, H,
                             eps);
        matmul_backward_cpu(NULL, 0, 0, m->g + m->L.params[DRAFTER_PARAM_FC].offset, dfc_out, H, aux, K * H, fc, T, H, K * H);
        float *bufs[] = {dfc_out, dx, dF, d1, dgate, dup, dy, dq, dq_raw, dkc, dvc, dkc_raw, dkb, dvb, dkb_raw, du};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    }
    for (int l = 0; l < L; l++) layer_acts_free(&acts[l]);
    free(acts);
    free(dh);
    free(h);
    free(x);
    free(F);
    free(fc_out);
}

double drafter_metrics_acceptance(const drafter_metrics *mt)
{
    return mt->nblocks ? mt->accept_sum / (double)mt->nblocks : NAN;
}

double drafter_metrics_slot_accuracy(const drafter_metrics *mt, int k)
{
    return (k > 0 && k < DRAFTER_MAX_BLOCK && mt->slot_total[k]) ? (double)mt->slot_correct[k] / mt->slot_total[k]
                                                                  : NAN;
}
