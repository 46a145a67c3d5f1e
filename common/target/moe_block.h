/* moe_block: the sparse MoE MLP block on the CPU (fp32), shared by the target families that have one (hybrid:
 * Qwen3.5-MoE, Qwen3-Next; qwen3_moe; gpt_oss, whose biases and clamped SwiGLU are options of the block and whose
 * loader is its family's): softmax router (fp32), top-k (renormalised when norm_topk_prob), SwiGLU
 * experts of moe_intermediate_size weighted by their routing weight, and the shared expert scaled by
 * sigmoid(shared_expert_gate · u) when shared_expert_intermediate_size > 0; following transformers'
 * modeling_qwen3_5_moe.py, modeling_qwen3_next.py and modeling_qwen3_moe.py. A block owns its weights; the scratch
 * is the caller's (one call at a time per scratch). Errors name the checkpoint tensor. */
#ifndef DFLASH_MOE_BLOCK_H
#define DFLASH_MOE_BLOCK_H

#include <stddef.h>
#include <stdint.h>

#include "hf_config.h"
#include "safetensors.h"
#include "util.h"

typedef struct moe_block {
    float *router;                          /* (E, H) */
    float *e_gate_up;                       /* (E, 2*Im, H): rows [0, Im) gate, [Im, 2Im) up */
    float *e_down;                          /* (E, H, Im) */
    float *s_gate, *s_up, *s_down;          /* shared expert (Is, H) x2, (H, Is); NULL when Is = 0 */
    float *s_gate_w;                        /* (1, H) */
    /* gpt_oss's biases (NULL: none): the router's (E), the experts' gate|up (E, 2*Im) in e_gate_up's row order and
     * down (E, H) */
    float *router_b, *e_gate_up_b, *e_down_b;
} moe_block;

/* Working memory of moe_block_forward_cpu, grown on demand; zero-initialised is empty. */
typedef struct moe_scratch {
    size_t cap[6];
    float *buf[6];
    int *idx;                               /* (T*k) token ids per expert */
    float *wts;                             /* (T*k) their weights */
    int32_t *sel;                           /* (T, k) the router's choice */
    float *selw;                            /* (T, k) its weights */
    size_t idx_cap;
} moe_scratch;

/* The MoE block of layer `layer` of c from st, under "<prefix>layers.<layer>.mlp.": the router (gate.weight), the
 * experts as transformers' fused experts.gate_up_proj / experts.down_proj or per expert
 * (experts.<e>.{gate,up,down}_proj.weight), and the shared expert when c has one. On failure b holds what was
 * loaded (moe_block_free frees it). */
int moe_block_load(moe_block *b, const st_file *st, const hf_config *c, const char *prefix, int layer, errbuf *err);
void moe_block_free(moe_block *b);
/* x (T, H) += the block applied to u (T, H) (the post-attention-normed rows). The biases b has are added (router
 * logits, gate|up, down before the routing weight); c->swiglu_limit > 0 makes the experts' activation gpt-oss's
 * clamped SwiGLU (swiglu_clamped_forward_cpu with c->swiglu_alpha). */
void moe_block_forward_cpu(const moe_block *b, const hf_config *c, moe_scratch *s, float *x, const float *u, int T);
void moe_scratch_free(moe_scratch *s);

/* x (n, H) += SwiGLU MLP of u (n, H): down (H, I) · (silu(gate (I, H) · u) * (up (I, H) · u)); g and up are (n, I)
 * scratch. The experts' form, and the dense MLP of the families' layers without experts. */
void moe_swiglu_mlp_cpu(float *x, const float *u, int n, int H, int I, const float *wg, const float *wu,
                        const float *wd, float *g, float *up);

#endif
