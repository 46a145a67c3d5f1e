/* gptoss_experts: the experts of one gpt_oss layer read from its checkpoint into the layout the MoE blocks take
 * (moe_block.h, moe_block_cuda.h: per expert the gate rows then the up rows), fp32 on the host. A checkpoint holds
 * them either as transformers' GptOssExperts parameters (mlp.experts.gate_up_proj (E, H, 2I) with gate and up in
 * interleaved columns, gate_up_proj_bias (E, 2I) likewise, down_proj (E, I, H), down_proj_bias (E, H); bf16 or fp32)
 * or, with quantization_config mxfp4 (hf_config's experts_mxfp4), as the published checkpoints ship them:
 * gate_up_proj_blocks (E, 2I, H/32, 16) and down_proj_blocks (E, H, I/32, 16) uint8, two fp4 (e2m1) codes a byte,
 * low nibble first, with gate_up_proj_scales (E, 2I, H/32) and down_proj_scales (E, H, I/32) uint8 e8m0 exponents
 * (2^(s-127)) per group of 32; gate/up interleaved in the 2I rows. Those are dequantised here (exactly: every value is
 * a bf16). Errors name the file and the tensor (missing, wrong dtype, wrong shape). */
#ifndef DFLASH_GPTOSS_EXPERTS_H
#define DFLASH_GPTOSS_EXPERTS_H

#include <stddef.h>
#include <stdint.h>

#include "hf_config.h"
#include "safetensors.h"
#include "util.h"

typedef struct gptoss_experts {
    float *gate_up;                      /* (E, 2I, H): rows [0, I) gate, [I, 2I) up */
    float *gate_up_b;                    /* (E, 2I), the same order */
    float *down;                         /* (E, H, I) */
    float *down_b;                       /* (E, H) */
} gptoss_experts;

/* Layer `layer`'s experts under "<prefix>layers.<layer>.mlp.experts.". On failure x holds what was loaded
 * (gptoss_experts_free frees it). */
int gptoss_experts_load(gptoss_experts *x, const st_file *st, const hf_config *c, const char *prefix, int layer,
                        errbuf *err);
void gptoss_experts_free(gptoss_experts *x);

/* MXFP4 to fp32: blocks (rows, groups, 16) bytes and scales (rows, groups) -> out (rows, groups*32); element 2j of a
 * group is byte j's low nibble, 2j+1 its high nibble; a code's value (e2m1: 0, .5, 1, 1.5, 2, 3, 4, 6, sign in bit
 * 3) times 2^(scale-127). */
void mxfp4_dequant(float *out, const uint8_t *blocks, const uint8_t *scales, size_t rows, int groups);

#endif
