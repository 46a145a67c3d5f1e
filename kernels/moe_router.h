/* moe_router: the sparse-MoE routing of the hybrid Qwen3.5-MoE / Qwen3-Next targets: per token, softmax over the
 * E router logits in fp32, the K largest probabilities (ties to the lower expert id, in decreasing order), divided
 * by their sum when norm (norm_topk_prob). The same selection as target_hybrid.c's CPU loop. */
#ifndef DFLASH_KERNEL_MOE_ROUTER_H
#define DFLASH_KERNEL_MOE_ROUTER_H

#include <stdint.h>

/* logits (T, E; ldl) fp32 -> sel (T, K) expert ids and selw (T, K) weights. 0 < K <= E. */
void moe_router_topk_cpu(int32_t *sel, float *selw, const float *logits, int ldl, int T, int E, int K, int norm);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA: the same on device arrays (fp32 logits, int32 sel, fp32 selw); E <= 1024. stream is a cudaStream_t. */
void moe_router_topk_cuda(int32_t *sel, float *selw, const float *logits, int ldl, int T, int E, int K, int norm,
                          void *stream);
#ifdef __cplusplus
}
#endif

#endif
