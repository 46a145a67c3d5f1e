// block_accept: CUDA, one CTA of 128 threads; thread t takes blocks t, t + 128, ... and keeps its counts in shared
// memory rows; then one thread per output sums the rows. Integer sums: the order does not change the result.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "block_accept.h"
#include "cuda_check.h"

#define BA_THREADS 128
#define BA_MAX_B 64

static __global__ void block_accept_kernel(int64_t *out, const int32_t *argmax, const int32_t *labels,
                                           const float *weights, int nblocks, int B)
{
    __shared__ int cnt[BA_THREADS][BA_MAX_B + 1]; // [.][k]: correct slot k; [.][B]: run sum (fits: N*B < 2^31)
    const int t = threadIdx.x;
    for (int k = 0; k <= B; k++) cnt[t][k] = 0;
    for (int j = t; j < nblocks; j += BA_THREADS) {
        int run = 0, running = 1;
        for (int k = 1; k < B; k++) {
            const long long q = (long long)j * B + k;
            const int correct = weights[q] != 0.0f && argmax[q] == labels[q];
            cnt[t][k] += correct;
            if (running && correct) run++;
            else running = 0;
        }
        cnt[t][B] += run;
    }
    __syncthreads();
    for (int k = t; k <= B; k += BA_THREADS) {
        int64_t s = 0;
        for (int i = 0; i < BA_THREADS; i++) s += cnt[i][k];
        out[k] = s;
    }
}

extern "C" void block_accept_cuda(int64_t *out, const int32_t *argmax, const int32_t *labels, const float *weights,
                                  int nblocks, int B, void *stream)
{
    if (B < 1 || B > BA_MAX_B || nblocks < 0) {
        fprintf(stderr, "block_accept_cuda: block size %d outside [1, %d] or %d blocks\n", B, BA_MAX_B, nblocks);
        exit(1);
    }
    block_accept_kernel<<<1, BA_THREADS, 0, (cudaStream_t)stream>>>(out, argmax, labels, weights, nblocks, B);
    CHECK_CUDA_LAUNCH();
}
