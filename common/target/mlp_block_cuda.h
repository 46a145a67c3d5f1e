/* mlp_block_cuda: the dense SwiGLU MLP sub-layer of a decoder layer on CUDA, shared by the dense, qwen3_moe and hybrid
 * families (the CUDA twin of mlp_block.h; qwen3_moe and the hybrid family run it on the layers hf_config's
 * layer_moe leaves dense): dst = x + down_proj(silu(gate_proj(u)) ⊙ up_proj(u)), u = rmsnorm(x; post_norm), x the
 * residual stream after the attention sub-layer (m->x); one gate|up GEMM and SwiGLU (for the few rows of a decoding
 * step one GEMV with the norm and SwiGLU folded in: target_cuda_norm_linear_swiglu), the down_proj GEMM whose
 * epilogue adds x and writes dst (a tap block or the next layer's residual). The norm weight is the caller's (the
 * family's layer owns it: a MoE layer's block reads the same norm). Allocation through target_cuda_alloc in a fixed
 * order (an arena finds the weights where they were); a load error names the tensor; CUDA failures exit via
 * CHECK_CUDA. One caller per target (the layers run one after another on its stream). */
#ifndef DFLASH_MLP_BLOCK_CUDA_H
#define DFLASH_MLP_BLOCK_CUDA_H

#include <stdint.h>

#include "target_model_cuda_impl.h"

typedef struct mlp_cuda_layer {
    uint16_t *w_gu;                   /* (2 I, H): gate_proj | up_proj rows */
    uint16_t *w_down;                 /* (H, I) */
} mlp_cuda_layer;

/* Workspaces for m->max_tokens rows. */
typedef struct mlp_cuda {
    uint16_t *gu, *act;               /* (T, 2 I), (T, I) */
} mlp_cuda;

void mlp_cuda_layer_alloc(target_cuda *m, mlp_cuda_layer *l);
void mlp_cuda_layer_free(mlp_cuda_layer *l);
/* Upload layer `layer`'s mlp.{gate,up,down}_proj.weight from st, names under prefix. */
int mlp_cuda_layer_load(target_cuda *m, mlp_cuda_layer *l, const st_file *st, const char *prefix, int layer,
                        errbuf *err);
/* Random weights from *seed (advanced by two: gate|up, then down), uniform with half-width a. */
void mlp_cuda_layer_init_random(target_cuda *m, mlp_cuda_layer *l, uint64_t *seed, float a);
void mlp_cuda_alloc(target_cuda *m, mlp_cuda *w);
void mlp_cuda_free(mlp_cuda *w);
/* dst (T, H; ldd) = m->x + the MLP of rmsnorm(m->x; post_norm) for T rows (m->u may be overwritten). Marks its
 * kernels' profiling classes. */
void mlp_cuda_forward(target_cuda *m, const mlp_cuda *w, const mlp_cuda_layer *l, const uint16_t *post_norm, int T,
                      uint16_t *dst, int ldd);

#endif
