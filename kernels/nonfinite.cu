// nonfinite: grid (ceil(G*C / (256*8)), n); each thread tests 8 bf16 values of one row, 256 apart so that a warp's
// loads are coalesced (exponent all ones: NaN or inf), and stores 1 into its group's flag only when it finds one (a plain store of the same value from many
// threads: no atomics, and nothing written on the common, finite path).
#include <cstdint>

#include "cuda_check.h"
#include "nonfinite.h"

namespace {

constexpr int kThreads = 256, kPer = 8;

__global__ void __launch_bounds__(kThreads) nonfinite_kernel(uint32_t *flags, const uint16_t *x, int ld, int G, int C)
{
    const long long cols = (long long)G * C;
    const long long c0 = (long long)blockIdx.x * kThreads * kPer + threadIdx.x;
    const uint16_t *row = x + (size_t)blockIdx.y * ld;
    for (int k = 0; k < kPer; k++) {
        long long c = c0 + (long long)k * kThreads;
        if (c >= cols) return;
        if ((row[c] & 0x7f80u) == 0x7f80u) flags[c / C] = 1u;
    }
}

} // namespace

extern "C" void nonfinite_groups_cuda(uint32_t *flags, const uint16_t *x, int ld, int n, int G, int C, void *stream)
{
    if (n <= 0 || G <= 0 || C <= 0) return;
    long long cols = (long long)G * C, per_cta = (long long)kThreads * kPer;
    dim3 grid((unsigned)((cols + per_cta - 1) / per_cta), (unsigned)n);
    nonfinite_kernel<<<grid, kThreads, 0, (cudaStream_t)stream>>>(flags, x, ld, G, C);
    CHECK_CUDA_LAUNCH();
}
