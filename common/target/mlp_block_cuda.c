/* mlp_block_cuda: the dense SwiGLU MLP sub-layer on CUDA (contract in mlp_block_cuda.h). */
#include <stdio.h>

#include "mlp_block_cuda.h"
#include "rand_fill.h"

void mlp_cuda_layer_alloc(target_cuda *m, mlp_cuda_layer *l)
{
    const size_t H = (size_t)m->cfg.hidden_size, I = (size_t)m->cfg.intermediate_size;
    l->w_gu = target_cuda_alloc(m, 2 * I * H * 2);
    l->w_down = target_cuda_alloc(m, H * I * 2);
}

void mlp_cuda_layer_free(mlp_cuda_layer *l)
{
    target_cuda_free(&l->w_gu);
    target_cuda_free(&l->w_down);
}

int mlp_cuda_layer_load(target_cuda *m, mlp_cuda_layer *l, const st_file *st, const char *prefix, int layer,
                        errbuf *err)
{
    const int64_t H = m->cfg.hidden_size, I = m->cfg.intermediate_size;
    struct { uint16_t *dst; const char *suffix; int64_t rows, cols; } t[] = {
        {l->w_gu, "gate_proj", I, H}, {l->w_gu + I * H, "up_proj", I, H}, {l->w_down, "down_proj", H, I}};
    char n[192];
    for (size_t j = 0; j < sizeof t / sizeof t[0]; j++) {
        snprintf(n, sizeof n, "%slayers.%d.mlp.%s.weight", prefix, layer, t[j].suffix);
        int rc = target_cuda_upload_tensor(st, n, t[j].dst, t[j].rows, t[j].cols, err);
        if (rc) return rc;
    }
    return 0;
}

void mlp_cuda_layer_init_random(target_cuda *m, mlp_cuda_layer *l, uint64_t *seed, float a)
{
    const size_t H = (size_t)m->cfg.hidden_size, I = (size_t)m->cfg.intermediate_size;
    rand_fill_bf16_cuda(l->w_gu, 2 * I * H, (*seed)++, a, 0.0f, m->stream);
    rand_fill_bf16_cuda(l->w_down, H * I, (*seed)++, a, 0.0f, m->stream);
}

void mlp_cuda_alloc(target_cuda *m, mlp_cuda *w)
{
    const size_t I = (size_t)m->cfg.intermediate_size, t = (size_t)m->max_tokens;
    w->gu = target_cuda_alloc(m, t * 2 * I * 2);
    w->act = target_cuda_alloc(m, t * I * 2);
}

void mlp_cuda_free(mlp_cuda *w)
{
    target_cuda_free(&w->gu);
    target_cuda_free(&w->act);
}

void mlp_cuda_forward(target_cuda *m, const mlp_cuda *w, const mlp_cuda_layer *l, const uint16_t *post_norm, int T,
                      uint16_t *dst, int ldd)
{
    const hf_config *c = &m->cfg;
    const int H = c->hidden_size, I = c->intermediate_size;
    target_cuda_norm_linear_swiglu(m, w->act, I, w->gu, m->u, m->x, H, post_norm, (float)c->rms_eps, l->w_gu, T, I,
                                   H);
    target_cuda_linear(m, dst, ldd, m->x, H, 1.0f, w->act, I, l->w_down, T, H, I);
    target_cuda_mark(m, TARGET_CUDA_MATMUL);
}
