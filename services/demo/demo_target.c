#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "demo.h"
#include "rng.h"

/* Init scales. Tables N(0, 1) keep logits peaked, so greedy decoding is well defined; norm weights are 1.
 * Projections are N(0, (gain^2)/fan_in). Measured on the default shape (96 prompts, answers of 48, two target
 * seeds): gain 1.0 gives answers that fall into short loops (mean distinct-token ratio 0.53, ~15% of next tokens
 * repeat the previous one); gain 1.5 gives ratio ~0.75, ~5% repeats, almost no answer ending in a loop of period
 * <= 4, and a next token that the previous token alone predicts only ~25% of the time; gain 2.0 is closer to
 * noise (ratio ~0.84). 1.5 keeps the continuation a context-dependent but structured function. */
#define DEMO_TABLE_STD 1.0
#define DEMO_PROJ_GAIN 1.5

/* Per-tensor stream keys, so that changing one tensor's shape leaves the others' values alone. */
enum demo_kind { K_EMBED = 1, K_LM_HEAD, K_Q, K_K, K_V, K_O, K_GATE, K_UP, K_DOWN,
                 K_IN_NORM, K_POST_NORM, K_Q_NORM, K_K_NORM, K_FINAL_NORM };

#define DEMO_ROPE_THETA 1e6

void demo_target_defaults(demo_target_opts *o)
{
    *o = (demo_target_opts){.kind = DEMO_TARGET_RANDOM, .period = 8, .seed = 0, .hidden = 64, .layers = 8, .heads = 4, .kv_heads = 2, .head_dim = 16,
                            .intermediate = 160, .vocab = 512, .dtype = ST_F32};
}

static int mkdir_p(const char *dir, errbuf *err)
{
    char *p = xstrdup(dir);
    int rc = 0;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s) continue;
        char c = *s;
        *s = 0;
        if (mkdir(p, 0755) && errno != EEXIST) {
            rc = errbuf_set(err, errno, "%s: cannot create folder: %s", p, strerror(errno));
            break;
        }
        *s = c;
        if (!c) break;
    }
    struct stat sb;
    if (!rc && (stat(dir, &sb) || !S_ISDIR(sb.st_mode)))
        rc = errbuf_set(err, ENOTDIR, "%s: not a folder", dir);
    free(p);
    return rc;
}

/* config.json as transformers (4.5x) writes it for Qwen3ForCausalLM; sorted keys, indent 2. */
static int write_config(const char *dir, const demo_target_opts *o, errbuf *err)
{
    json_t *lt = json_array();
    for (int i = 0; i < o->layers; i++) json_array_append_new(lt, json_string("full_attention"));
    json_t *root = json_object();
    json_object_set_new(root, "architectures", json_pack("[s]", "Qwen3ForCausalLM"));
    json_object_set_new(root, "attention_bias", json_false());
    json_object_set_new(root, "attention_dropout", json_real(0.0));
    json_object_set_new(root, "bos_token_id", json_null());
    json_object_set_new(root, "eos_token_id", json_null());
    json_object_set_new(root, "head_dim", json_integer(o->head_dim));
    json_object_set_new(root, "hidden_act", json_string("silu"));
    json_object_set_new(root, "hidden_size", json_integer(o->hidden));
    json_object_set_new(root, "initializer_range", json_real(0.02));
    json_object_set_new(root, "intermediate_size", json_integer(o->intermediate));
    json_object_set_new(root, "layer_types", lt);
    json_object_set_new(root, "max_position_embeddings", json_integer(4096));
    json_object_set_new(root, "max_window_layers", json_integer(o->layers));
    json_object_set_new(root, "model_type", json_string("qwen3"));
    json_object_set_new(root, "num_attention_heads", json_integer(o->heads));
    json_object_set_new(root, "num_hidden_layers", json_integer(o->layers));
    json_object_set_new(root, "num_key_value_heads", json_integer(o->kv_heads));
    json_object_set_new(root, "pad_token_id", json_null());
    json_object_set_new(root, "rms_norm_eps", json_real(1e-6));
    json_object_set_new(root, "rope_scaling", json_null());
    json_object_set_new(root, "rope_theta", json_real(DEMO_ROPE_THETA));
    json_object_set_new(root, "sliding_window", json_null());
    json_object_set_new(root, "tie_word_embeddings", json_false());
    json_object_set_new(root, "torch_dtype", json_string(o->dtype == ST_BF16 ? "bfloat16" : "float32"));
    json_object_set_new(root, "transformers_version", json_string("4.51.0"));
    json_object_set_new(root, "use_cache", json_true());
    json_object_set_new(root, "use_sliding_window", json_false());
    json_object_set_new(root, "vocab_size", json_integer(o->vocab));

    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = 0;
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(10));
    json_decref(root);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        rc = errbuf_set(err, errno, "%s: cannot create: %s", tmp, strerror(errno));
        goto done;
    }
    int bad = fputs(text, f) < 0 || fputc('\n', f) == EOF || fflush(f) || fsync(fileno(f));
    int saved = errno;
    if (fclose(f)) bad = 1, saved = errno;
    if (bad) {
        rc = errbuf_set(err, saved ? saved : EIO, "%s: write failed: %s", tmp, strerror(saved));
        unlink(tmp);
        goto done;
    }
    if (rename(tmp, path)) {
        rc = errbuf_set(err, errno, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
    }
done:
    free(text);
    return rc;
}

static float *fill_normal(size_t n, double std, uint64_t seed, int layer, enum demo_kind kind)
{
    float *w = xmalloc(n * sizeof *w);
    rng r;
    rng_seed(&r, seed, (uint64_t)(layer + 1), (uint64_t)kind, 0);
    for (size_t i = 0; i < n; i++) w[i] = (float)(std * rng_normal(&r));
    return w;
}

static float *fill_const(size_t n, float v)
{
    float *w = xmalloc(n * sizeof *w);
    for (size_t i = 0; i < n; i++) w[i] = v;
    return w;
}

/* ---- kind "random": every tensor drawn as the init scales above say ---- */

static float *random_tensor(const demo_target_opts *o, const void *ctx, enum demo_kind kind, int layer, int64_t rows,
                            int64_t cols)
{
    (void)ctx;
    size_t n = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    switch (kind) {
    case K_EMBED:
    case K_LM_HEAD: return fill_normal(n, DEMO_TABLE_STD, o->seed, -1, kind);
    case K_Q: case K_K: case K_V: case K_O: case K_GATE: case K_UP: case K_DOWN:
        return fill_normal(n, DEMO_PROJ_GAIN / sqrt((double)cols), o->seed, layer, kind);
    default: return fill_const(n, 1.0f); /* norms */
    }
}

/* ---- kind "repeat": constructed weights whose greedy continuation is the token `period` positions back ----
 * The residual stream has three parts: C "code" dims [0, C) holding the current token's code (a distinct ±1
 * pattern per id, drawn from the seed), one constant dim C, and C "next" dims [C+1, 2C+1) that layer 0's attention
 * fills with the code of the token period-1 positions back. Layer 0's queries and keys read only the constant dim,
 * so the attention is positional: after q/k norm and RoPE a score is A * sum_i cos(w_i (d - (period-1))) at
 * distance d, which peaks at d = period-1; A is set so that the nearest other distance scores >= DEMO_REPEAT_MARGIN
 * lower (the softmax puts all but e^-margin of the weight there). Values copy the code dims, o_proj writes them to
 * the next dims, and lm_head scores each id by its code against the next dims. Every other projection is zero: the
 * other layers and all MLPs pass the residual through. The mask token (the last id) has no code and no lm_head row. */
#define DEMO_REPEAT_MARGIN 30.0
#define DEMO_REPEAT_TOP_LOGIT 10.0
#define DEMO_REPEAT_MAX_POS 4096 /* max_position_embeddings: the margin holds at every distance below it */

typedef struct repeat_plan {
    int C;           /* code dims */
    uint64_t *code;  /* (vocab): bit i set = +1 in code dim i; distinct for every id but the mask */
    double qk_gain;  /* q_norm and k_norm weight */
} repeat_plan;

static int repeat_code_dims(const demo_target_opts *o)
{
    int c = o->kv_heads * o->head_dim, half = (o->hidden - 1) / 2;
    if (c > half) c = half;
    return c > 64 ? 64 : c;
}

static int repeat_check(const demo_target_opts *o, errbuf *err)
{
    int C = repeat_code_dims(o), need = 2;
    while (need < 62 && ((uint64_t)1 << (need - 2)) < (uint64_t)o->vocab) need++;
    if (C < need)
        return errbuf_set(err, EINVAL,
                          "--kind repeat: min(--kv-heads x --head-dim, (--hidden - 1) / 2) = %d code dims, but "
                          "--vocab %d needs at least %d",
                          C, o->vocab, need);
    if (o->period < 1 || o->period > 1024)
        return errbuf_set(err, EINVAL, "--period %d: must be in [1, 1024]", o->period);
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Distinct random codes for ids [0, vocab-1) (redrawn until no two are equal), the q/k gain for the margin. */
static void repeat_plan_make(repeat_plan *p, const demo_target_opts *o)
{
    const int C = repeat_code_dims(o), V = o->vocab;
    const uint64_t mask = C == 64 ? ~(uint64_t)0 : (((uint64_t)1 << C) - 1);
    p->C = C;
    p->code = xcalloc((size_t)V, sizeof *p->code);
    uint64_t *sorted = xmalloc((size_t)V * sizeof *sorted);
    rng r;
    rng_seed(&r, o->seed, 0, K_EMBED, 1);
    for (int i = 0; i < V - 1; i++) p->code[i] = rng_next(&r) & mask;
    for (;;) {
        memcpy(sorted, p->code, (size_t)(V - 1) * sizeof *sorted);
        qsort(sorted, (size_t)(V - 1), sizeof *sorted, cmp_u64);
        int dup = 0;
        for (int i = 0; i < V - 1; i++) { /* redraw every id whose code another id also has */
            void *hit = bsearch(&p->code[i], sorted, (size_t)(V - 1), sizeof *sorted, cmp_u64);
            uint64_t *h = hit;
            int twice = (h > sorted && h[-1] == p->code[i]) || (h + 1 < sorted + V - 1 && h[1] == p->code[i]);
            if (twice) p->code[i] = rng_next(&r) & mask, dup = 1;
        }
        if (!dup) break;
    }
    free(sorted);
    /* the smallest drop of sum_i cos(w_i * delta) from its peak over the distances a query can see */
    const int half = o->head_dim / 2, D = o->period - 1;
    double margin = INFINITY;
    for (int d = 0; d < DEMO_REPEAT_MAX_POS; d++) {
        if (d == D) continue;
        double s = 0;
        for (int i = 0; i < half; i++)
            s += 1.0 - cos((double)(d - D) / pow(DEMO_ROPE_THETA, 2.0 * i / o->head_dim));
        if (s < margin) margin = s;
    }
    /* q and k after their norms: magnitude sqrt(2) * gain in each rotary plane, so a score is
     * 2 gain^2 / sqrt(head_dim) * sum_i cos(...) */
    p->qk_gain = sqrt(DEMO_REPEAT_MARGIN * sqrt((double)o->head_dim) / (2.0 * margin));
}

static float *repeat_tensor(const demo_target_opts *o, const void *ctx, enum demo_kind kind, int layer, int64_t rows,
                            int64_t cols)
{
    const repeat_plan *p = ctx;
    const int C = p->C, H = o->hidden, hd = o->head_dim, half = hd / 2, V = o->vocab;
    const int group = o->heads / o->kv_heads, D = o->period - 1;
    const double rms0 = sqrt(2.0 * C / H);     /* RMS of an embedding row: C entries of 1 and one of sqrt(C) */
    const double rms_out = sqrt(3.0 * C / H);  /* after layer 0 adds C next entries of 1 */
    size_t n = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    float *w = fill_const(n, 0.0f);
    if (kind == K_IN_NORM || kind == K_POST_NORM || kind == K_FINAL_NORM) {
        for (size_t i = 0; i < n; i++) w[i] = 1.0f;
    } else if (kind == K_Q_NORM || kind == K_K_NORM) {
        for (size_t i = 0; i < n; i++) w[i] = layer == 0 ? (float)p->qk_gain : 1.0f;
    } else if (kind == K_EMBED) {
        for (int v = 0; v < V; v++) {
            for (int i = 0; i < C && v < V - 1; i++) w[(size_t)v * H + i] = (p->code[v] >> i & 1) ? 1.0f : -1.0f;
            w[(size_t)v * H + C] = (float)sqrt((double)C);
        }
    } else if (kind == K_LM_HEAD) {
        double beta = DEMO_REPEAT_TOP_LOGIT * rms_out / C;
        for (int v = 0; v < V - 1; v++)
            for (int i = 0; i < C; i++) w[(size_t)v * H + C + 1 + i] = (float)((p->code[v] >> i & 1) ? beta : -beta);
    } else if (layer == 0 && (kind == K_Q || kind == K_K)) {
        /* one unit vector per rotary plane, read from the constant dim; the queries' turned back by D positions */
        int nheads = kind == K_Q ? o->heads : o->kv_heads;
        for (int h = 0; h < nheads; h++)
            for (int i = 0; i < half; i++) {
                double ang = kind == K_Q ? -(double)D / pow(DEMO_ROPE_THETA, 2.0 * i / hd) : 0.0;
                w[(size_t)(h * hd + i) * H + C] = (float)cos(ang);
                w[(size_t)(h * hd + i + half) * H + C] = (float)sin(ang);
            }
    } else if (layer == 0 && kind == K_V) {
        for (int i = 0; i < C; i++) w[(size_t)i * H + i] = 1.0f; /* kv head i / hd, dim i % hd: code dim i */
    } else if (layer == 0 && kind == K_O) {
        /* the first query head of each kv group writes its head's value to the next dims, undoing the input norm */
        int qd = o->heads * hd;
        for (int i = 0; i < C; i++) {
            int g = i / hd, j = i % hd;
            w[(size_t)(C + 1 + i) * qd + (size_t)(g * group * hd + j)] = (float)rms0;
        }
    }
    return w;
}

/* The kinds of target make-target writes: a row each. */
typedef float *(*demo_tensor_fn)(const demo_target_opts *o, const void *ctx, enum demo_kind kind, int layer,
                                 int64_t rows, int64_t cols);
static const struct demo_target_kind_row {
    const char *name;
    int (*check)(const demo_target_opts *o, errbuf *err); /* NULL: any shape */
    demo_tensor_fn tensor;
} demo_target_kinds[] = {
    [DEMO_TARGET_RANDOM] = {"random", NULL, random_tensor},
    [DEMO_TARGET_REPEAT] = {"repeat", repeat_check, repeat_tensor},
};

int demo_target_kind_parse(const char *name)
{
    for (size_t i = 0; i < sizeof demo_target_kinds / sizeof demo_target_kinds[0]; i++)
        if (!strcmp(name, demo_target_kinds[i].name)) return (int)i;
    return -1;
}

const char *demo_target_kind_name(enum demo_target_kind kind)
{
    return demo_target_kinds[kind].name;
}

int demo_target_check(const demo_target_opts *o, errbuf *err)
{
    struct { const char *flag; int v, lo, hi; } f[] = {
        {"--hidden", o->hidden, 1, 65536},       {"--layers", o->layers, 1, 1024},
        {"--heads", o->heads, 1, 1024},          {"--kv-heads", o->kv_heads, 1, 1024},
        {"--head-dim", o->head_dim, 2, 4096},    {"--intermediate", o->intermediate, 1, 1 << 20},
        {"--vocab", o->vocab, 2, 1 << 24},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].v < f[i].lo || f[i].v > f[i].hi)
            return errbuf_set(err, EINVAL, "%s %d: must be in [%d, %d]", f[i].flag, f[i].v, f[i].lo, f[i].hi);
    if (o->head_dim % 2)
        return errbuf_set(err, EINVAL, "--head-dim %d: must be even (rotary embedding)", o->head_dim);
    if (o->heads % o->kv_heads)
        return errbuf_set(err, EINVAL, "--kv-heads %d: must divide --heads %d", o->kv_heads, o->heads);
    if (o->dtype != ST_F32 && o->dtype != ST_BF16)
        return errbuf_set(err, EINVAL, "--dtype: only f32 and bf16 are supported");
    if ((int)o->kind < 0 || o->kind >= sizeof demo_target_kinds / sizeof demo_target_kinds[0])
        return errbuf_set(err, EINVAL, "--kind: unknown kind %d", (int)o->kind);
    if (demo_target_kinds[o->kind].check) return demo_target_kinds[o->kind].check(o, err);
    return 0;
}

int demo_target_write(const char *outdir, const demo_target_opts *o, errbuf *err)
{
    int rc = demo_target_check(o, err);
    if (rc) return rc;
    if ((rc = mkdir_p(outdir, err))) return rc;

    const int64_t H = o->hidden, V = o->vocab, hd = o->head_dim, I = o->intermediate;
    const int64_t qd = (int64_t)o->heads * hd, kd = (int64_t)o->kv_heads * hd;
    const int per_layer = 11, n = 3 + per_layer * o->layers;
    demo_tensor_fn fill = demo_target_kinds[o->kind].tensor;
    repeat_plan plan = {0};
    if (o->kind == DEMO_TARGET_REPEAT) repeat_plan_make(&plan, o);
    st_write_tensor *t = xcalloc((size_t)n, sizeof *t);
    char **names = xcalloc((size_t)n, sizeof *names);
    int k = 0;
#define ADD(layer, kind, d0, d1, ...)                                                                      \
    do {                                                                                                    \
        char nm[160];                                                                                       \
        snprintf(nm, sizeof nm, __VA_ARGS__);                                                               \
        names[k] = xstrdup(nm);                                                                             \
        t[k] = (st_write_tensor){.name = names[k], .dtype = o->dtype, .ndim = (d1) > 0 ? 2 : 1,              \
                                 .shape = {(d0), (d1)}, .data = fill(o, &plan, kind, layer, d0, d1)};       \
        k++;                                                                                                \
    } while (0)
#define LAYER(kind, d0, d1, suffix) ADD(i, kind, d0, d1, "model.layers.%d." suffix, i)

    ADD(-1, K_EMBED, V, H, "model.embed_tokens.weight");
    for (int i = 0; i < o->layers; i++) {
        LAYER(K_IN_NORM, H, 0, "input_layernorm.weight");
        LAYER(K_Q, qd, H, "self_attn.q_proj.weight");
        LAYER(K_K, kd, H, "self_attn.k_proj.weight");
        LAYER(K_V, kd, H, "self_attn.v_proj.weight");
        LAYER(K_O, H, qd, "self_attn.o_proj.weight");
        LAYER(K_Q_NORM, hd, 0, "self_attn.q_norm.weight");
        LAYER(K_K_NORM, hd, 0, "self_attn.k_norm.weight");
        LAYER(K_POST_NORM, H, 0, "post_attention_layernorm.weight");
        LAYER(K_GATE, I, H, "mlp.gate_proj.weight");
        LAYER(K_UP, I, H, "mlp.up_proj.weight");
        LAYER(K_DOWN, H, I, "mlp.down_proj.weight");
    }
    ADD(-1, K_FINAL_NORM, H, 0, "model.norm.weight");
    ADD(-1, K_LM_HEAD, V, H, "lm_head.weight");
#undef LAYER
#undef ADD
    DF_ASSERT(k == n);

    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", outdir);
    rc = st_write(path, t, n, "{\"format\": \"pt\"}", err);
    if (!rc) rc = write_config(outdir, o, err);
    for (int i = 0; i < n; i++) {
        free((void *)t[i].data);
        free(names[i]);
    }
    free(t);
    free(names);
    free(plan.code);
    return rc;
}
