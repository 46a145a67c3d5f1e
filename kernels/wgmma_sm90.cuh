// wgmma_sm90: the Hopper (sm_90a) primitives of the warpgroup kernels (attention_sm90.cu, dflash_attention.cu,
// matmul_swiglu.cu):
// shared-memory matrix descriptors for 128-byte-swizzled tiles, wgmma.mma_async (m64nNk16, bf16 in, fp32
// accumulators; A from shared memory or registers), mbarriers, the bulk tensor copy (TMA) and setmaxnreg, force-inlined
// device code without state; and on the host the tensor maps of the TMA boxes (make_map). Every instruction here
// exists only on sm_90a: callers compile their uses under DFLASH_SM90A (defined below for the sm_90a device pass only),
// so the compute_90 PTX and the host pass still build.
#ifndef DFLASH_WGMMA_SM90_CUH
#define DFLASH_WGMMA_SM90_CUH

#include <cuda.h> // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DFLASH_SM90A 1
#endif

namespace wgmma_sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

#ifdef DFLASH_SM90A

// Tiles are rows of 64 bf16 (128 bytes) swizzled by 128 bytes: in each 1024-byte atom of 8 rows, 16-byte chunk c of
// row r sits at chunk c ^ (r & 7). Wider rows are split into 64-column panels, one after another. Atoms start at
// 1024-byte aligned addresses (the swizzle is of address bits, so the pattern follows the absolute address).
//
// Descriptor of such a tile: start address, leading and stride byte offsets (16-byte units), swizzle mode 1 (128 B).
// K-major (the reduction dimension contiguous: Q and K for S = Q·Kᵀ): 8-row groups are sbo = 1024 bytes apart; the
// leading offset is unused (a k16 step, 32 bytes, stays inside one 128-byte row); step k by adding 32 bytes to the
// start. MN-major (V for O += P·V, the reduction over keys = rows): the 64-column panels are lbo bytes apart, the 8-key
// groups sbo = 1024 bytes; step k16 (16 keys) by adding 2048 bytes.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t saddr, uint32_t lbo_bytes, uint32_t sbo_bytes)
{
    uint64_t d = 0;
    d |= (uint64_t)((saddr & 0x3FFFF) >> 4);
    d |= (uint64_t)((lbo_bytes >> 4) & 0x3FFF) << 16;
    d |= (uint64_t)((sbo_bytes >> 4) & 0x3FFF) << 32;
    d |= (uint64_t)1 << 62; // 128-byte swizzle
    return d;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// keeps the compiler from moving accumulator accesses across the asynchronous wgmma window
template <int R> __device__ __forceinline__ void fence_regs(float (&d)[R])
{
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// The accumulator operands of a wgmma's inline asm, constraint C ("+f": read and written; "=f": written only) on
// d[0], d[1], ...: WGMMA_ACC32 (m64n64), WGMMA_ACC64 (m64n128), WGMMA_ACC128 (m64n256)
#define WGMMA_ACC8(C, d, o) C(d[o]), C(d[o + 1]), C(d[o + 2]), C(d[o + 3]), C(d[o + 4]), C(d[o + 5]), C(d[o + 6]), C(d[o + 7])
#define WGMMA_ACC32_AT(C, d, o) WGMMA_ACC8(C, d, o), WGMMA_ACC8(C, d, o + 8), WGMMA_ACC8(C, d, o + 16), WGMMA_ACC8(C, d, o + 24)
#define WGMMA_ACC32(C, d) WGMMA_ACC32_AT(C, d, 0)
#define WGMMA_ACC64(C, d) WGMMA_ACC32_AT(C, d, 0), WGMMA_ACC32_AT(C, d, 32)
#define WGMMA_ACC128(C, d) WGMMA_ACC64(C, d), WGMMA_ACC32_AT(C, d, 64), WGMMA_ACC32_AT(C, d, 96)

// D (64 x N fp32, this warpgroup) = A (64 x 16, descriptor da, K-major) · B (N x 16, descriptor db, K-major)ᵀ
// + (scale_d ? D : 0); TRANS_B 1: B (16 x N) MN-major instead, D = A · B. Accumulator layout per warp w of the group:
// rows 16w + g and 16w + g + 8 (g = lane / 4), columns 8i + 2 (lane % 4) + {0, 1} in d[4i + {0, 1}] and
// d[4i + {2, 3}].
template <int TRANS_B = 0>
__device__ __forceinline__ void wgmma_ss_m64n128k16(float (&d)[64], uint64_t da, uint64_t db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,"
                 "%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,"
                 "%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
                 "}, %64, %65, p, 1, 1, 0, %67;\n}\n"
                 : WGMMA_ACC64("+f", d)
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
}

// D (64 x 256 fp32) = A (64 x 16, K-major) · B (256 x 16, K-major)ᵀ + (scale_d ? D : 0): the layout above with
// i up to 31 (matmul_swiglu.cu: the gate's 128 columns in d[0..63], the up's in d[64..127])
__device__ __forceinline__ void wgmma_ss_m64n256k16(float (&d)[128], uint64_t da, uint64_t db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,"
                 "%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,"
                 "%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,"
                 "%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,"
                 "%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,"
                 "%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
                 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : WGMMA_ACC128("+f", d)
                 : "l"(da), "l"(db), "r"(scale_d));
}

// D (64 x 64 fp32) = A (64 x 16, descriptor, K-major) · B (64 x 16, descriptor, K-major)ᵀ + (scale_d ? D : 0): the
// instruction (operands: d[0..31], da, db, scale_d), then its two wrappers
#define WGMMA_SS_M64N64K16_ASM                                                                                         \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                                       \
    "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"                                                           \
    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,"                       \
    "%25,%26,%27,%28,%29,%30,%31"                                                                                      \
    "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
__device__ __forceinline__ void wgmma_ss_m64n64k16(float (&d)[32], uint64_t da, uint64_t db, int scale_d)
{
    asm volatile(WGMMA_SS_M64N64K16_ASM : WGMMA_ACC32("+f", d)
                 : "l"(da), "l"(db), "r"(scale_d));
}

// D (64 x 64 fp32) = A · Bᵀ as wgmma_ss_m64n64k16 with scale_d 0: D write-only ("=f"), so that no earlier value of
// the accumulator registers is tied to the new one (a loop-carried accumulator in flight across the back edge would
// otherwise be copied by ordinary moves, and ptxas serialises the wgmma pipeline around them: C7515)
__device__ __forceinline__ void wgmma_ss_m64n64k16_first(float (&d)[32], uint64_t da, uint64_t db)
{
    asm volatile(WGMMA_SS_M64N64K16_ASM : WGMMA_ACC32("=f", d)
                 : "l"(da), "l"(db), "r"(0));
}

// D (64 x N fp32) += A (64 x 16 bf16 in registers, the m16n8k16 A-fragment layout per warp: a[0] row g cols 2t..2t+1,
// a[1] row g+8, a[2] row g cols 8+2t.., a[3] row g+8 cols 8+2t..) · B (16 x N, descriptor db, MN-major: transposed).
__device__ __forceinline__ void wgmma_rs_m64n128k16_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t db,
                                                       int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,"
                 "%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,"
                 "%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
                 "}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
                 : WGMMA_ACC64("+f", d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_rs_m64n64k16_tb(float (&d)[32], const uint32_t (&a)[4], uint64_t db,
                                                       int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,"
                 "%25,%26,%27,%28,%29,%30,%31"
                 "}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
                 : WGMMA_ACC32("+f", d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

// mbarriers (shared::cta, 64-bit)
__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}
// wait until the phase of the given parity has completed
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
    asm volatile("{\n.reg .pred done;\n"
                 "WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT_%=;\n}\n" ::"r"(smem_u32(bar)),
                 "r"(parity)
                 : "memory");
}

// one arrival per warp on an "empty" barrier, once the warp's wgmma reads of the stage are complete
__device__ __forceinline__ void release(uint64_t *bar, int lane)
{
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
}

// rows x 64 bf16 box of a 2D tensor map at (col, row) into shared memory, completing on bar (complete_tx)
__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, int col, int row, uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                 "[%4];\n" ::"r"(smem_u32(dst)),
                 "l"((uint64_t)map), "r"(col), "r"(row), "r"(smem_u32(bar))
                 : "memory");
}
// the same box into shared memory at the same offset in each CTA of the cluster named by cta_mask (bit r: rank r),
// completing on the mbarrier at bar's offset in each of them
__device__ __forceinline__ void tma_load_2d_multicast(void *dst, const CUtensorMap *map, int col, int row,
                                                      uint64_t *bar, uint16_t cta_mask)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
                 "[%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(smem_u32(dst)),
                 "l"((uint64_t)map), "r"(col), "r"(row), "r"(smem_u32(bar)), "h"(cta_mask)
                 : "memory");
}

// thread-block clusters: this CTA's rank; an arrival on the mbarrier at bar's offset in CTA rank cta of the cluster
// (release at CTA scope, as CUTLASS's ClusterBarrier::arrive: the .release.cluster form cost matmul_swiglu's cluster
// schedule 40% of its rate on the H200, 427 against 730 TFLOP/s); a barrier over every thread of the cluster (also
// orders the mbarrier inits before peers use them)
__device__ __forceinline__ uint32_t cluster_ctarank()
{
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t *bar, uint32_t cta)
{
    asm volatile("{\n.reg .b32 remote;\n"
                 "mapa.shared::cluster.u32 remote, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_u32(bar)),
                 "r"(cta)
                 : "memory");
}
__device__ __forceinline__ void cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap *map)
{
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)map) : "memory");
}

// ordinary shared-memory stores (and cp.async) made visible to the async proxy (wgmma, TMA) of this CTA
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// TMA stores: a rows x 64 bf16 box from shared memory (laid out as tma_load_2d leaves it) to the 2D tensor map at
// (col, row), in this thread's bulk async-group; the box's elements outside the map's bounds are not written.
// bulk_commit closes the thread's group; bulk_wait_read<N> waits until at most N of its groups still read shared
// memory (the source may then be rewritten), bulk_wait<N> until at most N are still incomplete (the writes done).
__device__ __forceinline__ void tma_store_2d(const CUtensorMap *map, const void *src, int col, int row)
{
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"((uint64_t)map),
                 "r"(smem_u32(src)), "r"(col), "r"(row)
                 : "memory");
}
// a plain bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory,
// completing on bar (complete_tx, as tma_load_2d)
__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_u32(dst)),
                 "l"((uint64_t)src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}
// a plain bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from shared to global memory, in
// this thread's bulk async-group (bulk_commit, bulk_wait_read, bulk_wait as the TMA stores)
__device__ __forceinline__ void bulk_store(void *dst, const void *src, uint32_t bytes)
{
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"((uint64_t)dst),
                 "r"(smem_u32(src)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void bulk_wait()
{
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// four 8 x 8 b16 matrices to shared memory, one register of each per thread in the mma accumulator layout (matrix q:
// row lane / 4, columns 2 (lane % 4) + {0, 1} in r[q], the lower column in the lower half); lane l gives the address of
// row l % 8 of matrix l / 8 (16 contiguous bytes)
__device__ __forceinline__ void stmatrix_x4(uint32_t saddr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3)
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(saddr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}

template <int N> __device__ __forceinline__ void setmaxnreg_inc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_dec()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// named barrier over nthreads (a multiple of 32) of the CTA; id 0 is __syncthreads'
__device__ __forceinline__ void named_sync(int id, int nthreads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int nthreads)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}

// Two consumer warpgroups (cw 0 and 1) taking turns (FlashAttention-3's warp scheduler barrier): warpgroup cw waits
// on named barrier bar + cw (bar: 1 unless the kernel uses 1 and 2 otherwise) for its turn and hands it to the other
// by arriving on the other's (256 threads each: 128 waiting, 128 arriving). Consumer 1 hands consumer 0 the first
// turn (turn_end once before its first turn_begin); a last hand-over nobody waits for may stay unmatched at exit.
template <bool ON> __device__ __forceinline__ void turn_begin(int cw, int bar = 1)
{
    if (ON) named_sync(bar + cw, 2 * 128);
}
template <bool ON> __device__ __forceinline__ void turn_end(int cw, int bar = 1)
{
    if (ON) named_arrive(bar + (cw ^ 1), 2 * 128);
}

#endif // DFLASH_SM90A

// Host side: whether the current device runs the sm_90a cubin (compute capability 9.0; other devices run the
// compute_90 PTX, where the kernels are empty), read once (device 0 semantics, as the launches' attributes).
inline int sm90a_device(void)
{
    static int cc = -1;
    if (cc < 0) {
        int dev = 0, major = 0, minor = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            major = minor = 0;
        }
        cc = major * 10 + minor;
    }
    return cc == 90;
}

// Host side: the tensor maps the kernels' TMA boxes read. cuTensorMapEncodeTiled through the runtime's driver entry
// point (no -lcuda: see common/ipc/vmm_pool_cuda.c); NULL when the driver has none.
typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
inline encode_tiled_fn encode_tiled(void)
{
    static int resolved = 0;
    static encode_tiled_fn fn = NULL;
    if (!resolved) {
        void *p = NULL;
        cudaDriverEntryPointQueryResult qr = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &qr) ==
                cudaSuccess &&
            qr == cudaDriverEntryPointSuccess)
            fn = (encode_tiled_fn)p;
        else
            (void)cudaGetLastError();
        resolved = 1;
    }
    return fn;
}

// (rows, cols) bf16 matrix at base with row stride ld elements, read in boxes of box_rows x 64 columns, 128-byte
// swizzled; a box's rows past `rows` read as zeros (and still count in the box's bytes). Returns 0 when the driver
// cannot make it.
inline int make_map(CUtensorMap *map, const void *base, int ld, int cols, uint64_t rows, int box_rows)
{
    encode_tiled_fn fn = encode_tiled();
    if (!fn) return 0;
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ld * 2};
    cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, estr[2] = {1, 1};
    CUresult r = fn(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dims, strides, box, estr,
                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS;
}

} // namespace wgmma_sm90

#endif
