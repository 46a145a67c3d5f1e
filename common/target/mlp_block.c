/* mlp_block: the dense SwiGLU MLP sub-layer on the CPU (mlp_block.h). */
#include <stdio.h>
#include <stdlib.h>

#include "mlp_block.h"
#include "moe_block.h"

int mlp_block_load(mlp_block *b, const st_file *st, const hf_config *c, const char *prefix, int i, errbuf *err)
{
    const int64_t H = c->hidden_size, I = c->intermediate_size;
    const struct {
        float **dst;
        const char *proj;
        int64_t d0, d1;
    } t[] = {{&b->w_gate, "gate_proj", I, H}, {&b->w_up, "up_proj", I, H}, {&b->w_down, "down_proj", H, I}};
    for (size_t j = 0; j < sizeof t / sizeof t[0]; j++) {
        char n[192];
        int64_t shape[2] = {t[j].d0, t[j].d1};
        snprintf(n, sizeof n, "%slayers.%d.mlp.%s.weight", prefix, i, t[j].proj);
        int rc = st_load_f32(st, n, t[j].dst, 2, shape, NULL, err);
        if (rc) return rc;
    }
    return 0;
}

void mlp_block_free(mlp_block *b)
{
    XFREE(b->w_gate);
    XFREE(b->w_up);
    XFREE(b->w_down);
}

void mlp_acts_reserve(mlp_acts *a, const hf_config *c, int T)
{
    if (T <= a->rows) return;
    const size_t n = (size_t)T * (size_t)c->intermediate_size;
    free(a->gate);
    free(a->up);
    a->gate = xmalloc(n * sizeof(float));
    a->up = xmalloc(n * sizeof(float));
    a->rows = T;
}

void mlp_acts_free(mlp_acts *a)
{
    free(a->gate);
    free(a->up);
    *a = (mlp_acts){0};
}

void mlp_block_forward_cpu(const mlp_block *b, const hf_config *c, mlp_acts *a, float *x, const float *u, int T)
{
    moe_swiglu_mlp_cpu(x, u, T, c->hidden_size, c->intermediate_size, b->w_gate, b->w_up, b->w_down, a->gate, a->up);
}
