/* moe_block_cuda: the sparse MoE block of a CUDA target family, for any family whose MLP is one (the hybrid
 * Qwen3.5-MoE / Qwen3-Next today; qwen3_moe takes it as is: softmax router, norm_topk_prob, no shared expert).
 * Contract:
 *  - moe_cuda_shape says what varies: E experts, top K, expert width Im, an optional shared expert (Is > 0) with an
 *    optional sigmoid gate (shared_gate: one more router row), whether the top-K weights are renormalised.
 *  - moe_cuda_layer holds one layer's device weights; the family allocates, loads (HF names under the layer's
 *    "mlp." prefix: gate, experts.gate_up_proj / down_proj or experts.N.{gate,up,down}_proj, shared_expert.*,
 *    shared_expert_gate) and randomises them here, and frees them with moe_cuda_layer_free.
 *  - moe_cuda holds the workspaces for max_tokens rows, one per target (the layers run one after another on the
 *    target's stream).
 *  - moe_cuda_forward: dst = resid + Σ_k w_k · expert_k(u) + [sigmoid(gate ·u)] · shared(u), enqueued on m->stream
 *    with no host synchronisation (CUDA-graph safe): router GEMM (fp32 logits), softmax + top-K, the rows grouped by
 *    expert and the tile schedule on the device (moe_group), the gate|up GEMM of every expert and of the shared
 *    expert in one launch with SwiGLU in its epilogue, the down GEMM likewise (moe_gemm), and the weighted gather
 *    into the residual (moe_combine). Deterministic.
 * Allocation through target_cuda_alloc (counted in the target's device bytes); CUDA failures exit via CHECK_CUDA;
 * a load error returns -errno with the tensor named in err. Not thread-safe: one caller per target. */
#ifndef DFLASH_MOE_BLOCK_CUDA_H
#define DFLASH_MOE_BLOCK_CUDA_H

#include <stdint.h>

#include "hf_config.h"
#include "safetensors.h"
#include "target_model_cuda_impl.h"
#include "util.h"

typedef struct moe_cuda_shape {
    int H, E, K, Im, Is;  /* hidden, experts, picks per token, expert width, shared-expert width (0: none) */
    int shared_gate;      /* the shared expert's output is scaled by sigmoid(shared_expert_gate · u) */
    int norm_topk;        /* top-K weights divided by their sum */
    int bias;             /* gpt_oss: router and experts have biases (moe_cuda_layer's *_b) */
    float alpha, limit;   /* limit > 0: gpt_oss's clamped SwiGLU (moe_gemm_opts) */
} moe_cuda_shape;

typedef struct moe_cuda_layer {
    uint16_t *router;       /* (E + shared_gate, H): router rows, then the shared expert's gate row (then zero rows) */
    uint16_t *e_gu, *e_down; /* (E, 2 Im, H): per expert Im gate rows then Im up rows; (E, H, Im) */
    uint16_t *s_gu, *s_down; /* (2 Is, H), (H, Is); NULL when Is = 0 */
    float *router_b, *e_gu_b, *e_down_b; /* with bias: fp32 (E), (E, 2 Im) as e_gu's rows, (E, H); else NULL */
} moe_cuda_layer;

typedef struct moe_cuda moe_cuda;

/* The shape of a config's MoE layers: shared expert gated when it has one; gpt_oss's biases and clamped SwiGLU. */
moe_cuda_shape moe_cuda_shape_of(const hf_config *c);
/* Refuses a shape the kernels do not take (naming it): 0 or -EINVAL. */
int moe_cuda_check(const moe_cuda_shape *s, errbuf *err);
/* Workspaces for max_tokens rows. */
moe_cuda *moe_cuda_create(target_cuda *m, const moe_cuda_shape *s, int max_tokens);
void moe_cuda_destroy(moe_cuda **b);
/* Device weights of one layer (uninitialised). */
void moe_cuda_layer_alloc(target_cuda *m, const moe_cuda_shape *s, moe_cuda_layer *l);
void moe_cuda_layer_free(moe_cuda_layer *l);
/* Upload one layer's weights from st, names under prefix (e.g. "model.layers.3.mlp."), as the Qwen families name
 * them (gpt_oss's family uploads its own: gptoss_experts.h). */
int moe_cuda_layer_load(const moe_cuda_shape *s, moe_cuda_layer *l, const st_file *st, const char *prefix,
                        errbuf *err);
/* Random weights from *seed (advanced), uniform with half-width a, on m->stream. */
void moe_cuda_layer_init_random(target_cuda *m, const moe_cuda_shape *s, moe_cuda_layer *l, uint64_t *seed, float a);
/* dst (T, H; ldd) = resid (ldr; may be dst) + the block over u (T, H; ldu); T <= max_tokens. Profiling marks go to
 * m's classes (the GEMMs to TARGET_CUDA_MATMUL, the rest to TARGET_CUDA_OTHER). */
void moe_cuda_forward(target_cuda *m, moe_cuda *b, const moe_cuda_layer *l, int T, const uint16_t *u, int ldu,
                      const uint16_t *resid, int ldr, uint16_t *dst, int ldd);

#endif
