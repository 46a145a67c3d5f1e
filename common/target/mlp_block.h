/* mlp_block: the dense SwiGLU MLP sub-layer on the CPU (fp32), shared by the families whose layers have one (dense:
 * every layer; qwen3_moe and the hybrid family: the layers hf_config's layer_moe leaves dense; the hybrid family runs
 * it on its own scratch through moe_swiglu_mlp_cpu): x += down_proj(silu(gate_proj(u)) ⊙
 * up_proj(u)) over intermediate_size, following transformers' Qwen3MLP / LlamaMLP. A block owns its weights; the
 * activations are the caller's (one call at a time per mlp_acts). Errors name the checkpoint tensor. */
#ifndef DFLASH_MLP_BLOCK_H
#define DFLASH_MLP_BLOCK_H

#include "hf_config.h"
#include "safetensors.h"
#include "util.h"

typedef struct mlp_block {
    float *w_gate, *w_up, *w_down;       /* (I, H) x2, (H, I) */
} mlp_block;

/* The gate and up activations of T rows, grown on demand; zero-initialised is empty. */
typedef struct mlp_acts {
    float *gate, *up;                    /* (rows, I) */
    int rows;
} mlp_acts;

/* Layer i's <prefix>layers.<i>.mlp.{gate,up,down}_proj.weight. */
int mlp_block_load(mlp_block *b, const st_file *st, const hf_config *c, const char *prefix, int i, errbuf *err);
void mlp_block_free(mlp_block *b);
void mlp_acts_reserve(mlp_acts *a, const hf_config *c, int T);
void mlp_acts_free(mlp_acts *a);
/* x (T, H) += the MLP of u (T, H). */
void mlp_block_forward_cpu(const mlp_block *b, const hf_config *c, mlp_acts *a, float *x, const float *u, int T);

#endif
