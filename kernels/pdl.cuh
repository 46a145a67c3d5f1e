// pdl: programmatic dependent launch (sm_90) for the kernels of a decoding step, whose grids are small and short, so
// that each one's launch and ramp-up, not its work, is much of its time. A kernel launched with pdl::launch may start
// before the kernel ahead of it on the stream has finished; it must call pdl::wait() (griddepcontrol.wait: the
// kernels before it have completed and their memory is visible) before it reads anything they write and before it
// writes anything at all; before the wait it may only read what no kernel of the step writes (weights). A kernel
// calls pdl::launch_dependents() to let the next pdl::launch-ed kernel start early (otherwise it starts when this
// one's blocks have exited). Launched without the attribute (a plain <<<>>> launch, or pdl::launch while it is off)
// both are no-ops, so the bits never depend on it: only when a kernel starts. Stream capture keeps the edges.
// Off unless DFLASH_PDL=1 (read once): on the H200 the Qwen3-8B batch-1 step as a graph took 5.36 ms with it
// against 5.20 ms without in one run (bench/RESULTS.md, issue 23).
#ifndef DFLASH_KERNEL_PDL_CUH
#define DFLASH_KERNEL_PDL_CUH

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "env_switch.h"

namespace pdl {

__device__ __forceinline__ void launch_dependents()
{
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ __forceinline__ void wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

inline bool enabled()
{
    static int on = -1;
    return env_switch(&on, "DFLASH_PDL", "1") != 0;
}

template <typename... Args, typename... Act>
inline void launch(void (*kernel)(Args...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, Act... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at, cfg.numAttrs = enabled() ? 1 : 0;
    CHECK_CUDA(cudaLaunchKernelEx(&cfg, kernel, static_cast<Args>(args)...));
}

} // namespace pdl

#endif
