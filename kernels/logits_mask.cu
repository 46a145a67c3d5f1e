// logits_mask: one thread per (row, id); grid (ceil(nids / 128), n).
#include <cuda_bf16.h>
#include <cstdint>

#include "cuda_check.h"
#include "logits_mask.h"

namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) logits_mask_kernel(__nv_bfloat16 *x, int ld, const int32_t *ids, int nids)
{
    int k = blockIdx.x * kThreads + threadIdx.x;
    if (k < nids) x[(size_t)blockIdx.y * ld + ids[k]] = __ushort_as_bfloat16((unsigned short)0xff80u); // -inf
}

} // namespace

extern "C" void logits_mask_rows_cuda(uint16_t *x, int ld, int n, const int32_t *ids, int nids, void *stream)
{
    if (n <= 0 || nids <= 0) return;
    dim3 grid((unsigned)((nids + kThreads - 1) / kThreads), (unsigned)n);
    logits_mask_kernel<<<grid, kThreads, 0, (cudaStream_t)stream>>>((__nv_bfloat16 *)x, ld, ids, nids);
    CHECK_CUDA_LAUNCH();
}
