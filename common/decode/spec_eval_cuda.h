/* spec_eval_cuda: spec_eval's backend on the GPU (spec_decode_cuda): the engine is a spec_cuda made with a drafter.
 * Errors as spec_eval.h. */
#ifndef DFLASH_SPEC_EVAL_CUDA_H
#define DFLASH_SPEC_EVAL_CUDA_H

#include "spec_decode_cuda.h"
#include "spec_eval.h"

extern const spec_eval_ops spec_eval_cuda_ops; /* engine: spec_cuda * */

#endif
