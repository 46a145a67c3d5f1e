/* gptoss_experts: a gpt_oss layer's experts (HF parameters or MXFP4 blocks + scales) in the MoE blocks' layout. */
#include "gptoss_experts.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mxfp4_dequant(float *out, const uint8_t *blocks, const uint8_t *scales, size_t rows, int groups)
{
    static const float fp4[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    for (size_t r = 0; r < rows; r++)
        for (int g = 0; g < groups; g++) {
            const size_t rg = r * (size_t)groups + (size_t)g;
            const float s = ldexpf(1.0f, (int)scales[rg] - 127);
            const uint8_t *b = blocks + rg * 16;
            float *o = out + rg * 32;
            for (int j = 0; j < 16; j++) {
                o[2 * j] = fp4[b[j] & 15] * s;
                o[2 * j + 1] = fp4[b[j] >> 4] * s;
            }
        }
}

void gptoss_experts_free(gptoss_experts *x)
{
    float **p[] = {&x->gate_up, &x->gate_up_b, &x->down, &x->down_b};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) XFREE(*p[i]);
}

/* A uint8 tensor `name` of shape shape[0..nd). */
static int find_u8(const st_file *st, const char *name, int nd, const int64_t *shape, const uint8_t **out,
                   errbuf *err)
{
    const st_tensor *t = st_find(st, name);
    if (!t)
        return errbuf_set(err, ENOENT, "%s: tensor %s missing (the config's quantization_config is mxfp4)",
                          st_path(st), name);
    int same = t->ndim == nd;
    for (int i = 0; same && i < nd; i++) same = t->shape[i] == shape[i];
    if (t->dtype != ST_U8 || !same) {
        char want[96] = "", have[96] = "";
        for (int i = 0, o = 0; i < nd; i++) o += snprintf(want + o, sizeof want - (size_t)o, i ? ", %lld" : "%lld",
                                                          (long long)shape[i]);
        for (int i = 0, o = 0; i < t->ndim; i++) o += snprintf(have + o, sizeof have - (size_t)o, i ? ", %lld" : "%lld",
                                                               (long long)t->shape[i]);
        return errbuf_set(err, EINVAL, "%s: tensor %s: %s (%s), expected U8 (%s) for MXFP4 experts", st_path(st),
                          name, st_dtype_name(t->dtype), have, want);
    }
    *out = t->data;
    return 0;
}

/* MXFP4 tensor base ("..._proj") of logical shape (E, rows, cols) dequantised into dst. */
static int load_mxfp4(const st_file *st, const char *base, int64_t E, int64_t rows, int64_t cols, float *dst,
                      errbuf *err)
{
    char nb[288], ns[288];
    snprintf(nb, sizeof nb, "%s_blocks", base);
    snprintf(ns, sizeof ns, "%s_scales", base);
    if (cols % 32)
        return errbuf_set(err, EINVAL, "%s: tensor %s: %lld columns, not a multiple of MXFP4's 32-element groups",
                          st_path(st), nb, (long long)cols);
    const int64_t G = cols / 32, sb[4] = {E, rows, G, 16}, ss[3] = {E, rows, G};
    const uint8_t *b, *s;
    int rc = find_u8(st, nb, 4, sb, &b, err);
    if (!rc) rc = find_u8(st, ns, 3, ss, &s, err);
    if (!rc) mxfp4_dequant(dst, b, s, (size_t)(E * rows), (int)G);
    return rc;
}

/* gate_up (E, 2I, cols) with gate/up interleaved in its 2I rows -> gate rows then up rows (in place, per expert). */
static void deinterleave_rows(float *a, int64_t E, int64_t I, int64_t cols, float *tmp)
{
    for (int64_t e = 0; e < E; e++) {
        float *m = a + e * 2 * I * cols;
        memcpy(tmp, m, sizeof(float) * (size_t)(2 * I * cols));
        for (int64_t r = 0; r < 2 * I; r++)
            memcpy(m + ((r & 1) * I + r / 2) * cols, tmp + r * cols, sizeof(float) * (size_t)cols);
    }
}

/* (E, rows, cols) -> (E, cols, rows) */
static float *transpose3(const float *a, int64_t E, int64_t rows, int64_t cols)
{
    float *t = xmalloc(sizeof(float) * (size_t)(E * rows * cols));
    for (int64_t e = 0; e < E; e++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) t[(e * cols + c) * rows + r] = a[(e * rows + r) * cols + c];
    return t;
}

/* An fp32/bf16 tensor in transformers' (E, in = b, out = a) layout, or else (E, a, b) (a != b): into (E, a, b). A
 * square one (gpt-oss's down_proj: I = H) is transformers'. */
static int load_either(const st_file *st, const char *name, int64_t E, int64_t a, int64_t b, float **out, errbuf *err)
{
    const st_tensor *t = st_find(st, name);
    if (t && t->ndim == 3 && t->shape[0] == E && t->shape[1] == b && t->shape[2] == a) {
        const int64_t shape[3] = {E, b, a};
        float *f;
        int rc = st_load_f32(st, name, &f, 3, shape, NULL, err);
        if (rc) return rc;
        *out = transpose3(f, E, b, a);
        free(f);
        return 0;
    }
    const int64_t shape[3] = {E, a, b};
    return st_load_f32(st, name, out, 3, shape, NULL, err);
}

int gptoss_experts_load(gptoss_experts *x, const st_file *st, const hf_config *c, const char *prefix, int layer,
                        errbuf *err)
{
    const int64_t H = c->hidden_size, E = c->num_experts, I = c->moe_intermediate_size;
    char base[256], n[288];
    int rc;
    *x = (gptoss_experts){0};
    snprintf(base, sizeof base, "%slayers.%d.mlp.experts.", prefix, layer);
    if (c->experts_mxfp4) {
        x->gate_up = xmalloc(sizeof(float) * (size_t)(E * 2 * I * H));
        x->down = xmalloc(sizeof(float) * (size_t)(E * H * I));
        snprintf(n, sizeof n, "%sgate_up_proj", base);
        rc = load_mxfp4(st, n, E, 2 * I, H, x->gate_up, err);
        snprintf(n, sizeof n, "%sdown_proj", base);
        if (!rc) rc = load_mxfp4(st, n, E, H, I, x->down, err);
    } else { /* HF: gate_up_proj (E, H, 2I), down_proj (E, I, H) */
        snprintf(n, sizeof n, "%sgate_up_proj", base);
        rc = load_either(st, n, E, 2 * I, H, &x->gate_up, err);
        snprintf(n, sizeof n, "%sdown_proj", base);
        if (!rc) rc = load_either(st, n, E, H, I, &x->down, err);
    }
    if (rc) return rc;
    const int64_t sgb[2] = {E, 2 * I}, sdb[2] = {E, H};
    snprintf(n, sizeof n, "%sgate_up_proj_bias", base);
    rc = st_load_f32(st, n, &x->gate_up_b, 2, sgb, NULL, err);
    snprintf(n, sizeof n, "%sdown_proj_bias", base);
    if (!rc) rc = st_load_f32(st, n, &x->down_b, 2, sdb, NULL, err);
    if (rc) return rc;
    float *tmp = xmalloc(sizeof(float) * (size_t)(2 * I * (H > 1 ? H : 1)));
    deinterleave_rows(x->gate_up, E, I, H, tmp);
    deinterleave_rows(x->gate_up_b, E, I, 1, tmp);
    free(tmp);
    return 0;
}
