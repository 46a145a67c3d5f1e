#include "drafter_layout.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "rng.h"
#include "util.h"

static const char *layer_param_names[LP_COUNT] = {
    "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
    "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
    "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};

static void add_param(drafter_layout *L, const char *name, int64_t d0, int64_t d1)
{
    drafter_param *p = &L->params[L->nparams++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = d1 > 0 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1 > 0 ? d1 : 0;
    p->numel = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1);
    p->offset = L->numel;
    p->decay = p->ndim >= 2;
    L->numel += p->numel;
}

void drafter_layout_init(drafter_layout *L, const hf_config *cfg)
{
    memset(L, 0, sizeof *L);
    const int64_t H = cfg->hidden_size, hd = cfg->head_dim, qd = (int64_t)cfg->num_heads * hd;
    const int64_t kd = (int64_t)cfg->num_kv_heads * hd, I = cfg->intermediate_size;
    L->params = xcalloc((size_t)(DRAFTER_PARAM_LAYER0 + LP_COUNT * cfg->num_layers), sizeof *L->params);
    add_param(L, "fc.weight", H, (int64_t)cfg->num_taps * H);
    add_param(L, "hidden_norm.weight", H, 0);
    add_param(L, "norm.weight", H, 0);
    for (int l = 0; l < cfg->num_layers; l++) {
        const int64_t shapes[LP_COUNT][2] = {{H, 0},  {H, 0},  {qd, H}, {kd, H}, {kd, H}, {H, qd},
                                             {hd, 0}, {hd, 0}, {I, H},  {I, H},  {H, I}};
        for (int j = 0; j < LP_COUNT; j++) {
            char name[96];
            snprintf(name, sizeof name, "layers.%d.%s", l, layer_param_names[j]);
            add_param(L, name, shapes[j][0], shapes[j][1]);
        }
    }
}

void drafter_layout_destroy(drafter_layout *L)
{
    XFREE(L->params);
    L->nparams = 0;
    L->numel = 0;
}

size_t drafter_layout_numel(const hf_config *cfg)
{
    drafter_layout L;
    drafter_layout_init(&L, cfg);
    size_t n = L.numel;
    drafter_layout_destroy(&L);
    return n;
}

const drafter_param *drafter_layout_layer(const drafter_layout *L, int l, int j)
{
    return &L->params[DRAFTER_PARAM_LAYER0 + l * LP_COUNT + j];
}

const drafter_param *drafter_layout_find(const drafter_layout *L, const char *name)
{
    for (int i = 0; i < L->nparams; i++)
        if (!strcmp(L->params[i].name, name)) return &L->params[i];
    return NULL;
}

/* Tensors are independent random streams (seeded by their index), so they are filled in parallel with the same
 * values as one thread would give. */
typedef struct init_job {
    const drafter_layout *L;
    float *w;
    uint64_t seed;
    _Atomic int next;
} init_job;

static void *init_worker(void *arg)
{
    init_job *j = arg;
    for (int i; (i = atomic_fetch_add(&j->next, 1)) < j->L->nparams;) {
        const drafter_param *p = &j->L->params[i];
        float *x = j->w + p->offset;
        rng r;
        rng_seed(&r, j->seed, 0x5eed, (uint64_t)i, 0);
        for (size_t k = 0; k < p->numel; k++) x[k] = p->ndim >= 2 ? (float)(0.02 * rng_normal(&r)) : 1.0f;
    }
    return NULL;
}

void drafter_layout_init_weights(const drafter_layout *L, float *w, uint64_t seed)
{
    init_job j = {.L = L, .w = w, .seed = seed};
    atomic_init(&j.next, 0);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int n = L->numel < ((size_t)1 << 22) ? 1 : (int)(ncpu < 1 ? 1 : ncpu > 32 ? 32 : ncpu);
    pthread_t th[32];
    int started = 0;
    for (int t = 1; t < n; t++)
        if (pthread_create(&th[started], NULL, init_worker, &j) == 0) started++;
    init_worker(&j);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
}
