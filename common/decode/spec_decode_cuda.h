/* spec_decode_cuda: DFlash speculative decoding of one prompt at temperature 0 on the GPU, the device twin of
 * spec_decode.h (the same loop, the same spec_opts and spec_result, the same block bookkeeping spec_block_commit):
 * the target is target_decode_cuda (bf16, sequence 0 of a cache), the drafter drafter_infer_cuda; the committed
 * positions' taps stay on the device. The target's greedy choice never picks o->reserved (its logit set to -inf
 * before the device argmax); ties go to the lower id. Also target-only greedy decoding of the same prompt.
 * Errors: 0 / -errno with an errbuf. */
#ifndef DFLASH_SPEC_DECODE_CUDA_H
#define DFLASH_SPEC_DECODE_CUDA_H

#include <stdint.h>

#include "drafter_infer_cuda.h"
#include "spec_decode.h"
#include "target_decode_cuda.h"
#include "util.h"

typedef struct spec_cuda spec_cuda;

/* Buffers for prompts + answers of at most max_len positions, for target m (its cache c: at least max_len
 * positions, steps of max_len tokens) and drafter d (NULL: target-only greedy decoding only). Sets m for verification
 * (target_cuda_set_for_verification), so call it before the cache runs a step. */
int spec_cuda_create(spec_cuda **out, target_cuda *m, target_cuda_cache *c, drafter_infer_cuda *d, int max_len,
                     errbuf *err);
void spec_cuda_destroy(spec_cuda **s);
/* Speculative decoding of prompt[0..plen) with sequence 0 of the cache (emptied first). */
int spec_decode_cuda(spec_cuda *s, const int32_t *prompt, int plen, const spec_opts *o, spec_result *r, errbuf *err);
/* Target-only greedy decoding of the same (nblocks = 0). */
int spec_target_greedy_cuda(spec_cuda *s, const int32_t *prompt, int plen, const spec_opts *o, spec_result *r,
                            errbuf *err);

#endif
