// colsum: CUDA. Thread (tx, ty) of a (32, 32) block sums p = ty, ty+32, ... of column blockIdx.x*32 + tx; then row 0
// adds the 32 partial sums in order. Grid ceil(dim/32).
#include "colsum.h"
#include "cuda_check.h"

static __global__ void colsum_add_kernel(float *dw, const float *part, int nparts, int dim)
{
    __shared__ float s[32][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float v = 0.0f;
    if (c < dim)
        for (int p = threadIdx.y; p < nparts; p += 32) v += part[(size_t)p * dim + c];
    s[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.y != 0 || c >= dim) return;
    float t = 0.0f;
#pragma unroll 8
    for (int j = 0; j < 32; j++) t += s[j][threadIdx.x];
    dw[c] += t;
}

extern "C" void colsum_add_cuda(float *dw, const float *part, int nparts, int dim, void *stream)
{
    if (dim <= 0) return;
    colsum_add_kernel<<<(dim + 31) / 32, dim3(32, 32), 0, (cudaStream_t)stream>>>(dw, part, nparts, dim);
    CHECK_CUDA_LAUNCH();
}
