/* target_model: the CPU target's generic part: the family chosen from the config (target_family_of), the frozen
 * tables and final norm under the family's names, RoPE frequencies over the family's rotary dimensions, and the
 * packed forward's loop over the family's layers. No family branch here: what varies is in the family's row. */
#include "target_model.h"
#include "target_model_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embedding.h"
#include "matmul.h"
#include "rmsnorm.h"
#include "rope.h"
#include "safetensors.h"

static int load_tensor(const st_file *st, const char *name, float **out, int64_t d0, int64_t d1, errbuf *err)
{
    int64_t shape[2] = {d0, d1};
    return st_load_f32(st, name, out, d1 > 0 ? 2 : 1, shape, NULL, err);
}

int target_model_load(target_model **out, const char *dir, int max_layer, errbuf *err)
{
    target_model *m = xcalloc(1, sizeof *m);
    st_file *st = NULL;
    int rc = hf_config_load(&m->cfg, dir, err);
    if (rc) goto fail;
    const hf_config *c = &m->cfg;
    if (max_layer >= c->num_layers) {
        rc = errbuf_set(err, EINVAL, "%s: layer %d requested but the model has %d layers", dir, max_layer,
                        c->num_layers);
        goto fail;
    }
    rc = target_family_require(c, TARGET_BACKEND_CPU, TARGET_CAN_FORWARD, "the target forward", &m->fam, err);
    if (rc) goto fail;
    m->full = max_layer < 0;
    m->nlayers = m->full ? c->num_layers : max_layer + 1;
    rc = st_open(&st, dir, err);
    if (rc) goto fail;
    target_tables tb;
    if ((rc = target_tables_find(c, st, &tb, err))) goto fail;
    rc = load_tensor(st, tb.embed, &m->embed, c->vocab_size, c->hidden_size, err);
    if (rc) goto fail;
    if (tb.tied) {
        m->lm_head = m->embed;
    } else {
        rc = load_tensor(st, tb.lm_head, &m->lm_head, c->vocab_size, c->hidden_size, err);
        if (rc) goto fail;
    }
    if (m->full) {
        rc = load_tensor(st, tb.norm, &m->final_norm, c->hidden_size, 0, err);
        if (rc) goto fail;
        for (int i = 0; tb.norm_add != 0.0f && i < c->hidden_size; i++) m->final_norm[i] += tb.norm_add;
    }
    rc = m->fam->cpu->load(m, st, m->fam->prefix(st), err);
    if (rc) goto fail;
    const int rd = m->fam->rope_dims(c);
    m->inv_freq = xmalloc(sizeof(double) * (size_t)(rd / 2));
    rope_params rp = {.theta = c->rope_theta, .llama3 = c->rope_llama3, .factor = c->rope_factor,
                      .low_freq_factor = c->rope_low_freq_factor, .high_freq_factor = c->rope_high_freq_factor,
                      .original_max_position = c->rope_original_max_position, .yarn = c->rope_yarn,
                      .beta_fast = c->rope_beta_fast, .beta_slow = c->rope_beta_slow, .truncate = c->rope_truncate};
    rope_inv_freq(m->inv_freq, rd, &rp);
    /* transformers keeps inv_freq as a float buffer that follows the model's dtype when the model is cast
     * (model.to(torch.bfloat16)): a bf16 checkpoint's reference forward rotates with bf16-rounded frequencies. */
    if (!strcmp(c->torch_dtype, "bfloat16"))
        for (int i = 0; i < rd / 2; i++) m->inv_freq[i] = bf16_to_f32(f32_to_bf16((float)m->inv_freq[i]));
    st_close(&st);
    *out = m;
    return 0;
fail:
    st_close(&st);
    target_model_destroy(&m);
    return rc;
}

void target_model_destroy(target_model **mp)
{
    target_model *m = *mp;
    if (!m) return;
    if (m->fam) m->fam->cpu->destroy(m);
    if (m->lm_head != m->embed) free(m->lm_head);
    free(m->embed);
    free(m->final_norm);
    free(m->inv_freq);
    free(m->x);
    free(m->u);
    free(m);
    *mp = NULL;
}

const hf_config *target_model_config(const target_model *m) { return &m->cfg; }
const float *target_model_embedding(const target_model *m) { return m->embed; }
const float *target_model_lm_head(const target_model *m) { return m->lm_head; }
int target_model_loaded_layers(const target_model *m) { return m->nlayers - 1; }

static void scratch_reserve(target_model *m, int T)
{
    if (T <= m->scratch_tokens) return;
    const size_t n = (size_t)T * (size_t)m->cfg.hidden_size;
    free(m->x);
    free(m->u);
    m->x = xmalloc(n * sizeof(float));
    m->u = xmalloc(n * sizeof(float));
    m->scratch_tokens = T;
}

int target_batch_check(const hf_config *c, const target_batch *b, errbuf *err)
{
    if (b->ntok <= 0 || b->nseq <= 0 || b->cu_seqlens[0] != 0 || b->cu_seqlens[b->nseq] != b->ntok)
        return errbuf_set(err, EINVAL, "batch: cu_seqlens must run from 0 to %d tokens over %d sequences", b->ntok,
                          b->nseq);
    for (int s = 0; s < b->nseq; s++)
        if (b->cu_seqlens[s + 1] < b->cu_seqlens[s])
            return errbuf_set(err, EINVAL, "batch: cu_seqlens decreases at sequence %d", s);
    for (int t = 0; t < b->ntok; t++) {
        if (b->input_ids[t] < 0 || b->input_ids[t] >= c->vocab_size)
            return errbuf_set(err, EINVAL, "batch: token id %d at position %d is outside the vocabulary (%d)",
                              b->input_ids[t], t, c->vocab_size);
    }
    return 0;
}

int target_request_depth(const hf_config *c, int nlayers, int full, const int *taps, int ntaps, int want_output,
                         int *deepest_out, errbuf *err)
{
    int deepest = -1;
    for (int i = 0; i < ntaps; i++) {
        if (taps[i] < 0 || taps[i] >= c->num_layers)
            return errbuf_set(err, EINVAL, "tap %d: layer %d is outside the target's %d layers", i, taps[i],
                              c->num_layers);
        if (taps[i] > deepest) deepest = taps[i];
    }
    if (want_output) {
        if (!full)
            return errbuf_set(err, EINVAL, "last hidden state or logits requested from a target loaded up to layer %d",
                              nlayers - 1);
        deepest = c->num_layers - 1;
    }
    if (deepest >= nlayers)
        return errbuf_set(err, EINVAL, "tap layer %d requested but only layers 0..%d are loaded", deepest,
                          nlayers - 1);
    *deepest_out = deepest;
    return 0;
}

void target_capture_taps_cpu(float *aux, const int *taps, int ntaps, int li, const float *x, int T, int H)
{
    const size_t ld = (size_t)ntaps * (size_t)H;
    for (int i = 0; aux && i < ntaps; i++) {
        if (taps[i] != li) continue;
        for (int t = 0; t < T; t++) memcpy(aux + (size_t)t * ld + (size_t)i * H, x + (size_t)t * H, sizeof(float) * (size_t)H);
    }
}

int target_model_forward(target_model *m, const target_batch *b, const int *taps, int ntaps, float *aux, float *last,
                         float *logits, errbuf *err)
{
    const hf_config *c = &m->cfg;
    int deepest, rc = target_batch_check(c, b, err);
    if (!rc) rc = target_request_depth(c, m->nlayers, m->full, taps, aux ? ntaps : 0, last || logits, &deepest, err);
    if (rc) return rc;
    const int T = b->ntok, H = c->hidden_size;
    const float eps = (float)c->rms_eps;
    scratch_reserve(m, T);

    float *x = m->x;
    embedding_forward_cpu(x, b->input_ids, T, m->embed, c->vocab_size, H);
    for (int li = 0; li <= deepest; li++) {
        m->fam->cpu->layer(m, li, x, b);
        /* CPU capture: the residual stream row goes to its tap column block (the CUDA path writes it from the
         * residual-add kernel itself). A layer may be tapped more than once. */
        target_capture_taps_cpu(aux, taps, ntaps, li, x, T, H);
    }
    if (last) memcpy(last, x, sizeof(float) * (size_t)T * (size_t)H);
    if (logits) {
        rmsnorm_forward_cpu(m->u, H, x, H, m->final_norm, T, H, eps);
        matmul_forward_cpu(logits, c->vocab_size, m->u, H, m->lm_head, T, c->vocab_size, H, 0);
    }
    return 0;
}

void target_default_taps(int num_layers, int k, int *taps)
{
    if (k == 1) {
        taps[0] = num_layers / 2;
        return;
    }
    for (int i = 0; i < k; i++) taps[i] = (int)nearbyint(1.0 + (double)i * (num_layers - 4) / (double)(k - 1));
}
