// sigmoid_gate: CUDA, one thread per element (grid-stride), fp32 math.
#include <cuda_bf16.h>
#include <cstdint>

#include "cuda_check.h"
#include "sigmoid_gate.h"

static __global__ void sigmoid_gate_kernel(__nv_bfloat16 *y, int ldy, const __nv_bfloat16 *x, int ldx,
                                           const __nv_bfloat16 *gate, int ldg, long long n, int dim)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        long long r = i / dim;
        int c = (int)(i - r * dim);
        float gv = __bfloat162float(gate[r * ldg + c]);
        y[r * ldy + c] = __float2bfloat16_rn(__bfloat162float(x[r * ldx + c]) * (1.0f / (1.0f + __expf(-gv))));
    }
}

extern "C" void sigmoid_gate_cuda(uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *gate, int ldg,
                                  int rows, int dim, void *stream)
{
    if (rows <= 0 || dim <= 0) return;
    const long long n = (long long)rows * dim;
    const int threads = 256;
    long long blocks = (n + threads - 1) / threads;
    if (blocks > 65535LL * 16) blocks = 65535LL * 16;
    sigmoid_gate_kernel<<<(unsigned)blocks, threads, 0, (cudaStream_t)stream>>>(
        (__nv_bfloat16 *)y, ldy, (const __nv_bfloat16 *)x, ldx, (const __nv_bfloat16 *)gate, ldg, n, dim);
    CHECK_CUDA_LAUNCH();
}
