// embedding: CUDA gather of bf16 table rows by token id. One thread per 16-byte vector (8 bf16) when the row and
// both pointers allow it, else one thread per element. Ids are trusted here: the caller checked them against vocab.
#include <cstdint>

#include "cuda_check.h"
#include "embedding.h"

static __global__ void embedding_gather_vec8_kernel(uint4 *out, const int32_t *ids, long long n_vec,
                                                    const uint4 *table, int vec_per_row)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_vec;
         i += (long long)gridDim.x * blockDim.x) {
        long long row = i / vec_per_row;
        int col = (int)(i - row * vec_per_row);
        out[i] = table[(long long)ids[row] * vec_per_row + col];
    }
}

static __global__ void embedding_gather_kernel(uint16_t *out, const int32_t *ids, long long n_elem,
                                               const uint16_t *table, int dim)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_elem;
         i += (long long)gridDim.x * blockDim.x) {
        long long row = i / dim;
        int col = (int)(i - row * dim);
        out[i] = table[(long long)ids[row] * dim + col];
    }
}

static unsigned embedding_grid(long long work, int threads)
{
    long long blocks = (work + threads - 1) / threads;
    const long long cap = 65535LL * 16; // grid-stride loops cover the rest
    return (unsigned)(blocks < cap ? blocks : cap);
}

extern "C" void embedding_forward_cuda(uint16_t *out, const int32_t *ids, int n, const uint16_t *table, int dim,
                                       void *stream)
{
    if (n <= 0 || dim <= 0) return;
    cudaStream_t st = (cudaStream_t)stream;
    const int threads = 256;
    bool vec = dim % 8 == 0 && ((uintptr_t)out % 16) == 0 && ((uintptr_t)table % 16) == 0;
    if (vec) {
        long long n_vec = (long long)n * (dim / 8);
        embedding_gather_vec8_kernel<<<embedding_grid(n_vec, threads), threads, 0, st>>>(
            (uint4 *)out, ids, n_vec, (const uint4 *)table, dim / 8);
    } else {
        long long n_elem = (long long)n * dim;
        embedding_gather_kernel<<<embedding_grid(n_elem, threads), threads, 0, st>>>(out, ids, n_elem, table, dim);
    }
    CHECK_CUDA_LAUNCH();
}
