/* target_qwen3_moe_cuda: the qwen3_moe family's row of the CUDA operations (target_family_cuda.c). It has none yet:
 * its family row says so (can[TARGET_BACKEND_CUDA] = 0), so target_family_require refuses a CUDA job or command on a
 * qwen3_moe target when it starts, naming the family, and no operation here is ever looked up. The CUDA forward
 * will take the dense family's attention pieces and the shared CUDA MoE block (moe_block_cuda) when that lands. */
#include "target_model_cuda_impl.h"

const target_cuda_ops target_qwen3_moe_cuda = {0};
