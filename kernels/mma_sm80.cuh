// mma_sm80: the warp-level primitives the flash-style kernels share (attention.cu, dflash_attention.cu): shared-memory
// addresses, cp.async copies, ldmatrix loads, the m16n8k16 bf16 tensor-core MMA with fp32 accumulators, exp2 and bf16
// packing. Device code only, force-inlined (each kernel file compiles them into its own code); no state.
#ifndef DFLASH_MMA_SM80_CUH
#define DFLASH_MMA_SM80_CUH

#include <cuda_bf16.h>
#include <cstdint>

namespace mma_sm80 {

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared, asynchronous; valid == false zero-fills the 16 destination bytes
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid)
{
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool valid)
{
    int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
// an arrival on the mbarrier bar (shared) once every cp.async this thread issued so far has landed; .noinc: the
// barrier's expected count includes it (one per thread that announces this way)
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint64_t *bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// One step of a two-stage cp.async ring: with a next stage (more), issue its copies (load()), commit them and wait for
// all groups but that one (this stage's copies have landed); at the last stage, wait for every group.
template <class Load> __device__ __forceinline__ void cp_async_stage_next(bool more, Load &&load)
{
    if (more) {
        load();
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
}

// four 8x8 b16 matrices from shared memory (optionally transposed)
__device__ __forceinline__ void ldmatrix_x4(uint32_t *r, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t *r, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

// d = a(16x16 bf16, row) · b(16x8 bf16, col) + d, fp32
__device__ __forceinline__ void mma_bf16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fast_exp2(float x) // ex2.approx: 2^-inf = 0, as the softmax needs
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// The online softmax's row step, in log2 units: mx (the row's max over the tile's raw scores this thread holds) reduced
// over the quad of lanes that hold the row, the running max m_run updated with mx·scale_log2, corr = exp2(m_old - m_new)
// (the factor the running sum and the output take) and neg_m = -m (0 for a row that has seen nothing yet: its o and l
// stay 0) to add before exp2. One rule for the flash kernels' softmax (attention.cu, dflash_attention.cu).
__device__ __forceinline__ void online_max(float mx, float &m_run, float scale_log2, float &corr, float &neg_m)
{
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_run, mx * scale_log2);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    corr = fast_exp2(m_run - m_use);
    m_run = m_new;
    neg_m = -m_use;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

} // namespace mma_sm80

#endif
