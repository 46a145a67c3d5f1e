// prefetch_l2: the L2 prefetch hint of the memory-bound kernels (rmsnorm's row kernel, qk_norm_rope's token-group
// kernel): a thread asks for the 128-byte line holding p to be brought into L2 and goes on (no register waits on it,
// so a kernel can have rows in flight beyond what its registers hold); the later load then hits L2. A hint only: the
// bits never depend on it. How far ahead they reach: memory_prefetch_distance().
#ifndef DFLASH_KERNEL_PREFETCH_L2_CUH
#define DFLASH_KERNEL_PREFETCH_L2_CUH

#include <stdlib.h>

__device__ __forceinline__ void prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// How many of its own iterations ahead a persistent memory-bound kernel prefetches (0: none, each warp or block one
// pass as before). DFLASH_PREFETCH_AHEAD (read once) overrides the default, for measuring.
#define MEMORY_PREFETCH_AHEAD 2
inline int memory_prefetch_distance(void)
{
    static int d = -1;
    if (d < 0) {
        const char *e = getenv("DFLASH_PREFETCH_AHEAD");
        d = e && *e ? atoi(e) : MEMORY_PREFETCH_AHEAD;
        if (d < 0) d = 0;
    }
    return d;
}

#endif
