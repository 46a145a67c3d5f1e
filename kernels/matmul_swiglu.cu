// matmul_swiglu: act = swiglu(x · w_guᵀ) on Hopper (sm_90a), the gate|up GEMM with the SwiGLU in its epilogue, so the
// (T, 2I) gate|up product never goes to memory (at Qwen3-8B's T = 19218, I = 12288: 945 MB written and read again per
// layer by the two-kernel path).
//
// Persistent, one CTA per SM, three warpgroups (attention_sm90.cu's shape; the primitives are wgmma_sm90.cuh's). A tile
// is kBM rows of x (128; 64 for the wide ping-pong one) by kBO act columns [n0, n0 + kBO); its B operand is the kBO
// gate rows [n0, n0 + kBO) of w_gu and the same kBO up rows [I + n0, I + n0 + kBO), one 2 kBO-row K-major panel (two
// TMA boxes), so a wgmma m64n(2 kBO)k16 leaves gate column c and up column c of a tile in the same thread. Warpgroup
// 0's first thread is the producer: per k block (kBK = 64) one box of x and the two boxes of w_gu by TMA into a
// kStages-deep ring of 128-byte-swizzled stages, each with a "full" mbarrier (the bytes landed) and an "empty" one (one
// arrival per consumer warp that read it); it runs ahead across tiles as stages free up. Warpgroups 1 and 2 are the
// consumers, their accumulators (128 fp32 registers a thread) kept across a tile's k blocks, one wgmma group in flight
// behind the one issued (the stage of the one that finished is released). Two schedules (ms_shape): cooperative, both
// consumers on each tile (kBO = 128, 64 rows each, m64n256k16); ping-pong, each consumer on every other tile alone (kBO
// = 64, two m64n128k16 a k step for the tile's two 64-row halves; the wide one: kBM = 64, kBO = 128, one m64n256k16 as
// a cooperative consumer's), the two taking turns at their GEMMs (named barriers, as attention_sm90.cu's consumers),
// one's epilogue under the other's GEMM. The epilogue rounds gate and up to bf16 (as the two-kernel path stores gu),
// computes silu(gate) * up with swiglu_act (swiglu.cu's formula), rounds to bf16 and stores bf16 pairs straight from
// the registers, rows < T and columns < I only. Tiles go in groups of kGroupM row blocks, row block fastest within a
// group (a wave of 132 CTAs touches ~16 row blocks of x and ~8 column blocks of w_gu: both stay in L2); CTA b takes
// tiles b, b + grid, ... Fixed k order per output, no split-K: deterministic, the same bits from every schedule. Tails:
// rows past T come as zeros from TMA (never stored; a cluster's second row block wholly past T loads no A at all); with
// kBO = 128 a last column block of 64 (I % 128 == 64) reads up rows as its upper gate half and zeros as its upper up
// half, never stored. The cluster schedule (MATMUL_SWIGLU_CLUSTER) is the cooperative one on 2-CTA clusters sharing B
// by multicast. The _TMASTORE twins of the cooperative, cluster and ping-pong schedules store act as CUTLASS's Hopper
// epilogues do: each consumer warpgroup writes its act block (64 x 128; ping-pong 128 x 64; the same act_pair bits) by
// stmatrix into a 128-byte-swizzled staging buffer of its own, and one thread of it stores the block with two TMA boxes
// (64 x 64) through a tensor map of act, whose bounds drop rows >= T and columns >= I; the next GEMM starts as soon as
// the stores are issued, and the staging buffer is rewritten only once they have read it (bulk_wait_read): the 8-row x
// 16-byte global stores of the direct epilogue no longer hold the tensor cores (or, ping-pong, the other consumer's
// turn) up.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda_check.h"
#include "matmul_swiglu.h"
#include "mma_sm80.cuh"
#include "swiglu_act.cuh"
#include "wgmma_sm90.cuh"

namespace {

using namespace wgmma_sm90;

constexpr int kConsumers = 2;                    // consumer warpgroups
constexpr int kThreads = (kConsumers + 1) * 128; // + the producer warpgroup
constexpr int kBK = 64;                          // one 128-byte swizzled panel of the reduction dimension
[[maybe_unused]] constexpr int kGroupM = 16;     // row blocks per group of the tile order
// setmaxnreg as attention_sm90.cu: launched at 168 a thread (384 threads), the producer's 128 threads free
// 128 x (168 - 40) and the consumers' 256 take exactly that
[[maybe_unused]] constexpr int kProducerRegs = 40, kConsumerRegs = 232;
static_assert(128 * (168 - kProducerRegs) == 256 * (kConsumerRegs - 168), "the consumers take what the producer frees");

// The schedules (MATMUL_SWIGLU_*): rows and act columns per tile, the ring's depth, the CTAs of a cluster, the
// arrivals that free a stage (the consumer warps that read it, in every CTA of the cluster: each CTA's producer writes
// its part of the B tile into all of them), whether act goes out through the staging buffer and TMA (kStoreBlock per
// consumer warpgroup, 64 x 64 panels of 8 KiB, after the ring). A consumer's product is either one m64n256k16 a k step
// over its 64 rows (kHalves false: the cooperative ones, each consumer one half of the tile; the wide ping-pong one,
// a consumer the whole 64-row tile) or two m64n128k16 over the tile's two 64-row halves (kHalves: ping-pong, 128 x 64
// act). Shared memory (227 KiB = 232448 bytes a CTA): cooperative 4 stages of 48 KiB (+ 2 x 16 KiB staging: 230464
// bytes); ping-pong 6 of 32 KiB (+ 2 x 16 KiB: 230496); wide ping-pong 5 of 40 KiB (205904; with staging blocks it
// would keep 4 stages only).
template <int KERNEL> struct ms_shape {
    static constexpr bool kWide = KERNEL == MATMUL_SWIGLU_PINGPONG_WIDE;
    static constexpr bool kPing =
        KERNEL == MATMUL_SWIGLU_PINGPONG || KERNEL == MATMUL_SWIGLU_PINGPONG_TMASTORE || kWide;
    static constexpr bool kTmaStore = KERNEL == MATMUL_SWIGLU_COOPERATIVE_TMASTORE ||
                                      KERNEL == MATMUL_SWIGLU_CLUSTER_TMASTORE ||
                                      KERNEL == MATMUL_SWIGLU_PINGPONG_TMASTORE;
    static constexpr int kCluster = KERNEL == MATMUL_SWIGLU_CLUSTER || KERNEL == MATMUL_SWIGLU_CLUSTER_TMASTORE ? 2 : 1;
    static constexpr int kBM = kWide ? 64 : 128;          // rows of x per tile
    static constexpr int kBO = kPing && !kWide ? 64 : 128; // act columns per tile
    static constexpr bool kHalves = kBO == 64;            // a consumer's two m64n128k16 (else one m64n256k16)
    static constexpr int kABytes = kBM * kBK * 2;
    static constexpr int kBBytes = 2 * kBO * kBK * 2;     // the tile's kBO gate rows, then its kBO up rows
    static constexpr int kStageBytes = kABytes + kBBytes;
    static constexpr int kStages = !kPing ? 4 : kWide ? 5 : 6;
    static constexpr int kReaders = (kPing ? 4 : 4 * kConsumers) * kCluster; // warps reading a stage
    static_assert(kCluster == 1 || (!kPing && kCluster == 2), "the cluster schedule is the cooperative one on 2 CTAs");
    static_assert(kReaders % 4 == 0, "whole warpgroups read a stage");
    static_assert(kBM == (kPing && !kHalves ? 64 : 128) && (kHalves ? kPing : kBO == 128),
                  "a consumer's rows: its 64 (one m64n256k16), or the tile's two halves of 64 (ping-pong)");
    static constexpr int kStoreOffset = kStages * kStageBytes;
    // a consumer's act block in staging: its 64 rows x 128 (cooperative) or its tile's 128 rows x 64 (ping-pong)
    static constexpr int kStoreBlock = kTmaStore ? (kPing ? kBM : 64) * kBO * 2 : 0;
    static constexpr int kStorePanels = kStoreBlock / (64 * 64 * 2);
    static constexpr int kStoreBytes = kConsumers * kStoreBlock;
    static_assert(!kTmaStore || (kStorePanels == 2 && !kWide), "two 64 x 64 panels a consumer (kHalves: one a half)");
    static constexpr int kBarOffset = kStoreOffset + kStoreBytes;
    static constexpr int kSmem = kBarOffset + 2 * kStages * 8 + 1024; // the barriers; slack to align to 1024 bytes
    static_assert(kSmem <= 227 * 1024, "the shared memory of one CTA on sm_90");
    static_assert(kABytes % 1024 == 0 && kBBytes % 2048 == 0 && kStoreOffset % 1024 == 0,
                  "stages, boxes and staging panels start on 1024-byte swizzle atoms");
};

#ifdef DFLASH_SM90A
// tile t of the order: groups of gm row blocks (the last group may be shorter), row block fastest in a group
__device__ __forceinline__ void tile_coords(int t, int tiles_m, int tiles_n, int gm, int &mb, int &nb)
{
    const int per_group = gm * tiles_n, group = t / per_group, first = group * gm;
    const int rows = min(gm, tiles_m - first), r = t - group * per_group;
    mb = first + r % rows, nb = r / rows;
}

// the bf16 value the two-kernel path stores for an fp32 sum
__device__ __forceinline__ float as_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// two act values (columns c, c + 1) from their gate and up sums, as bf16 pair bits
__device__ __forceinline__ uint32_t act_pair(float g0, float g1, float u0, float u1)
{
    return mma_sm80::pack_bf16(swiglu_act(as_bf16(g0), as_bf16(u0)), swiglu_act(as_bf16(g1), as_bf16(u1)));
}

// One warpgroup's 64 rows of a tile from the accumulators of an m64n(16 NG)k16 product whose first 8 NG columns are
// gate columns c0 + 8i + {0, 1} (i < NG, d[4i + ..]) and whose last 8 NG are the up columns of the same act columns
// (d[4(i + NG) + ..]); this thread's rows ra (= the warpgroup's first + 16 warp + g) and ra + 8. Rows >= T and
// columns >= I are not stored (I is a multiple of 64, so a pair is all in or all out).
template <int NG>
__device__ __forceinline__ void store_act(const float (&d)[8 * NG], __nv_bfloat16 *act, int ldact, int ra, int c0,
                                          int T, int I)
{
    const int rb = ra + 8;
    __nv_bfloat16 *pa = act + (size_t)ra * ldact, *pb = act + (size_t)rb * ldact;
#pragma unroll
    for (int i = 0; i < NG; i++) {
        const int col = c0 + 8 * i;
        if (col >= I) continue;
        if (ra < T)
            *reinterpret_cast<uint32_t *>(pa + col) =
                act_pair(d[4 * i], d[4 * i + 1], d[4 * (i + NG)], d[4 * (i + NG) + 1]);
        if (rb < T)
            *reinterpret_cast<uint32_t *>(pb + col) =
                act_pair(d[4 * i + 2], d[4 * i + 3], d[4 * (i + NG) + 2], d[4 * (i + NG) + 3]);
    }
}

// The same act values of one warpgroup's 64 x 8 NG block (d as store_act's; warp w holds rows 16w..16w + 15) into the
// staging buffer at stg: NG / 8 panels of 64 rows x 64 columns (8 KiB each, 1024-byte aligned), 128-byte swizzled as a
// TMA box of the act map reads them (16-byte chunk c of row r at chunk c ^ (r & 7)). One stmatrix x4 a pair of column
// groups i, i + 1: matrix q is rows 8 (q & 1).. of the warp's 16 at act columns 8 (i + (q >> 1)).., the registers in
// the accumulators' layout; its 8 rows of 16 bytes fall in 8 distinct chunks of a 128-byte row: no bank conflict.
template <int NG>
__device__ __forceinline__ void stage_act(const float (&d)[8 * NG], uint32_t stg, int warp, int lane)
{
    static_assert(NG % 8 == 0, "whole 64-column panels");
    const int q = lane >> 3, rr = lane & 7;        // this lane addresses row rr of matrix q
    const int row = warp * 16 + (q & 1) * 8 + rr; // of the warpgroup's 64 (row & 7 == rr)
#pragma unroll
    for (int i = 0; i < NG; i += 2) {
        const int chunk = i + (q >> 1); // 8 act columns (16 bytes) of the block's 8 NG
        const uint32_t addr = stg + (uint32_t)((chunk >> 3) * 64 * 128 + row * 128 + (((chunk & 7) ^ rr) << 4));
        stmatrix_x4(addr, act_pair(d[4 * i], d[4 * i + 1], d[4 * (i + NG)], d[4 * (i + NG) + 1]),
                    act_pair(d[4 * i + 2], d[4 * i + 3], d[4 * (i + NG) + 2], d[4 * (i + NG) + 3]),
                    act_pair(d[4 * i + 4], d[4 * i + 5], d[4 * (i + 1 + NG)], d[4 * (i + 1 + NG) + 1]),
                    act_pair(d[4 * i + 6], d[4 * i + 7], d[4 * (i + 1 + NG) + 2], d[4 * (i + 1 + NG) + 3]));
    }
}
#endif

// KERNEL MATMUL_SWIGLU_COOPERATIVE: both consumers on each of the CTA's tiles (128 x 128 act: warpgroup w rows
// 64w.., wgmma m64n256k16 over the 256-row B panel); the tensor cores idle while they store. MATMUL_SWIGLU_CLUSTER:
// the same on clusters of 2 CTAs that take the two row blocks of a 256-row unit at the same act columns in step:
// CTA rank r loads its A box alone and B's gate box (r = 0) or up box (r = 1) for both (TMA multicast), so each
// reads half the B bytes from L2; a consumer warp frees a stage in both CTAs. MATMUL_SWIGLU_PINGPONG:
// consumer w takes the CTA's tiles w, w + 2, ... alone (128 x 64 act: two m64n128k16 a k step, one per 64-row half of
// A, over a 128-row B panel), the two taking turns at their tiles' GEMMs, so one's epilogue runs while the other's
// GEMM does. MATMUL_SWIGLU_PINGPONG_WIDE: the same turns, consumer w on tiles of 64 rows x 128 act (one m64n256k16 a
// k step over a 64-row A block and the 256-row B panel, as a cooperative consumer's). The _TMASTORE twins of the
// cooperative, cluster and ping-pong ones: act through the staging buffers and tm_act (the others do not read tm_act).
template <int KERNEL>
__global__ void __launch_bounds__(kThreads, 1)
    matmul_swiglu_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_w,
                         const __grid_constant__ CUtensorMap tm_act, __nv_bfloat16 *act, int ldact, int T, int I, int H)
{
#ifdef DFLASH_SM90A
    using S = ms_shape<KERNEL>;
    constexpr int kStages = S::kStages, kBO = S::kBO, kBM = S::kBM, kABytes = S::kABytes;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + S::kBarOffset), *empty = full + kStages;
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; s++) {
            mbar_init(full + s, 1);
            mbar_init(empty + s, S::kReaders); // one arrival per warp that reads the stage
        }
        mbar_init_fence();
    }
    if (S::kCluster > 1) cluster_sync(); // the peer's barriers are initialised before anything lands on them
    else __syncthreads();

    // Units: a CTA (a cluster: its CTAs in step) takes the units unit, unit + nunits, ... of the order over units of
    // kCluster row blocks by kBO act columns; its tiles j = 0, 1, ... (CTA rank crank: row block kCluster mbu +
    // crank of unit j), tile j's k blocks the ring's blocks it = j nk + kb (stage it % kStages, parity
    // (it / kStages) & 1), for the producer and the consumers alike
    const int crank = S::kCluster > 1 ? (int)cluster_ctarank() : 0;
    const int unit = blockIdx.x / S::kCluster, nunits = gridDim.x / S::kCluster;
    const int tiles_m = (T + kBM * S::kCluster - 1) / (kBM * S::kCluster), tiles_n = (I + kBO - 1) / kBO;
    const int ntiles = tiles_m * tiles_n, gm = kGroupM / S::kCluster;
    const int nk = H / kBK, wg = threadIdx.x / 128;
    if (wg == 0) {
        setmaxnreg_dec<kProducerRegs>();
        if (threadIdx.x != 0) return;
        tma_prefetch_map(&tm_x), tma_prefetch_map(&tm_w);
        if (S::kTmaStore) tma_prefetch_map(&tm_act);
        int it = 0;
        for (int t = unit; t < ntiles; t += nunits) {
            int mbu, nb;
            tile_coords(t, tiles_m, tiles_n, gm, mbu, nb);
            const int mb = mbu * S::kCluster + crank;
            for (int kb = 0; kb < nk; kb++, it++) {
                const int s = it % kStages;
                if (it >= kStages) mbar_wait(empty + s, (uint32_t)(((it / kStages) & 1) ^ 1)); // it - kStages done
                unsigned char *st = smem + s * S::kStageBytes;
                // a box's rows past the map's end arrive as zeros and count in its bytes: the whole stage (with the
                // peer's multicast half of B, which may land before this arrival), but for a cluster's row block
                // wholly past T (T <= 128 (2 mbu + 1)), whose A is not loaded (its rows are never stored)
                const bool a_rows = mb * kBM < T;
                mbar_arrive_expect_tx(full + s, S::kStageBytes - (a_rows ? 0 : kABytes));
                if (a_rows) tma_load_2d(st, &tm_x, kb * kBK, mb * kBM, full + s);
                if (S::kCluster > 1) {
                    tma_load_2d_multicast(st + kABytes + crank * kBO * 128, &tm_w, kb * kBK, crank * I + nb * kBO,
                                          full + s, (uint16_t)((1u << S::kCluster) - 1));
                } else {
                    tma_load_2d(st + kABytes, &tm_w, kb * kBK, nb * kBO, full + s);
                    tma_load_2d(st + kABytes + kBO * 128, &tm_w, kb * kBK, I + nb * kBO, full + s);
                }
            }
        }
        // cluster: the peer's consumers free this CTA's stages from their CTA; the CTA stays until the last of
        // those arrivals (the releases of the ring's last kStages blocks) has landed
        if (S::kCluster > 1)
            for (int b = it - kStages > 0 ? it - kStages : 0; b < it; b++)
                mbar_wait(empty + b % kStages, (uint32_t)((b / kStages) & 1));
        return;
    }

    // consumers
    setmaxnreg_inc<kConsumerRegs>();
    const int cw = wg - 1, tid = threadIdx.x - wg * 128;
    const int warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
    const uint32_t s0 = smem_u32(smem);
    // one m64n256k16 a k step: d, 64 x 256 (this warpgroup's 64 rows of the tile: cooperative its half, wide
    // ping-pong the whole tile); kHalves (ping-pong): d0 and d1, 64 x 128 each (the tile's rows 0-63 and 64-127)
    constexpr bool kHalves = S::kHalves;
    float d[kHalves ? 1 : 128], d0[kHalves ? 64 : 1], d1[kHalves ? 64 : 1];
#pragma unroll
    for (int i = 0; i < (kHalves ? 1 : 128); i++) d[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < (kHalves ? 64 : 1); i++) d0[i] = 0.0f, d1[i] = 0.0f;
    // this warpgroup's first row in a tile's A block and in act (ping-pong: the whole tile's)
    const int arow = S::kPing ? 0 : cw * 64;
    // Ping-pong: the consumers take turns at their tiles' GEMMs (turn_begin / turn_end), consumer 0 first. Besides
    // overlapping one's epilogue with the other's GEMM, the turns keep a consumer from waiting on a block's "full"
    // barrier while the block kStages before it in the same stage has not landed: a parity wait cannot tell the two
    // phases apart. A consumer's blocks before its tile's are the other's, and the other waited for every one of them
    // before it handed the turn over. (Cooperative: both consumers wait for every block in order.)
    const int j0 = S::kPing ? cw : 0, jstep = S::kPing ? 2 : 1;
    if (S::kPing && cw == 1) turn_end<S::kPing>(cw);
    // a stage read by this warp goes back to the producer of each CTA of the cluster
    auto free_stage = [&](int stage) {
        if (S::kCluster > 1) {
            __syncwarp();
            if (lane == 0)
                for (int r = 0; r < S::kCluster; r++) mbar_arrive_cluster(empty + stage, (uint32_t)r);
        } else {
            release(empty + stage, lane);
        }
    };
    for (int j = j0, t = unit + j0 * nunits; t < ntiles; j += jstep, t += jstep * nunits) {
        int mbu, nb;
        tile_coords(t, tiles_m, tiles_n, gm, mbu, nb);
        const int mb = mbu * S::kCluster + crank, it0 = j * nk;
        turn_begin<S::kPing>(cw);
        for (int kb = 0; kb < nk; kb++) {
            const int it = it0 + kb, s = it % kStages;
            mbar_wait(full + s, (uint32_t)((it / kStages) & 1));
            const uint32_t a = s0 + s * S::kStageBytes, b = a + kABytes;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kBK / 16; kk++) { // 16 columns (32 bytes) along the panels' rows a step
                const uint64_t db = sw128_desc(b + kk * 32, 16, 1024);
                if constexpr (kHalves) {
                    wgmma_ss_m64n128k16(d0, sw128_desc(a + kk * 32, 16, 1024), db, kb > 0 || kk > 0);
                    wgmma_ss_m64n128k16(d1, sw128_desc(a + 64 * 128 + kk * 32, 16, 1024), db, kb > 0 || kk > 0);
                } else {
                    wgmma_ss_m64n256k16(d, sw128_desc(a + arow * 128 + kk * 32, 16, 1024), db, kb > 0 || kk > 0);
                }
            }
            wgmma_commit();
            if (kb > 0) { // the previous block's group is done: its stage goes back to the producer
                wgmma_wait<1>();
                free_stage((it - 1) % kStages);
            }
        }
        turn_end<S::kPing>(cw); // the tile's last block is issued; its epilogue goes under the other's GEMM
        wgmma_wait<0>();
        free_stage((it0 + nk - 1) % kStages);
        const int c0 = nb * kBO + 2 * t4, row = mb * kBM + arow; // this warpgroup's first act row
        if constexpr (kHalves) {
            fence_regs(d0);
            fence_regs(d1);
        } else {
            fence_regs(d);
        }
        if constexpr (S::kTmaStore) {
            // this warpgroup's act block: its staging block (two 64 x 64 panels: its 64 rows' column halves, or
            // kHalves its tile's row halves), its named barrier (128 threads; 1 and 2 are the ping-pong turns'), its
            // thread 0 the one that stores and waits
            unsigned char *stg = smem + S::kStoreOffset + cw * S::kStoreBlock;
            const int bar = 3 + cw;
            if (j != j0) { // the previous tile's stores have read the block before it is rewritten
                if (tid == 0) bulk_wait_read<0>();
                named_sync(bar, 128);
            }
            if constexpr (kHalves) {
                stage_act<8>(d0, smem_u32(stg), warp, lane);
                stage_act<8>(d1, smem_u32(stg + 64 * 128), warp, lane);
            } else {
                stage_act<16>(d, smem_u32(stg), warp, lane);
            }
            fence_proxy_async(); // the stmatrix writes, seen by the TMA store (the async proxy)
            named_sync(bar, 128);
            if (tid == 0 && row < T) { // a block wholly past T (or a panel wholly past T or I) is not stored
                tma_store_2d(&tm_act, stg, nb * kBO, row);
                if (kHalves ? row + 64 < T : nb * kBO + 64 < I)
                    tma_store_2d(&tm_act, stg + 64 * 128, nb * kBO + (kHalves ? 0 : 64), row + (kHalves ? 64 : 0));
                bulk_commit();
            }
        } else if constexpr (kHalves) {
            store_act<8>(d0, act, ldact, row + warp * 16 + g, c0, T, I);
            store_act<8>(d1, act, ldact, row + 64 + warp * 16 + g, c0, T, I);
        } else {
            store_act<16>(d, act, ldact, row + warp * 16 + g, c0, T, I);
        }
    }
    // the last stores have read the staging buffer (it goes with the CTA) and written act
    if (S::kTmaStore && tid == 0) bulk_wait<0>();
#else
    // compiled for a target without wgmma: never launched (matmul_swiglu_cuda_takes says no there)
    (void)tm_x, (void)tm_w, (void)tm_act, (void)act, (void)ldact, (void)T, (void)I, (void)H;
#endif
}

template <int KERNEL>
void launch(uint16_t *act, int ldact, const uint16_t *x, int ldx, const uint16_t *w_gu, int T, int I, int H,
            cudaStream_t st)
{
    using S = ms_shape<KERNEL>;
    CUtensorMap tm_x, tm_w, tm_act = {}; // act's: stores of 64 x 64 boxes (the staging panels), the TMA-store ones only
    if (!make_map(&tm_x, x, ldx, H, (uint64_t)T, S::kBM) || !make_map(&tm_w, w_gu, H, H, 2 * (uint64_t)I, S::kBO) ||
        (S::kTmaStore && !make_map(&tm_act, act, ldact, I, (uint64_t)T, 64))) {
        fprintf(stderr, "matmul_swiglu_forward_cuda: the driver made no tensor map of x (%d, %d; ld %d), w_gu "
                        "(%d, %d) or act (%d, %d; ld %d)\n", T, H, ldx, 2 * I, H, T, I, ldact);
        exit(1);
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = S::kCluster, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cfg.blockDim = dim3(kThreads), cfg.dynamicSmemBytes = S::kSmem, cfg.stream = st;
    cfg.attrs = attr, cfg.numAttrs = S::kCluster > 1 ? 1 : 0; // a plain launch without clusters
    // the most units running at once: one CTA per SM (its shared memory), or the clusters of 2 the GPU holds at once
    static bool attr_set = false; // per template instance; set once per process (device 0 semantics)
    static int slots = 0;
    if (!attr_set) {
        CHECK_CUDA(cudaFuncSetAttribute(matmul_swiglu_kernel<KERNEL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        S::kSmem));
        int dev = 0;
        CHECK_CUDA(cudaGetDevice(&dev));
        CHECK_CUDA(cudaDeviceGetAttribute(&slots, cudaDevAttrMultiProcessorCount, dev));
        if (S::kCluster > 1) {
            cfg.gridDim = dim3((unsigned)(slots / S::kCluster * S::kCluster));
            CHECK_CUDA(cudaOccupancyMaxActiveClusters(&slots, matmul_swiglu_kernel<KERNEL>, &cfg));
            if (slots < 1) {
                fprintf(stderr, "matmul_swiglu_forward_cuda: the device runs no cluster of %d CTAs of %d bytes of "
                                "shared memory\n", S::kCluster, S::kSmem);
                exit(1);
            }
        }
        attr_set = true;
    }
    const long long units =
        (long long)((T + S::kBM * S::kCluster - 1) / (S::kBM * S::kCluster)) * ((I + S::kBO - 1) / S::kBO);
    if (units > INT32_MAX / 2 - 2LL * slots || units * (H / kBK) > INT32_MAX) { // the walk's tile and block indices
        fprintf(stderr, "matmul_swiglu_forward_cuda: T=%d I=%d H=%d: %lld tiles overflow its counters\n", T, I, H,
                units);
        exit(1);
    }
    cfg.gridDim = dim3((unsigned)((units < slots ? units : slots) * S::kCluster)); // persistent
    CHECK_CUDA(cudaLaunchKernelEx(&cfg, matmul_swiglu_kernel<KERNEL>, tm_x, tm_w, tm_act, (__nv_bfloat16 *)act, ldact,
                                  T, I, H));
}

// The schedules, one row each, the one place that maps a MATMUL_SWIGLU_* value and a DFLASH_MATMUL_SWIGLU name to a
// launch. A TMA-store schedule's act must make a tensor map (16-byte aligned, ldact a multiple of 8); where it does
// not, its direct-store twin runs instead (the same bits).
typedef void (*ms_launch_fn)(uint16_t *, int, const uint16_t *, int, const uint16_t *, int, int, int, cudaStream_t);
const struct ms_schedule {
    int kernel;
    const char *name;
    ms_launch_fn launch;
    int direct; // the twin storing from the registers (itself for those that do)
} ms_schedules[] = {
    {MATMUL_SWIGLU_COOPERATIVE, "cooperative", launch<MATMUL_SWIGLU_COOPERATIVE>, MATMUL_SWIGLU_COOPERATIVE},
    {MATMUL_SWIGLU_PINGPONG, "pingpong", launch<MATMUL_SWIGLU_PINGPONG>, MATMUL_SWIGLU_PINGPONG},
    {MATMUL_SWIGLU_CLUSTER, "cluster", launch<MATMUL_SWIGLU_CLUSTER>, MATMUL_SWIGLU_CLUSTER},
    {MATMUL_SWIGLU_COOPERATIVE_TMASTORE, "cooperative_tmastore", launch<MATMUL_SWIGLU_COOPERATIVE_TMASTORE>,
     MATMUL_SWIGLU_COOPERATIVE},
    {MATMUL_SWIGLU_CLUSTER_TMASTORE, "cluster_tmastore", launch<MATMUL_SWIGLU_CLUSTER_TMASTORE>,
     MATMUL_SWIGLU_CLUSTER},
    {MATMUL_SWIGLU_PINGPONG_TMASTORE, "pingpong_tmastore", launch<MATMUL_SWIGLU_PINGPONG_TMASTORE>,
     MATMUL_SWIGLU_PINGPONG},
    {MATMUL_SWIGLU_PINGPONG_WIDE, "pingpong_wide", launch<MATMUL_SWIGLU_PINGPONG_WIDE>, MATMUL_SWIGLU_PINGPONG_WIDE},
};
constexpr int kNSchedules = (int)(sizeof ms_schedules / sizeof ms_schedules[0]);
static_assert(kNSchedules == MATMUL_SWIGLU_NKERNELS - 1, "a row for every MATMUL_SWIGLU_* but AUTO");

const ms_schedule *ms_schedule_of(int kernel)
{
    for (int i = 0; i < kNSchedules; i++)
        if (ms_schedules[i].kernel == kernel) return &ms_schedules[i];
    return NULL;
}

// MATMUL_SWIGLU_AUTO's schedule: DFLASH_MATMUL_SWIGLU's name (read once), when unset or empty the cooperative one
// with the TMA-store epilogue (on the H200 at the 8B shape: 5.19 ms, 746 TFLOP/s, against cooperative's 5.78 and
// cuBLASLt + swiglu's 5.70; since the cluster arrive's fix the cluster one with the same epilogue runs 5.16 against
// 5.22 alone but the same 440.8 ms target step, so the default stays the one that needs no cluster; bench/RESULTS.md,
// 2026-12-05)
int ms_auto(void)
{
    static int kernel = -1;
    if (kernel < 0) {
        const char *e = getenv("DFLASH_MATMUL_SWIGLU");
        kernel = MATMUL_SWIGLU_COOPERATIVE_TMASTORE;
        if (e && *e) {
            int i = 0;
            while (i < kNSchedules && strcmp(ms_schedules[i].name, e)) i++;
            if (i == kNSchedules) {
                fprintf(stderr, "matmul_swiglu_forward_cuda: DFLASH_MATMUL_SWIGLU=%s is none of", e);
                for (i = 0; i < kNSchedules; i++) fprintf(stderr, " %s", ms_schedules[i].name);
                fprintf(stderr, "\n");
                exit(1);
            }
            kernel = ms_schedules[i].kernel;
        }
    }
    return kernel;
}

} // namespace

extern "C" const char *matmul_swiglu_kernel_name(int kernel)
{
    const ms_schedule *s = ms_schedule_of(kernel);
    return s ? s->name : NULL;
}

extern "C" int matmul_swiglu_cuda_takes(const uint16_t *act, int ldact, const uint16_t *x, int ldx,
                                        const uint16_t *w_gu, int T, int I, int H)
{
    return T >= 0 && I > 0 && H > 0 && I % 64 == 0 && H % 64 == 0 && ldx >= H && ldx % 8 == 0 && ldact >= I &&
           ldact % 2 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)w_gu % 16 == 0 && (uintptr_t)act % 4 == 0 &&
           sm90a_device() && encode_tiled() != NULL;
}

extern "C" void matmul_swiglu_forward_cuda_with(int kernel, uint16_t *act, int ldact, const uint16_t *x, int ldx,
                                                const uint16_t *w_gu, int T, int I, int H, void *stream)
{
    if (!matmul_swiglu_cuda_takes(act, ldact, x, ldx, w_gu, T, I, H)) {
        fprintf(stderr,
                "matmul_swiglu_forward_cuda: T=%d I=%d H=%d ldx=%d ldact=%d (x %p, w_gu %p, act %p) is not a shape "
                "it takes: I and H multiples of 64, ldx >= H a multiple of 8, ldact >= I even, x and w_gu 16-byte "
                "aligned, act 4-byte aligned, an sm_90 device whose driver makes tensor maps\n",
                T, I, H, ldx, ldact, (const void *)x, (const void *)w_gu, (const void *)act);
        exit(1);
    }
    const ms_schedule *s = ms_schedule_of(kernel == MATMUL_SWIGLU_AUTO ? ms_auto() : kernel);
    if (!s) {
        fprintf(stderr, "matmul_swiglu_forward_cuda_with: kernel %d is none of MATMUL_SWIGLU_*\n", kernel);
        exit(1);
    }
    if (T == 0) return;
    if ((uintptr_t)act % 16 != 0 || ldact % 8 != 0) s = ms_schedule_of(s->direct); // no tensor map of act
    s->launch(act, ldact, x, ldx, w_gu, T, I, H, (cudaStream_t)stream);
}

extern "C" void matmul_swiglu_forward_cuda(uint16_t *act, int ldact, const uint16_t *x, int ldx, const uint16_t *w_gu,
                                           int T, int I, int H, void *stream)
{
    matmul_swiglu_forward_cuda_with(MATMUL_SWIGLU_AUTO, act, ldact, x, ldx, w_gu, T, I, H, stream);
}
