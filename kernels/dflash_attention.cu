// dflash_attention (CUDA): the DFlash training attention, forward and backward, bf16 in/out, fp32 softmax and
// accumulation; deterministic (no atomics: every sum is taken in a fixed order by one thread or one warp).
//
// Mask as intervals: a query row of block j sees the keys [lo, hi) of two sources, the context rows of kc/vc
// ([ctx_start[j], ctx_start[j] + ctx_len[j])) and the block rows of kb/vb ([j*B, j*B + B)). Every kernel walks the
// union of the intervals its rows need, tile by tile, skips a tile where a warp's rows see none of it and masks
// element-wise only where some row sees part of it (with anchors sorted, a block's context is a prefix of its
// sequence: one masked tile per block). A sliding window (W > 0) narrows each slot's two intervals
// (dflash_attn_window); a block's union is then the last W-1 context rows and all its B rows.
//
// Query rows are taken per kv head in the order (block j, group head g, slot i), so the B*G rows of one block that
// share one K/V (64 for B = 16 and 4 query heads per kv head) are neighbours.
// Tile sizes per head_dim come from one table (tiles<HD> below; head_dim 256 takes half the query rows per warp, a
// forward CTA of 64 query rows over 32-key tiles, backward CTAs of 8 warps, and dK, dV in CTAs of their own). The
// figures here are those up to head_dim 128.
// Forward (flash-2): a CTA of 4 warps owns 128 query rows, 32 per warp (two m16 tiles share every K/V fragment);
// 64-key K/V tiles stream through shared memory (cp.async, two stages, rows padded by 16 bytes so ldmatrix is
// conflict-free); S = Q·Kᵀ and O += P·V are mma.sync.m16n8k16 bf16 with fp32 accumulators; online softmax in log2
// units with the scale folded in; saves lse (natural log).
// Backward, one launch of two CTA kinds (the dq tiles fill the SMs while the long dk/dv tiles run):
//  - dk/dv CTA: 64 key rows of one kv head (16 per warp; dK and dV accumulate in registers) loop over the blocks
//    that see them, in block order (a context tile scans the N blocks for those whose interval meets it; a
//    block-row tile only its own blocks), 64 query rows (a block's B*G rows, all the query heads of the group) at a
//    time: Sᵀ = K·Qᵀ, Pᵀ = exp(Sᵀ - lse), dV += Pᵀ·dO, dPᵀ = V·dOᵀ, dSᵀ = Pᵀ(dPᵀ - D), dK += dSᵀ·Q.
//  - dq CTA: the forward's 128 query rows over 32-key tiles: S, P, dP = dO·Vᵀ, dS, dQ += dS·K.
//  D = rowsum(dout * out) comes from a small kernel first (into the caller's delta buffer).
// Hopper (an sm_90 device, head_dim 128; DFLASH_ATTENTION=mma_sync keeps the kernels above): the same CTAs, walks and
// masks with their GEMMs on wgmma (m64 per warpgroup, operands from 128-byte-swizzled shared tiles that cp.async
// fills, P and dS as bf16 register operands; wgmma_sm90.cuh): a forward CTA of two warpgroups (128 query rows over
// 64-key tiles, two CTAs an SM), and a backward of one-warpgroup CTAs (two an SM, each on its own pace): dk/dv CTAs
// of 64 key rows (dK and dV, 64 x 128 fp32 each, in registers; the next step's Sᵀ and dPᵀ issued behind this step's
// dV and dK) and dq CTAs of 64 query rows. With the caller's dS
// workspace (dflash_attention_backward_workspace) the dk/dv CTAs also write each step's dS tile (64 query rows x 64
// keys, 8 KB) there and a second launch of dq CTAs sums dQ += dS·K over them in key order (5 GEMMs a block's step in
// all, not 7), each context dk/dv tile's blocks split over two CTAs (the first tile, which every block of a sorted
// sequence sees, would otherwise be the launch's longest chain; DFLASH_ATTENTION_DKV_SPLIT=0 keeps one;
// without a window the dk/dv CTAs are of 128 key rows, a producer warpgroup staging each step's Q, dO, lse, D once
// for two consumer warpgroups of 64 keys each, the same bits: dkv_wg2_sm90, dkv_variant's rule); without one
// (or DFLASH_ATTENTION_DQ=recompute) the dq CTAs share the dk/dv launch and recompute S, P, dP and dS.
// Scalar path (head_dim not 16/32/64/128/256, or rows not 16-byte aligned): one warp per query row (forward, dq) or per
// key row (dk/dv).
#include <cuda_bf16.h>
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "dflash_attention.h"
#include "attention.h"
#include "cuda_check.h"
#include "env_switch.h"
#include "mma_sm80.cuh"
#include "wgmma_sm90.cuh"

namespace {

typedef __nv_bfloat16 bf16;

constexpr int kWarps = 4, kThreads = kWarps * 32; // the forward's CTA
constexpr int kMaxWarps = 8, kMaxQRows = 128;      // a CTA at most: warps, query rows (forward / dq)

// The tiles per head_dim, chosen here only (the accumulators must fit 255 registers without spilling, the shared
// memory 227 KB):
//  - MT m16 tiles of query rows per warp in the forward and dq (the forward's CTA: 4 warps x 16 x MT rows);
//  - FK keys a K/V tile in the forward, DK in dq (there the dP accumulators take the registers of the other 32);
//  - DKV_PARTS: 1, a dk/dv CTA accumulates dK and dV of its 16 key rows a warp together; 2, dV and dK in two CTAs of
//    their own (each recomputes S = K·Qᵀ; 2 x (HD/8) x 4 fp32 accumulators would not fit at head_dim 256);
//  - IR query rows a dk/dv step (a chunk of one block's B*G rows); BW warps a backward CTA (dk/dv: 16 x BW key rows,
//    dq: BW x 16 x MT query rows).
// Up to 128: MT 2, FK 64, DK 32, one part, IR 64, BW 4 (2 CTAs an SM). At 256: MT 1, FK 32 (the forward's 64 query
// rows a CTA, 2 x 101 KB: two CTAs an SM), DK 32, two parts, IR 32, BW 8 (one CTA of 8 warps an SM, 203 KB: 128 key
// rows or 128 query rows a CTA). Measured at 256 on the H200 (the qwen35_9b row of test_dflash_attention_gpu): the
// backward 4.28 ms with 8 warps, 6.47 ms with 4 (IR 64: 199 KB, one CTA an SM), 5.09 ms with 4 warps and IR 16, DK 16
// (99 KB, two CTAs an SM), 6.24 ms with 4 warps and DK 64.
template <int HD> struct tiles {
    static constexpr int MT = HD <= 128 ? 2 : 1, FK = HD <= 128 ? 64 : 32, DK = 32;
    static constexpr int DKV_PARTS = HD <= 128 ? 1 : 2, IR = HD <= 128 ? 64 : 32, BW = HD <= 128 ? 4 : 8;
    static constexpr int kQRows = kWarps * 16 * MT, kDqRows = BW * 16 * MT, kKvRows = BW * 16;
};
static_assert(tiles<256>::kDqRows <= kMaxQRows && tiles<256>::BW <= kMaxWarps, "tiles: a CTA's rows or warps");
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

struct Args {
    const bf16 *q, *kc, *vc, *kb, *vb;
    int ldq, ldkc, ldvc, ldkb, ldvb;
    const int32_t *ctx_start, *ctx_len;
    int T, N, B, nh, nkv, G, hd;
    int W; // sliding window (0: none)
    float scale, scale_log2;
    bf16 *out; // forward
    int ldo;
    float *lse_out;
    const bf16 *dout; // backward
    int lddo;
    const float *lse, *delta;
    bf16 *dq, *dkc, *dvc, *dkb, *dvb;
    int lddq, lddkc, lddvc, lddkb, lddvb;
    // Hopper dS workspace (null: dq recomputes dS): 8 KB tiles, ws_nct context slots then the block-row slots of each
    // (kv head, block, query chunk), ws_stride in all (ws_slot)
    bf16 *dsw;
    int ws_nct, ws_stride;
    // with it, each context dk/dv tile is split over ctx_parts CTAs (block ranges), their fp32 dK|dV partials in
    // dkv_part summed in part order by the last to finish (dkv_count: per kv head and tile, zeroed every call)
    int ctx_parts;
    float *dkv_part;
    int *dkv_count;
};

using namespace mma_sm80;

// Fragment addresses (bf16 elements) in a padded tile of row stride S, for lane `lane`:
// A operand (16 rows x 16 k) at rows r0.., k0..
template <int S> __device__ __forceinline__ int frag_a(int r0, int k0, int lane)
{
    return (r0 + (lane & 15)) * S + k0 + (lane >> 4) * 8;
}
// B operands of two n8 tiles whose n index is the tile row (K in Q·Kᵀ): rows n0..n0+15, k0..k0+15
template <int S> __device__ __forceinline__ int frag_b_rows(int n0, int k0, int lane)
{
    return (n0 + (lane & 7) + ((lane >> 4) << 3)) * S + k0 + ((lane >> 3) & 1) * 8;
}
// B operands of two n8 tiles whose k index is the tile row (V in P·V, through .trans): rows k0..k0+15, n0..n0+15
template <int S> __device__ __forceinline__ int frag_b_trans(int k0, int n0, int lane)
{
    return (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * S + n0 + (lane >> 4) * 8;
}

// acc (MT m16 tiles of rows wrow + 16m.. x NT n8 tiles) += A (those rows of the padded tile sa) · B (rows 0..8NT of
// the padded tile tb, the n index)ᵀ over HD: S = Q·Kᵀ, dP = dO·Vᵀ, Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ. Each k16 step loads the A
// fragments once and shares every B fragment pair among the MT tiles.
template <int HD, int MT, int NT, int S>
__device__ __forceinline__ void mma_rows_bt(float (&acc)[MT][NT][4], const bf16 *sa, int wrow, const bf16 *tb, int lane)
{
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t fa[MT][4];
#pragma unroll
        for (int m = 0; m < MT; m++) ldmatrix_x4(fa[m], sa + frag_a<S>(wrow + m * 16, kk * 16, lane));
#pragma unroll
        for (int t = 0; t < NT; t += 2) {
            uint32_t b[4];
            ldmatrix_x4(b, tb + frag_b_rows<S>(t * 8, kk * 16, lane));
#pragma unroll
            for (int m = 0; m < MT; m++) {
                mma_bf16(acc[m][t], fa[m], b[0], b[1]);
                mma_bf16(acc[m][t + 1], fa[m], b[2], b[3]);
            }
        }
    }
}

// one m16 tile (the dk/dv warps' 16 key rows): acc (NT n8 tiles)
template <int HD, int NT, int S>
__device__ __forceinline__ void mma_rows_bt(float (&acc)[NT][4], const bf16 *sa, int wrow, const bf16 *tb, int lane)
{
    mma_rows_bt<HD, 1, NT, S>(reinterpret_cast<float (&)[1][NT][4]>(acc), sa, wrow, tb, lane);
}

// acc (MT m16 tiles x HD/8 n8 tiles) += A (bf16 fragments f, KS k16 steps) · B (rows 0..16KS of the padded tile tb,
// the k index, through .trans): O += P·V, dQ += dS·K, dV += Pᵀ·dO, dK += dSᵀ·Q.
template <int HD, int MT, int KS, int S>
__device__ __forceinline__ void mma_frags_b(float (&acc)[MT][HD / 8][4], const uint32_t (&f)[MT][KS][4], const bf16 *tb,
                                            int lane)
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
#pragma unroll
        for (int n0 = 0; n0 < HD / 8; n0 += 2) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, tb + frag_b_trans<S>(kk * 16, n0 * 8, lane));
#pragma unroll
            for (int m = 0; m < MT; m++) {
                mma_bf16(acc[m][n0], f[m][kk], b[0], b[1]);
                mma_bf16(acc[m][n0 + 1], f[m][kk], b[2], b[3]);
            }
        }
    }
}
// one m16 tile (the dk/dv warps' 16 key rows)
template <int HD, int KS, int S>
__device__ __forceinline__ void mma_frags_b(float (&acc)[HD / 8][4], const uint32_t (&f)[KS][4], const bf16 *tb, int lane)
{
    mma_frags_b<HD, 1, KS, S>(reinterpret_cast<float (&)[1][HD / 8][4]>(acc),
                              reinterpret_cast<const uint32_t (&)[1][KS][4]>(f), tb, lane);
}

// Copy rows [row0, row0+ROWS) of a (bound, HD) slice with row stride ld into a padded smem tile; rows >= bound are 0.
template <int HD, int ROWS>
__device__ __forceinline__ void load_rows(bf16 *tile, const bf16 *base, int ld, int row0, int bound)
{
    constexpr int kChunks = HD / 8, kStride = HD + 8;
#pragma unroll 1
    for (int c = threadIdx.x; c < ROWS * kChunks; c += blockDim.x) {
        int r = c / kChunks, col = (c % kChunks) * 8;
        bool valid = row0 + r < bound;
        cp_async16(tile + r * kStride + col, base + (size_t)(valid ? row0 + r : 0) * ld + col, valid);
    }
}

// Visible interval of block j in source src (0: context rows of kc/vc, 1: block rows of kb/vb): the union over its
// slots (slot 0 sees the most context under a window).
__device__ __forceinline__ void block_interval(const Args &a, int src, int j, int &lo, int &hi)
{
    if (src == 0) {
        lo = a.ctx_start[j];
        hi = lo + a.ctx_len[j];
        if (a.W > 0 && hi - lo > a.W - 1) lo = hi - (a.W - 1);
    } else {
        lo = j * a.B;
        hi = lo + a.B;
    }
}

// The blocks j of [cb, cb + 32 nw) below cand_hi whose interval of source src (block_interval) meets the key rows
// [row0, rend), written in block order to s_list[0..count) by the CTA's nw warps (thread i looks at block cb + i);
// returns count, in every thread. Two CTA barriers: every thread of the CTA calls it.
__device__ __forceinline__ int gather_blocks(const Args &a, int src, int cb, int cand_hi, int row0, int rend, int nw,
                                             int *s_wcount, int *s_list)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, j = cb + (int)threadIdx.x;
    bool hit = false;
    if (j < cand_hi) {
        int lo, hi;
        block_interval(a, src, j, lo, hi);
        hit = lo < hi && lo < rend && hi > row0;
    }
    const unsigned bal = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) s_wcount[warp] = __popc(bal);
    __syncthreads();
    int before = 0, count = 0;
    for (int w = 0; w < nw; w++) before += w < warp ? s_wcount[w] : 0, count += s_wcount[w];
    if (hit) s_list[before + __popc(bal & ((1u << lane) - 1u))] = j;
    __syncthreads();
    return count;
}

// Visible interval of slot i of block j in source src.
__device__ __forceinline__ void row_interval(const Args &a, int src, int j, int i, int &lo, int &hi)
{
    int c0, b0, b1;
    const int cl = a.ctx_len[j];
    dflash_attn_window(cl, a.B, i, a.W, &c0, &b0, &b1);
    if (src == 0) {
        lo = a.ctx_start[j] + c0;
        hi = a.ctx_start[j] + cl;
    } else {
        lo = j * a.B + b0;
        hi = j * a.B + b1;
    }
}

// ---- query-row CTAs (forward, dq) ----

struct QRows {
    int qrow[kMaxQRows], head[kMaxQRows]; // query row (-1: past the end) and head of each CTA row
    int lo[2][kMaxQRows], hi[2][kMaxQRows]; // visible key interval per source
    int4 warp[2][kMaxWarps]; // per warp and source: union lo, hi (rows with keys there); intersection lo, hi
    int2 cta[2];          // per source: union over the CTA
};

// Rows of query tile `tile` of kv head kh, RW a warp: CTA row t = warp*RW + lane (lanes < RW) is row
// ρ = tile*4*RW + t, (block j, head kh*G + g, slot i) with ρ = (j*G + g)*B + i. WOFF: the CTA's first WOFF warps own
// no row (a producer's; warp counts from the next), and only take part in the barriers.
template <int RW, int WOFF = 0> __device__ void qrows_setup(QRows &r, const Args &a, int tile, int kh)
{
    const int warp = (int)(threadIdx.x / 32) - WOFF, lane = threadIdx.x % 32, t = warp * RW + lane;
    const int GB = a.G * a.B;
    const int nw = blockDim.x / 32 - WOFF;
    const long long rho = (long long)tile * (nw * RW) + t;
    if (WOFF == 0 || warp >= 0) {
        int qrow = -1, head = 0, lo[2] = {0, 0}, hi[2] = {0, 0};
        if (lane < RW && rho < (long long)a.N * GB) {
            int j = (int)(rho / GB), rem = (int)(rho % GB), g = rem / a.B, i = rem % a.B;
            qrow = j * a.B + i;
            head = kh * a.G + g;
            row_interval(a, 0, j, i, lo[0], hi[0]);
            row_interval(a, 1, j, i, lo[1], hi[1]);
        }
        if (lane < RW) r.qrow[t] = qrow, r.head[t] = head;
#pragma unroll
        for (int src = 0; src < 2; src++) {
            if (lane < RW) r.lo[src][t] = lo[src], r.hi[src][t] = hi[src];
            const bool valid = qrow >= 0, any = valid && lo[src] < hi[src];
            // rows past the end are neutral in both (their results are never stored)
            int ulo = any ? lo[src] : INT_MAX, uhi = any ? hi[src] : INT_MIN;
            int ilo = valid ? lo[src] : INT_MIN, ihi = valid ? hi[src] : INT_MAX;
            ulo = __reduce_min_sync(0xffffffffu, ulo);
            uhi = __reduce_max_sync(0xffffffffu, uhi);
            ilo = __reduce_max_sync(0xffffffffu, ilo);
            ihi = __reduce_min_sync(0xffffffffu, ihi);
            if (lane == 0) r.warp[src][warp] = make_int4(ulo, uhi, ilo, ihi);
        }
    }
    __syncthreads();
    if (threadIdx.x < 2) {
        const int src = threadIdx.x;
        int ulo = INT_MAX, uhi = INT_MIN;
        for (int w = 0; w < nw; w++) ulo = min(ulo, r.warp[src][w].x), uhi = max(uhi, r.warp[src][w].y);
        r.cta[src] = make_int2(ulo, uhi);
    }
    __syncthreads();
}

__device__ __forceinline__ int ntiles(int2 u, int kt) { return u.x < u.y ? (u.y - u.x + kt - 1) / kt : 0; }

// Key tile it of a query-row CTA: the context tiles first, then the block-row tiles.
struct KTile {
    int src, row0, bound;
};
__device__ __forceinline__ KTile ktile(const QRows &r, int it, int nct, int kt)
{
    if (it < nct) return {0, r.cta[0].x + it * kt, r.cta[0].y};
    return {1, r.cta[1].x + (it - nct) * kt, r.cta[1].y};
}

template <int HD, int KT>
__device__ __forceinline__ void load_kv_tile(bf16 *sk, bf16 *sv, const Args &a, const KTile &t, int kh)
{
    const bf16 *k = t.src == 0 ? a.kc : a.kb, *v = t.src == 0 ? a.vc : a.vb;
    const int ldk = t.src == 0 ? a.ldkc : a.ldkb, ldv = t.src == 0 ? a.ldvc : a.ldvb;
    load_rows<HD, KT>(sk, k + (size_t)kh * HD, ldk, t.row0, t.bound);
    load_rows<HD, KT>(sv, v + (size_t)kh * HD, ldv, t.row0, t.bound);
}

// A query-row CTA's K/V ring step (the forward, dq): tile it + 1 into the other of the two stages (the last step waits
// for every copy), the CTA barrier; returns tile it of the walk, in stage it & 1.
template <int HD, int KT>
__device__ __forceinline__ KTile kv_ring_step(bf16 *sk, bf16 *sv, const Args &a, const QRows &rows, int it, int nt,
                                              int nct, int kh)
{
    constexpr int kTile = KT * (HD + 8);
    const int next = (it & 1) ^ 1;
    cp_async_stage_next(it + 1 < nt, [&] {
        load_kv_tile<HD, KT>(sk + next * kTile, sv + next * kTile, a, ktile(rows, it + 1, nct, KT), kh);
    });
    __syncthreads();
    return ktile(rows, it, nct, KT);
}

// Gather the CTA's ROWS query rows of x (row qrow, columns head*HD..) into a padded tile; rows past the end are 0.
template <int HD, int ROWS>
__device__ __forceinline__ void load_qrows(bf16 *tile, const bf16 *x, int ld, const QRows &r)
{
    constexpr int kChunks = HD / 8, kStride = HD + 8;
#pragma unroll 1
    for (int c = threadIdx.x; c < ROWS * kChunks; c += blockDim.x) {
        int row = c / kChunks, col = (c % kChunks) * 8, qrow = r.qrow[row];
        bool valid = qrow >= 0;
        const bf16 *src = x + (valid ? (size_t)qrow * ld + (size_t)r.head[row] * HD + col : 0);
        cp_async16(tile + row * kStride + col, src, valid);
    }
}

template <int HD>
__global__ void __launch_bounds__(kThreads, 2) fwd_kernel(const Args a)
{
    constexpr int MT = tiles<HD>::MT, kFwdKeys = tiles<HD>::FK, kQRows = tiles<HD>::kQRows;
    constexpr int kStride = HD + 8, kTile = kFwdKeys * kStride, kNT = kFwdKeys / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ QRows rows;
    bf16 *sq = reinterpret_cast<bf16 *>(smem_raw);
    bf16 *sk = sq + kQRows * kStride; // 2 stages
    bf16 *sv = sk + 2 * kTile;        // 2 stages
    const int kh = blockIdx.y, tile = (int)gridDim.x - 1 - (int)blockIdx.x; // later blocks (longer contexts) first
    qrows_setup<16 * MT>(rows, a, tile, kh);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tig = lane & 3;
    const int nct = ntiles(rows.cta[0], kFwdKeys), nt = nct + ntiles(rows.cta[1], kFwdKeys);

    load_qrows<HD, kQRows>(sq, a.q, a.ldq, rows);
    load_kv_tile<HD, kFwdKeys>(sk, sv, a, ktile(rows, 0, nct, kFwdKeys), kh);
    cp_async_commit();

    float o[MT][HD / 8][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < HD / 8; i++) o[m][i][0] = o[m][i][1] = o[m][i][2] = o[m][i][3] = 0.0f;
    // row r of m-tile m: warp*16*MT + m*16 + g + 8*r, index m*2 + r. m_run stays -inf until a row has seen a key.
    float m_run[2 * MT], l_run[2 * MT];
#pragma unroll
    for (int r = 0; r < 2 * MT; r++) m_run[r] = -INFINITY, l_run[r] = 0.0f;
    const int wrow = warp * 16 * MT;

    for (int it = 0; it < nt; it++) {
        const int stage = it & 1;
        const KTile kt = kv_ring_step<HD, kFwdKeys>(sk, sv, a, rows, it, nt, nct, kh);
        const int4 w = rows.warp[kt.src][warp];
        const int k0 = kt.row0;
        if (k0 < w.y && k0 + kFwdKeys > w.x) { // some row of the warp sees a key of the tile (warp-uniform)
            const bf16 *tk = sk + stage * kTile, *tv = sv + stage * kTile;
            const bool need_mask = !(w.z <= k0 && k0 + kFwdKeys <= w.w);

            float s[MT][kNT][4];
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int t = 0; t < kNT; t++) s[m][t][0] = s[m][t][1] = s[m][t][2] = s[m][t][3] = 0.0f;
            mma_rows_bt<HD, MT, kNT, kStride>(s, sq, wrow, tk, lane);

            float mx[2 * MT];
#pragma unroll
            for (int r = 0; r < 2 * MT; r++) mx[r] = -INFINITY;
#pragma unroll
            for (int m = 0; m < MT; m++) {
                int lo0 = INT_MIN, hi0 = INT_MAX, lo1 = INT_MIN, hi1 = INT_MAX;
                if (need_mask) {
                    const int r0 = wrow + m * 16 + g;
                    lo0 = rows.lo[kt.src][r0], hi0 = rows.hi[kt.src][r0];
                    lo1 = rows.lo[kt.src][r0 + 8], hi1 = rows.hi[kt.src][r0 + 8];
                }
#pragma unroll
                for (int t = 0; t < kNT; t++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        if (need_mask) {
                            const int key = k0 + t * 8 + tig * 2 + (e & 1);
                            const int lo = e < 2 ? lo0 : lo1, hi = e < 2 ? hi0 : hi1;
                            if (key < lo || key >= hi) s[m][t][e] = -INFINITY;
                        }
                        mx[m * 2 + (e >> 1)] = fmaxf(mx[m * 2 + (e >> 1)], s[m][t][e]);
                    }
                }
            }
            float corr[2 * MT], neg_m[2 * MT];
#pragma unroll
            for (int r = 0; r < 2 * MT; r++) online_max(mx[r], m_run[r], a.scale_log2, corr[r], neg_m[r]);
            uint32_t pf[MT][kFwdKeys / 16][4];
#pragma unroll
            for (int m = 0; m < MT; m++) {
                float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
                for (int t = 0; t < kNT; t++) {
                    float p0 = fast_exp2(fmaf(s[m][t][0], a.scale_log2, neg_m[m * 2]));
                    float p1 = fast_exp2(fmaf(s[m][t][1], a.scale_log2, neg_m[m * 2]));
                    float p2 = fast_exp2(fmaf(s[m][t][2], a.scale_log2, neg_m[m * 2 + 1]));
                    float p3 = fast_exp2(fmaf(s[m][t][3], a.scale_log2, neg_m[m * 2 + 1]));
                    rs0 += p0 + p1, rs1 += p2 + p3;
                    pf[m][t / 2][(t & 1) * 2 + 0] = pack_bf16(p0, p1);
                    pf[m][t / 2][(t & 1) * 2 + 1] = pack_bf16(p2, p3);
                }
                l_run[m * 2] = l_run[m * 2] * corr[m * 2] + rs0;
                l_run[m * 2 + 1] = l_run[m * 2 + 1] * corr[m * 2 + 1] + rs1;
#pragma unroll
                for (int i = 0; i < HD / 8; i++) {
                    o[m][i][0] *= corr[m * 2], o[m][i][1] *= corr[m * 2];
                    o[m][i][2] *= corr[m * 2 + 1], o[m][i][3] *= corr[m * 2 + 1];
                }
            }
            mma_frags_b<HD, MT, kFwdKeys / 16, kStride>(o, pf, tv, lane);
        }
        __syncthreads(); // the next iteration's prefetch overwrites this stage
    }

#pragma unroll
    for (int r = 0; r < 2 * MT; r++) {
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    }
#pragma unroll
    for (int m = 0; m < MT; m++) {
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const int row = wrow + m * 16 + g + rr * 8, qrow = rows.qrow[row], head = rows.head[row];
            if (qrow < 0) continue;
            const float l = l_run[m * 2 + rr], inv = 1.0f / l;
            bf16 *orow = a.out + (size_t)qrow * a.ldo + (size_t)head * HD;
#pragma unroll
            for (int i = 0; i < HD / 8; i++)
                *reinterpret_cast<uint32_t *>(orow + i * 8 + tig * 2) =
                    pack_bf16(o[m][i][rr * 2] * inv, o[m][i][rr * 2 + 1] * inv);
            if (tig == 0) a.lse_out[(size_t)qrow * a.nh + head] = (m_run[m * 2 + rr] + log2f(l)) * kLn2;
        }
    }
}

// ---- backward ----

// D = rowsum(dout * out) per (query row, head): one warp each, lanes over the head dim, a fixed butterfly.
__global__ void delta_kernel(float *delta, const bf16 *dout, int lddo, const bf16 *out, int ldo, int rows, int nh,
                             int hd)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long item = (long long)blockIdx.x * (blockDim.x / 32) + warp;
    if (item >= (long long)rows * nh) return;
    const int r = (int)(item / nh), h = (int)(item % nh);
    const bf16 *d = dout + (size_t)r * lddo + (size_t)h * hd, *o = out + (size_t)r * ldo + (size_t)h * hd;
    float acc = 0.0f;
    for (int i = lane; i < hd; i += 32) acc += __bfloat162float(d[i]) * __bfloat162float(o[i]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) delta[item] = acc;
}

// dq for one query tile (the forward's rows) over DK-key tiles.
template <int HD>
__device__ __forceinline__ void dq_tile(const Args &a, unsigned char *smem_raw, int tile, int kh)
{
    constexpr int MT = tiles<HD>::MT, kDqKeys = tiles<HD>::DK, kQRows = tiles<HD>::kDqRows;
    constexpr int kStride = HD + 8, kTile = kDqKeys * kStride, kNT = kDqKeys / 8;
    __shared__ QRows rows;
    bf16 *sq = reinterpret_cast<bf16 *>(smem_raw);
    bf16 *sdo = sq + kQRows * kStride;
    bf16 *sk = sdo + kQRows * kStride; // 2 stages
    bf16 *sv = sk + 2 * kTile;         // 2 stages
    qrows_setup<16 * MT>(rows, a, tile, kh);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tig = lane & 3;
    const int nct = ntiles(rows.cta[0], kDqKeys), nt = nct + ntiles(rows.cta[1], kDqKeys);
    const int wrow = warp * 16 * MT;

    load_qrows<HD, kQRows>(sq, a.q, a.ldq, rows);
    load_qrows<HD, kQRows>(sdo, a.dout, a.lddo, rows);
    load_kv_tile<HD, kDqKeys>(sk, sv, a, ktile(rows, 0, nct, kDqKeys), kh);
    cp_async_commit();

    // lse (log2 units) and D of the lane's 4 rows; rows past the end have Q = dO = 0 and so dS = 0
    float lse2[2 * MT], dd[2 * MT];
#pragma unroll
    for (int r = 0; r < 2 * MT; r++) {
        const int row = wrow + (r >> 1) * 16 + g + (r & 1) * 8, qrow = rows.qrow[row];
        const size_t i = (size_t)qrow * a.nh + rows.head[row];
        lse2[r] = qrow >= 0 ? a.lse[i] * kLog2e : 0.0f;
        dd[r] = qrow >= 0 ? a.delta[i] : 0.0f;
    }
    float dq[MT][HD / 8][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < HD / 8; i++) dq[m][i][0] = dq[m][i][1] = dq[m][i][2] = dq[m][i][3] = 0.0f;

    for (int it = 0; it < nt; it++) {
        const int stage = it & 1;
        const KTile kt = kv_ring_step<HD, kDqKeys>(sk, sv, a, rows, it, nt, nct, kh);
        const int4 w = rows.warp[kt.src][warp];
        const int k0 = kt.row0;
        if (k0 < w.y && k0 + kDqKeys > w.x) {
            const bf16 *tk = sk + stage * kTile, *tv = sv + stage * kTile;
            const bool need_mask = !(w.z <= k0 && k0 + kDqKeys <= w.w);
            float s[MT][kNT][4], dp[MT][kNT][4];
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int t = 0; t < kNT; t++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[m][t][e] = dp[m][t][e] = 0.0f;
            // S = Q·Kᵀ
            mma_rows_bt<HD, MT, kNT, kStride>(s, sq, wrow, tk, lane);
            // dP = dO·Vᵀ
            mma_rows_bt<HD, MT, kNT, kStride>(dp, sdo, wrow, tv, lane);
            // P = exp(S·scale - lse) (0 where masked), dS = P (dP - D), as bf16 A fragments
            uint32_t dsf[MT][kDqKeys / 16][4];
#pragma unroll
            for (int m = 0; m < MT; m++) {
                int lo0 = INT_MIN, hi0 = INT_MAX, lo1 = INT_MIN, hi1 = INT_MAX;
                if (need_mask) {
                    const int r0 = wrow + m * 16 + g;
                    lo0 = rows.lo[kt.src][r0], hi0 = rows.hi[kt.src][r0];
                    lo1 = rows.lo[kt.src][r0 + 8], hi1 = rows.hi[kt.src][r0 + 8];
                }
#pragma unroll
                for (int t = 0; t < kNT; t++) {
                    float v[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = m * 2 + (e >> 1);
                        float p = fast_exp2(fmaf(s[m][t][e], a.scale_log2, -lse2[r]));
                        if (need_mask) {
                            const int key = k0 + t * 8 + tig * 2 + (e & 1);
                            const int lo = e < 2 ? lo0 : lo1, hi = e < 2 ? hi0 : hi1;
                            if (key < lo || key >= hi) p = 0.0f;
                        }
                        v[e] = p * (dp[m][t][e] - dd[r]);
                    }
                    dsf[m][t / 2][(t & 1) * 2 + 0] = pack_bf16(v[0], v[1]);
                    dsf[m][t / 2][(t & 1) * 2 + 1] = pack_bf16(v[2], v[3]);
                }
            }
            // dQ += dS·K
            mma_frags_b<HD, MT, kDqKeys / 16, kStride>(dq, dsf, tk, lane);
        }
        __syncthreads();
    }

#pragma unroll
    for (int m = 0; m < MT; m++) {
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const int row = wrow + m * 16 + g + rr * 8, qrow = rows.qrow[row];
            if (qrow < 0) continue;
            bf16 *drow = a.dq + (size_t)qrow * a.lddq + (size_t)rows.head[row] * HD;
#pragma unroll
            for (int i = 0; i < HD / 8; i++)
                *reinterpret_cast<uint32_t *>(drow + i * 8 + tig * 2) =
                    pack_bf16(dq[m][i][rr * 2] * a.scale, dq[m][i][rr * 2 + 1] * a.scale);
        }
    }
}

// One step's query rows of a dk/dv CTA: chunk c (64 rows) of block j's B*G rows (head kh*G + g, slot i), with their
// lse and D; rows past the block's B*G are zero (Q = dO = 0, lse = D = 0: P = 1 there but dV, dK get 0 from them).
template <int HD>
__device__ __forceinline__ void load_item(bf16 *sq, bf16 *sdo, float *slse, float *sd, const Args &a, int j, int c,
                                          int kh)
{
    constexpr int kChunks = HD / 8, kStride = HD + 8, kItemRows = tiles<HD>::IR;
    const int GB = a.G * a.B;
#pragma unroll 1
    for (int x = threadIdx.x; x < kItemRows * kChunks; x += blockDim.x) {
        const int r = x / kChunks, col = (x % kChunks) * 8, rho = c * kItemRows + r;
        const bool valid = rho < GB;
        const int gq = valid ? rho / a.B : 0, i = valid ? rho % a.B : 0;
        const size_t qrow = (size_t)j * a.B + i, head = (size_t)kh * a.G + gq;
        cp_async16(sq + r * kStride + col, a.q + (valid ? qrow * a.ldq + head * HD + col : 0), valid);
        cp_async16(sdo + r * kStride + col, a.dout + (valid ? qrow * a.lddo + head * HD + col : 0), valid);
    }
    if (threadIdx.x < kItemRows) {
        const int r = threadIdx.x, rho = c * kItemRows + r;
        const bool valid = rho < GB;
        const size_t i = valid ? ((size_t)j * a.B + rho % a.B) * a.nh + (size_t)kh * a.G + rho / a.B : 0;
        cp_async4(slse + r, a.lse + i, valid);
        cp_async4(sd + r, a.delta + i, valid);
    }
}

// A warp's dK (times the softmax scale) and dV rows out as bf16, from accumulators in the mma layout: its 16 key rows
// from wr0 (rows g and g + 8; those at or past bound are not stored) of kv head kh, into source src's gradients (0
// context, 1 block rows); dk(i, e), dv(i, e) the element e of 8-column group i (e 0, 1: row g, columns 8 i + 2 tig,
// + 1; e 2, 3: row g + 8), as the mma.sync kernels' [i][e] and the wgmma ones' [4 i + e] hold it; store_k, store_v:
// which of the two
template <int HD, class DK, class DV>
__device__ __forceinline__ void store_dkv_rows(const Args &a, int src, int kh, DK dk, DV dv, int wr0, int g, int tig,
                                               int bound, bool store_k = true, bool store_v = true)
{
    bf16 *dkd = src == 0 ? a.dkc : a.dkb, *dvd = src == 0 ? a.dvc : a.dvb;
    const int lddk = src == 0 ? a.lddkc : a.lddkb, lddv = src == 0 ? a.lddvc : a.lddvb;
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const int row = wr0 + g + rr * 8;
        if (row >= bound) continue;
        bf16 *kr = dkd + (size_t)row * lddk + (size_t)kh * HD, *vr = dvd + (size_t)row * lddv + (size_t)kh * HD;
#pragma unroll
        for (int i = 0; i < HD / 8; i++) {
            if (store_k)
                *reinterpret_cast<uint32_t *>(kr + i * 8 + tig * 2) =
                    pack_bf16(dk(i, rr * 2) * a.scale, dk(i, rr * 2 + 1) * a.scale);
            if (store_v)
                *reinterpret_cast<uint32_t *>(vr + i * 8 + tig * 2) = pack_bf16(dv(i, rr * 2), dv(i, rr * 2 + 1));
        }
    }
}

// dk, dv of one 64-row key tile of source src (0: context rows, 1: block rows) of kv head kh; PART 1: dV only, 2: dK
// only, 3: both (tiles<HD>::DKV_PARTS).
enum { kPartDv = 1, kPartDk = 2, kPartBoth = 3 };
template <int HD, int PART>
__device__ __forceinline__ void dkv_tile(const Args &a, unsigned char *smem_raw, int src, int tile, int kh)
{
    constexpr int kItemRows = tiles<HD>::IR, kStride = HD + 8, kQT = kItemRows * kStride;
    constexpr int kKvRows = tiles<HD>::kKvRows, nw = tiles<HD>::BW;
    __shared__ int s_list[nw * 32];
    __shared__ int s_wcount[nw];
    bf16 *sk = reinterpret_cast<bf16 *>(smem_raw);
    bf16 *sv = sk + kKvRows * kStride;
    bf16 *sq = sv + kKvRows * kStride; // 2 stages
    bf16 *sdo = sq + 2 * kQT;          // 2 stages
    float *slse = reinterpret_cast<float *>(sdo + 2 * kQT); // 2 stages of kItemRows
    float *sd = slse + 2 * kItemRows;                         // 2 stages
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tig = lane & 3;
    const int row0 = tile * kKvRows, bound = src == 0 ? a.T : a.N * a.B, rend = min(row0 + kKvRows, bound);
    {
        const bf16 *k = src == 0 ? a.kc : a.kb, *v = src == 0 ? a.vc : a.vb;
        load_rows<HD, kKvRows>(sk, k + (size_t)kh * HD, src == 0 ? a.ldkc : a.ldkb, row0, bound);
        if (PART & kPartDk) load_rows<HD, kKvRows>(sv, v + (size_t)kh * HD, src == 0 ? a.ldvc : a.ldvb, row0, bound);
        cp_async_commit();
    }
    const int wr0 = row0 + warp * 16; // the warp's first key row
    float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[i][e] = dv[i][e] = 0.0f;
    const int nchunk = (a.G * a.B + kItemRows - 1) / kItemRows;
    // candidate blocks: any block for a context tile; for a block-row tile, the blocks owning its rows
    int cand_lo = 0, cand_hi = a.N;
    if (src == 1) cand_lo = row0 / a.B, cand_hi = min(a.N, (rend - 1) / a.B + 1);

    for (int cb = cand_lo; cb < cand_hi; cb += nw * 32) {
        // the blocks of [cb, cb+128) whose interval meets [row0, rend), in block order
        const int items = gather_blocks(a, src, cb, cand_hi, row0, rend, nw, s_wcount, s_list) * nchunk;
        if (items == 0) continue;
        load_item<HD>(sq, sdo, slse, sd, a, s_list[0], 0, kh);
        cp_async_commit();
        for (int it = 0; it < items; it++) {
            const int stage = it & 1;
            cp_async_stage_next(it + 1 < items, [&] {
                const int n = it + 1, ns = stage ^ 1;
                load_item<HD>(sq + ns * kQT, sdo + ns * kQT, slse + ns * kItemRows, sd + ns * kItemRows, a,
                              s_list[n / nchunk], n % nchunk, kh);
            });
            __syncthreads();
            int lo, hi;
            const int jb = s_list[it / nchunk], chunk = it % nchunk;
            block_interval(a, src, jb, lo, hi);
            if (wr0 < hi && wr0 + 16 > lo) { // the block sees some key row of the warp (warp-uniform)
                const bool need_mask = !(lo <= wr0 && wr0 + 16 <= hi);
                const bool vis0 = !need_mask || (lo <= wr0 + g && wr0 + g < hi);
                const bool vis1 = !need_mask || (lo <= wr0 + g + 8 && wr0 + g + 8 < hi);
                const bf16 *tq = sq + stage * kQT, *tdo = sdo + stage * kQT;
                const float *tl = slse + stage * kItemRows, *td = sd + stage * kItemRows;
                // Sᵀ = K·Qᵀ: 16 key rows x 64 query columns
                float st[kItemRows / 8][4];
#pragma unroll
                for (int t = 0; t < kItemRows / 8; t++) st[t][0] = st[t][1] = st[t][2] = st[t][3] = 0.0f;
                mma_rows_bt<HD, kItemRows / 8, kStride>(st, sk, warp * 16, tq, lane);
                // Pᵀ = exp(Sᵀ·scale - lse[column]), 0 on rows the block (under a window: the column's slot) does not see
                uint32_t pa[kItemRows / 16][4];
#pragma unroll
                for (int t = 0; t < kItemRows / 8; t++) {
                    const float l0 = tl[t * 8 + tig * 2] * kLog2e, l1 = tl[t * 8 + tig * 2 + 1] * kLog2e;
                    bool v00 = vis0, v01 = vis0, v10 = vis1, v11 = vis1; // (key row g / g+8, column 2*tig / +1)
                    if (a.W > 0) {
                        const int kr0 = wr0 + g, kr1 = wr0 + g + 8, rho = chunk * kItemRows + t * 8 + tig * 2;
                        int clo, chi;
                        row_interval(a, src, jb, rho % a.B, clo, chi);
                        v00 = v00 && clo <= kr0 && kr0 < chi, v10 = v10 && clo <= kr1 && kr1 < chi;
                        row_interval(a, src, jb, (rho + 1) % a.B, clo, chi);
                        v01 = v01 && clo <= kr0 && kr0 < chi, v11 = v11 && clo <= kr1 && kr1 < chi;
                    }
                    st[t][0] = v00 ? fast_exp2(fmaf(st[t][0], a.scale_log2, -l0)) : 0.0f;
                    st[t][1] = v01 ? fast_exp2(fmaf(st[t][1], a.scale_log2, -l1)) : 0.0f;
                    st[t][2] = v10 ? fast_exp2(fmaf(st[t][2], a.scale_log2, -l0)) : 0.0f;
                    st[t][3] = v11 ? fast_exp2(fmaf(st[t][3], a.scale_log2, -l1)) : 0.0f;
                    pa[t / 2][(t & 1) * 2 + 0] = pack_bf16(st[t][0], st[t][1]);
                    pa[t / 2][(t & 1) * 2 + 1] = pack_bf16(st[t][2], st[t][3]);
                }
                // dV += Pᵀ·dO
                if (PART & kPartDv) {
                    mma_frags_b<HD, kItemRows / 16, kStride>(dv, pa, tdo, lane);
                }
                if (PART & kPartDk) {
                    // dPᵀ = V·dOᵀ
                    float dpt[kItemRows / 8][4];
#pragma unroll
                    for (int t = 0; t < kItemRows / 8; t++) dpt[t][0] = dpt[t][1] = dpt[t][2] = dpt[t][3] = 0.0f;
                    mma_rows_bt<HD, kItemRows / 8, kStride>(dpt, sv, warp * 16, tdo, lane);
                    // dSᵀ = Pᵀ (dPᵀ - D[column])
#pragma unroll
                    for (int t = 0; t < kItemRows / 8; t++) {
                        const float d0 = td[t * 8 + tig * 2], d1 = td[t * 8 + tig * 2 + 1];
                        pa[t / 2][(t & 1) * 2 + 0] = pack_bf16(st[t][0] * (dpt[t][0] - d0), st[t][1] * (dpt[t][1] - d1));
                        pa[t / 2][(t & 1) * 2 + 1] = pack_bf16(st[t][2] * (dpt[t][2] - d0), st[t][3] * (dpt[t][3] - d1));
                    }
                    // dK += dSᵀ·Q
                    mma_frags_b<HD, kItemRows / 16, kStride>(dk, pa, tq, lane);
                }
            }
            __syncthreads(); // the next prefetch overwrites this stage; the next scan overwrites s_list
        }
    }
    cp_async_wait<0>(); // a tile no block sees still has its K/V copy in flight

    // every row of the tile is written (zeros where no block sees it)
    store_dkv_rows<HD>(a, src, kh, [&](int i, int e) { return dk[i][e]; }, [&](int i, int e) { return dv[i][e]; }, wr0,
                       g, tig, bound, PART & kPartDk, PART & kPartDv);
}

// dk/dv CTA w of source src: (key tile, kv head, part) with the part fastest.
template <int HD> __device__ __forceinline__ void dkv_cta(const Args &a, unsigned char *smem_raw, int src, int w)
{
    constexpr int P = tiles<HD>::DKV_PARTS;
    const int tile = w / P / a.nkv, kh = w / P % a.nkv;
    if constexpr (P == 1) dkv_tile<HD, kPartBoth>(a, smem_raw, src, tile, kh);
    else if (w % P == 0) dkv_tile<HD, kPartDv>(a, smem_raw, src, tile, kh);
    else dkv_tile<HD, kPartDk>(a, smem_raw, src, tile, kh);
}

// The backward's CTAs, heaviest kinds first: context dk/dv tiles (row-major over tiles: with sorted anchors the
// first context rows are seen by the most blocks), dq tiles (latest blocks first), block-row dk/dv tiles.
template <int HD>
__global__ void __launch_bounds__(tiles<HD>::BW * 32, 8 / tiles<HD>::BW) bwd_kernel(const Args a, int n_ctx, int n_q)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    int w = blockIdx.x;
    if (w < n_ctx) {
        dkv_cta<HD>(a, smem_raw, 0, w);
        return;
    }
    w -= n_ctx;
    if (w < n_q) {
        dq_tile<HD>(a, smem_raw, n_q / a.nkv - 1 - w / a.nkv, w % a.nkv);
        return;
    }
    w -= n_q;
    dkv_cta<HD>(a, smem_raw, 1, w);
}

// ---- Hopper dk/dv (head_dim 128): wgmma ----
//
// The dk/dv CTA of dkv_tile with its four GEMMs on wgmma (sm_90a): kBwdWgs warpgroups of 64 key rows, looping over
// the blocks that see the tile in block order, one block's 64 query rows (B*G) a step, Q and dO of the next step in
// flight (cp.async, two stages) while this one computes. Per warpgroup and step: Sᵀ = K·Qᵀ and
// dPᵀ = V·dOᵀ (64 x 64, K, V, Q, dO from shared memory, issued together), Pᵀ = exp(Sᵀ - lse) (0 on rows the block
// does not see), dSᵀ = Pᵀ(dPᵀ - D), then dV += Pᵀ·dO and dK += dSᵀ·Q with Pᵀ, dSᵀ as bf16 register A operands (64 x 128
// fp32 accumulators each in registers). Shared tiles are 128-byte swizzled 64-column panels (wgmma_sm90.cuh), written
// by cp.async. Every sum in an order fixed by the shapes alone: deterministic. Without a dS workspace the dq CTAs
// (below) share the launch, as in bwd_kernel; with one they follow it (dq_ws_sm90_kernel) and each context tile's
// blocks are split over a.ctx_parts CTAs (sum_parts).
// key rows a warpgroup; warpgroups a CTA of the forward and of the backward; key rows a dk/dv CTA; query rows a step
constexpr int kWgKeys = 64, kFwdWgs = 2, kBwdWgs = 1, kWgRows = kWgKeys * kBwdWgs, kWgItem = 64;
template <int HD> struct wg_dkv_shape {
    static constexpr int kKBytes = kWgRows * HD * 2;    // K (and V) tile, HD/64 panels of kWgRows rows
    static constexpr int kItemBytes = kWgItem * HD * 2; // Q (and dO) of one step, panels of kWgItem rows
    static constexpr int kDsBytes = kWgKeys * kWgItem * 2; // one dS staging tile (64 query rows x 64 keys, bf16)
    static constexpr int kSmem = 2 * kKBytes + 4 * kItemBytes + 4 * kWgItem * (int)sizeof(float) + kDsBytes + 1024;
};
static_assert((2 * wg_dkv_shape<128>::kKBytes + 4 * wg_dkv_shape<128>::kItemBytes + 4 * kWgItem * 4) % 1024 == 0,
              "wg_dkv_shape: the dS staging tile is a 1024-byte aligned swizzle atom run");

#ifdef DFLASH_SM90A
// The workspace slot of dS tile (key tile `tile` of source src) of step (kv head kh, block j, query chunk c): the
// block's tiles in walk order, from the first one its interval [lo, hi) of that source meets (block_interval). The
// one rule of the dk/dv CTAs that write the tiles and the dq CTAs that read them.
__device__ __forceinline__ size_t ws_slot(const Args &a, int kh, int j, int c, int nchunk, int src, int tile, int lo)
{
    return (((size_t)kh * a.N + j) * nchunk + c) * a.ws_stride + (src ? a.ws_nct : 0) + tile - lo / kWgKeys;
}
#endif

#ifdef DFLASH_SM90A

// chunk (r, ch) of a tile of 64-column panels PANEL_ROWS rows apart, 128-byte swizzled (byte offset)
template <int PANEL_ROWS> __device__ __forceinline__ int sw_off(int r, int ch)
{
    return (ch >> 3) * PANEL_ROWS * 128 + r * 128 + (((ch & 7) ^ (r & 7)) << 4);
}

// rows [row0, row0+ROWS) of a (bound, HD) slice into a swizzled tile by the CTA's NT threads; rows >= bound zero.
// Thread t copies chunk t % (HD/8) of rows t / (HD/8) + k·NT/(HD/8): the swizzle and the 32-bit offsets step by a
// constant from its first row's.
template <int HD, int ROWS, int NT>
__device__ __forceinline__ void sw_load_rows(unsigned char *tile, const bf16 *base, int ld, int row0, int bound)
{
    constexpr int kChunks = HD / 8, kStep = NT / kChunks;
    static_assert(NT % kChunks == 0 && ROWS % kStep == 0 && kStep % 8 == 0, "sw_load_rows: the CTA's threads");
    const int ch = (int)threadIdx.x % kChunks, r0 = (int)threadIdx.x / kChunks;
    const bf16 *b0 = base + (size_t)row0 * ld + ch * 8;
    const int off0 = sw_off<ROWS>(r0, ch);
#pragma unroll
    for (int k = 0; k < ROWS / kStep; k++) {
        const int r = r0 + k * kStep;
        const bool valid = row0 + r < bound;
        cp_async16(tile + off0 + k * kStep * 128, valid ? b0 + r * ld : base, valid);
    }
}

// one step's query rows (as load_item: chunk c of block j's B*G rows, head kh*G + g, slot i), swizzled, by the CTA's
// NT threads. Thread t copies 16-byte chunk t % (HD/8) of rows t / (HD/8) + k·s, s = NT/(HD/8): one division a step,
// the next row's (head, slot) by adding s slots (one wrap at most when B >= s), 32-bit offsets from the block's first
// row, and each row's swizzled chunk s rows (128·s bytes) after the last's.
template <int HD, int NT, int UNROLL = kWgItem / (NT / (HD / 8))>
__device__ __forceinline__ void sw_load_item(unsigned char *sq, unsigned char *sdo, float *slse, float *sd,
                                             const Args &a, int j, int c, int kh)
{
    constexpr int kChunks = HD / 8, kStep = NT / kChunks; // rows between a thread's rows
    static_assert(NT % kChunks == 0 && kWgItem % kStep == 0 && kStep % 8 == 0, "sw_load_item: the CTA's threads");
    const int GB = a.G * a.B, ch = (int)threadIdx.x % kChunks, r0 = (int)threadIdx.x / kChunks;
    const int rho0 = c * kWgItem + r0;
    int g = rho0 / a.B, i = rho0 - g * a.B;
    const size_t col = (size_t)kh * a.G * HD + ch * 8;
    const bf16 *qb = a.q + (size_t)j * a.B * a.ldq + col, *db = a.dout + (size_t)j * a.B * a.lddo + col;
    const int off0 = sw_off<kWgItem>(r0, ch); // (r0 + kStep·k) & 7 == r0 & 7: the same swizzle
#pragma unroll UNROLL
    for (int k = 0; k < kWgItem / kStep; k++) {
        const int rho = rho0 + k * kStep;
        if (k > 0) {
            if (a.B >= kStep) {
                i += kStep;
                const bool wrap = i >= a.B;
                i -= wrap ? a.B : 0, g += wrap;
            } else {
                g = rho / a.B, i = rho - g * a.B;
            }
        }
        const bool valid = rho < GB;
        const int off = off0 + k * kStep * 128;
        cp_async16(sq + off, qb + (valid ? i * a.ldq + g * HD : 0), valid);
        cp_async16(sdo + off, db + (valid ? i * a.lddo + g * HD : 0), valid);
    }
    if (threadIdx.x < kWgItem) {
        const int r = threadIdx.x, rho = c * kWgItem + r;
        const bool valid = rho < GB;
        const size_t i = valid ? ((size_t)j * a.B + rho % a.B) * a.nh + (size_t)kh * a.G + rho / a.B : 0;
        cp_async4(slse + r, a.lse + i, valid);
        cp_async4(sd + r, a.delta + i, valid);
    }
}

// The descriptor of the tile `bytes` (a multiple of 16) past the one d describes: its start address field (bits 0-13,
// the shared address >> 4) plus bytes >> 4, which never carries into the next field as shared memory ends below
// 256 KB. One add where a descriptor built afresh costs a mask, a shift and an or (per wgmma, per step).
__device__ __forceinline__ uint64_t desc_at(uint64_t d, uint32_t bytes)
{
    return (d & 0xFFFFFFFF00000000ull) | (uint32_t)((uint32_t)d + (bytes >> 4)); // the high word stays a constant
}

template <int N> __device__ __forceinline__ void fence_frags(uint32_t (&p)[N][4])
{
#pragma unroll
    for (int k = 0; k < N; k++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(p[k][e])::"memory");
}
#endif

#ifdef DFLASH_SM90A
// The wgmma CTAs' two-stage ring step: the next stage's copies (cp_async_stage_next), this thread's landed copies made
// visible to the async proxy (the wgmma reads the tiles), the CTA barrier
template <class Load> __device__ __forceinline__ void wg_stage_next(bool more, Load &&load)
{
    cp_async_stage_next(more, load);
    wgmma_sm90::fence_proxy_async();
    __syncthreads();
}

// Part `part` of dk/dv tile slot `slot` (of `parts`): its dK|dV accumulators to its fp32 partial (thread-major:
// element i of thread t at i·128 + t, coalesced); the last part to finish (a device-scope counter) sums every part's
// partial in part order into dk, dv and returns true, the others false. The order of the sum is fixed by the part
// index alone, whoever finishes last: deterministic.
// sum_parts_at: the same for the warpgroup whose thread tid (0..127) this is, its flag s_last (shared) and its barrier
// (sync: over its 128 threads).
template <int HD, class Sync>
__device__ __forceinline__ bool sum_parts_at(const Args &a, float (&dk)[HD / 2], float (&dv)[HD / 2], int slot,
                                             int part, int parts, unsigned tid, int &s_last, Sync &&sync)
{
    constexpr int kPart = HD * 128; // floats of one partial: dK then dV, HD/2 each per thread
    float *base = a.dkv_part + (size_t)slot * parts * kPart;
    float *mine = base + (size_t)part * kPart;
#pragma unroll
    for (int i = 0; i < HD / 2; i++) {
        __stcg(mine + i * 128 + tid, dk[i]);
        __stcg(mine + (HD / 2 + i) * 128 + tid, dv[i]);
    }
    __threadfence();
    sync();
    if (tid == 0) s_last = atomicAdd(a.dkv_count + slot, 1) == parts - 1;
    sync();
    if (!s_last) return false;
    __threadfence();
#pragma unroll
    for (int i = 0; i < HD / 2; i++) {
        dk[i] = __ldcg(base + i * 128 + tid);
        dv[i] = __ldcg(base + (HD / 2 + i) * 128 + tid);
    }
    for (int p = 1; p < parts; p++) {
        const float *pp = base + (size_t)p * kPart;
#pragma unroll
        for (int i = 0; i < HD / 2; i++) {
            dk[i] += __ldcg(pp + i * 128 + tid);
            dv[i] += __ldcg(pp + (HD / 2 + i) * 128 + tid);
        }
    }
    return true;
}
template <int HD>
__device__ __forceinline__ bool sum_parts(const Args &a, float (&dk)[HD / 2], float (&dv)[HD / 2], int slot, int part,
                                       int parts)
{
    static_assert(kBwdWgs == 1, "sum_parts: one warpgroup a dk/dv CTA");
    __shared__ int s_last;
    return sum_parts_at<HD>(a, dk, dv, slot, part, parts, threadIdx.x, s_last, [] { __syncthreads(); });
}

// The warpgroup's dSᵀ fragments (da: A fragments of 64 key rows x 64 query rows, warp w rows 16w..16w+15) to the
// workspace tile dst as dS, the 128-byte-swizzled K-major image the dq GEMM takes as its A operand (row = query row,
// 128 bytes of keys, as issue_s's Q): transposed into the shared staging tile sds by stmatrix .trans (one x4 per
// k16 fragment; its eight 16-byte rows a matrix on distinct swizzled chunks), one warpgroup barrier, 16-byte
// coalesced copies out. The caller's barrier before the next step keeps sds from being overwritten while it is read.
// store_ds_tile_at: the same for the warpgroup whose thread tid (0..127) this is and whose named barrier is bar.
// BULK: the copy out is one 8 KB bulk copy by thread 0 (after every thread's stmatrix is made visible to the async
// proxy); the caller's barrier before the next step must then follow thread 0's bulk_wait_read<0> (the copy has read
// the tile), and thread 0 waits for the copies' writes (bulk_wait<0>) before the CTA ends.
template <bool BULK = false>
__device__ __forceinline__ void store_ds_tile_at(unsigned char *sds, const uint32_t (&da)[kWgItem / 16][4], bf16 *dst,
                                                 unsigned tid, int bar)
{
    const int warp = tid / 32, lane = tid % 32, m = lane >> 3, i = lane & 7;
    // fragment kk's matrix m (register m): keys 16w + 8 (m & 1) .., query rows 16 kk + 8 (m >> 1) ..; transposed,
    // its row i (lane 8m + i's address) is query row n = 16 kk + 8 (m >> 1) + i: keys chunk 2w + (m & 1), n & 7 = i
    const uint32_t base = mma_sm80::smem_u32(sds) + (8 * (m >> 1) + i) * 128 + (((2 * warp + (m & 1)) ^ i) << 4);
#pragma unroll
    for (int kk = 0; kk < kWgItem / 16; kk++)
        asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(base + kk * 2048),
                     "r"(da[kk][0]), "r"(da[kk][1]), "r"(da[kk][2]), "r"(da[kk][3])
                     : "memory");
    if constexpr (BULK) {
        wgmma_sm90::fence_proxy_async(); // this thread's stmatrix, to the bulk copy's async proxy
        wgmma_sm90::named_sync(bar, 128);
        if (tid == 0) {
            wgmma_sm90::bulk_store(dst, sds, kWgKeys * kWgItem * 2);
            wgmma_sm90::bulk_commit();
        }
        return;
    }
    wgmma_sm90::named_sync(bar, 128);
    uint4 *gd = reinterpret_cast<uint4 *>(dst);
    const uint4 *sd = reinterpret_cast<const uint4 *>(sds);
#pragma unroll 1
    for (int c = tid; c < kWgKeys * kWgItem * 2 / 16; c += 128) gd[c] = sd[c];
}
__device__ __forceinline__ void store_ds_tile(unsigned char *sds, const uint32_t (&da)[kWgItem / 16][4], bf16 *dst)
{
    static_assert(kBwdWgs == 1, "store_ds_tile: one warpgroup a dk/dv CTA (its barrier, its 128 threads)");
    store_ds_tile_at(sds, da, dst, threadIdx.x, 1);
}

// The pieces of one dk/dv step (64 key rows of the warpgroup x one 64-row query chunk of block jb), shared by the
// serial loop and the pipelined one (dkv_steps). Step addresses: K, V (kaddr, vaddr) and the stage's Q, dO (qaddr,
// doaddr, shared), its lse and D (tl, td).
struct DkvStep {
    uint32_t qaddr, doaddr;
    const float *tl, *td;
};

// Sᵀ = K·Qᵀ (kaddr: K) or dPᵀ = V·dOᵀ (kaddr: V, qaddr: dO) as one commit group: HD/16 k16 steps (32 bytes along a
// panel row, the next panel every 4)
template <int HD> __device__ __forceinline__ void dkv_issue_t(float (&st)[32], uint32_t kaddr, uint32_t qaddr)
{
    using namespace wgmma_sm90;
    const uint64_t kdesc = sw128_desc(kaddr, 16, 1024), qdesc = sw128_desc(qaddr, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const uint32_t off = (uint32_t)(kk / 4) * kWgRows * 128 + (kk % 4) * 32;
        const uint32_t qoff = (uint32_t)(kk / 4) * kWgItem * 128 + (kk % 4) * 32;
        if (kk == 0) wgmma_ss_m64n64k16_first(st, desc_at(kdesc, off), desc_at(qdesc, qoff));
        else wgmma_ss_m64n64k16(st, desc_at(kdesc, off), desc_at(qdesc, qoff), 1);
    }
    wgmma_commit();
}

// Pᵀ = exp(Sᵀ·scale - lse[column]) in place and as bf16 A fragments, 0 on key rows the block (under a window: the
// column's slot) does not see; accumulator (t, e): key row g (e < 2) or g + 8, column 8t + 2·tig + (e & 1). wr0: the
// warp's first key row; [lo, hi): block jb's interval of source src; chunk: the step's query chunk.
__device__ __forceinline__ void dkv_p(const Args &a, float (&st)[32], uint32_t (&pa)[kWgItem / 16][4], const float *tl,
                                      int wr0, int lo, int hi, int src, int jb, int chunk)
{
    const int lane = threadIdx.x % 32, g = lane >> 2, tig = lane & 3;
    const int kr0 = wr0 + g, kr1 = wr0 + g + 8;
    const bool vis0 = lo <= kr0 && kr0 < hi, vis1 = lo <= kr1 && kr1 < hi;
#pragma unroll
    for (int t = 0; t < kWgItem / 8; t++) {
        const float2 lt = *reinterpret_cast<const float2 *>(tl + t * 8 + tig * 2);
        const float l0 = lt.x * kLog2e, l1 = lt.y * kLog2e;
        bool v00 = vis0, v01 = vis0, v10 = vis1, v11 = vis1;
        if (a.W > 0) {
            const int rho = chunk * kWgItem + t * 8 + tig * 2;
            int clo, chi;
            row_interval(a, src, jb, rho % a.B, clo, chi);
            v00 = v00 && clo <= kr0 && kr0 < chi, v10 = v10 && clo <= kr1 && kr1 < chi;
            row_interval(a, src, jb, (rho + 1) % a.B, clo, chi);
            v01 = v01 && clo <= kr0 && kr0 < chi, v11 = v11 && clo <= kr1 && kr1 < chi;
        }
        float *s4 = st + 4 * t;
        s4[0] = v00 ? fast_exp2(fmaf(s4[0], a.scale_log2, -l0)) : 0.0f;
        s4[1] = v01 ? fast_exp2(fmaf(s4[1], a.scale_log2, -l1)) : 0.0f;
        s4[2] = v10 ? fast_exp2(fmaf(s4[2], a.scale_log2, -l0)) : 0.0f;
        s4[3] = v11 ? fast_exp2(fmaf(s4[3], a.scale_log2, -l1)) : 0.0f;
        pa[t / 2][(t & 1) * 2 + 0] = pack_bf16(s4[0], s4[1]);
        pa[t / 2][(t & 1) * 2 + 1] = pack_bf16(s4[2], s4[3]);
    }
}

// dSᵀ = Pᵀ (dPᵀ - D[column]) as bf16 A fragments
__device__ __forceinline__ void dkv_ds(const float (&pt)[32], const float (&dpt)[32], uint32_t (&da)[kWgItem / 16][4],
                                       const float *td)
{
    const int tig = threadIdx.x % 4;
#pragma unroll
    for (int t = 0; t < kWgItem / 8; t++) {
        const float2 dt = *reinterpret_cast<const float2 *>(td + t * 8 + tig * 2);
        const float d0 = dt.x, d1 = dt.y;
        const float *s4 = pt + 4 * t, *p4 = dpt + 4 * t;
        da[t / 2][(t & 1) * 2 + 0] = pack_bf16(s4[0] * (p4[0] - d0), s4[1] * (p4[1] - d1));
        da[t / 2][(t & 1) * 2 + 1] = pack_bf16(s4[2] * (p4[2] - d0), s4[3] * (p4[3] - d1));
    }
}

// dV += Pᵀ·dO, dK += dSᵀ·Q issued as two commit groups: dO and Q MN-major (the reduction over query rows = tile rows):
// panels kWgItem·128 bytes apart, 8-row groups 1024, 16 rows (2048 bytes) a step
template <int HD>
__device__ __forceinline__ void dkv_issue_dv_dk(float (&dv)[HD / 2], float (&dk)[HD / 2],
                                                uint32_t (&pa)[kWgItem / 16][4], uint32_t (&da)[kWgItem / 16][4],
                                                const DkvStep &p)
{
    using namespace wgmma_sm90;
    fence_frags<kWgItem / 16>(pa);
    fence_frags<kWgItem / 16>(da);
    const uint64_t dot = sw128_desc(p.doaddr, kWgItem * 128, 1024), qt = sw128_desc(p.qaddr, kWgItem * 128, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kWgItem / 16; kk++) wgmma_rs_m64n128k16_tb(dv, pa[kk], desc_at(dot, kk * 2048), 1);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kWgItem / 16; kk++) wgmma_rs_m64n128k16_tb(dk, da[kk], desc_at(qt, kk * 2048), 1);
    wgmma_commit();
}

// dk/dv CTA w of source src: key tile w / nkv of kv head w % nkv. The step loop is pipelined (FlashAttention-3's
// intra-warpgroup pipelining): step it+1's Sᵀ is issued right behind step it's dV and dK and the wait for those (wgmma
// groups complete in order) lets it run on, so the tensor pipe runs dV(it), dK(it), Sᵀ(it+1), dPᵀ(it+1) back to back.
// On the H200 (bench/RESULTS.md, 2026-12-05) every row passed with it and the 8B backward took 1.87 ms against the
// serial loop's 1.99 (issue Sᵀ, dPᵀ; exp; dSᵀ; issue dV, dK; wait for all; 0.68 against 0.72 under a 256-row window),
// which is gone since.
template <int HD>
__device__ __forceinline__ void dkv_sm90(const Args &a, unsigned char *smem, int src, int w)
{
    static_assert(HD == 128, "dkv_sm90: head_dim 128 (the accumulators of 64 x HD, the n128 wgmma)");
    static_assert(kBwdWgs == 1, "dkv_sm90: one warpgroup a CTA (gather_blocks' blocks all see its rows; barriers)");
    using S = wg_dkv_shape<HD>;
    using namespace wgmma_sm90;
    constexpr int nw = kBwdWgs * 4;
    __shared__ int s_list[nw * 32];
    __shared__ int s_wcount[nw];
    unsigned char *sk = smem, *sv = sk + S::kKBytes, *sq = sv + S::kKBytes, *sdo = sq + 2 * S::kItemBytes;
    float *slse = reinterpret_cast<float *>(sdo + 2 * S::kItemBytes), *sd = slse + 2 * kWgItem;
    unsigned char *sds = reinterpret_cast<unsigned char *>(sd + 2 * kWgItem); // dSᵀ staging (a.dsw)
    const int parts = src == 0 ? a.ctx_parts : 1; // CTA w: (tile, part) w / nkv of kv head w % nkv
    const int tile = w / a.nkv / parts, part = w / a.nkv % parts, kh = w % a.nkv;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tig = lane & 3;
    const int row0 = tile * kWgRows, bound = src == 0 ? a.T : a.N * a.B, rend = min(row0 + kWgRows, bound);
    {
        const bf16 *k = src == 0 ? a.kc : a.kb, *v = src == 0 ? a.vc : a.vb;
        sw_load_rows<HD, kWgRows, nw * 32>(sk, k + (size_t)kh * HD, src == 0 ? a.ldkc : a.ldkb, row0, bound);
        sw_load_rows<HD, kWgRows, nw * 32>(sv, v + (size_t)kh * HD, src == 0 ? a.ldvc : a.ldvb, row0, bound);
        cp_async_commit();
    }
    const int wr0 = row0 + warp * 16;
    const uint32_t kaddr = mma_sm80::smem_u32(sk), vaddr = mma_sm80::smem_u32(sv);
    float dk[HD / 2], dv[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) dk[i] = dv[i] = 0.0f;
    const int nchunk = (a.G * a.B + kWgItem - 1) / kWgItem;
    int cand_lo = (int)((long long)a.N * part / parts), cand_hi = (int)((long long)a.N * (part + 1) / parts);
    if (src == 1) cand_lo = row0 / a.B, cand_hi = min(a.N, (rend - 1) / a.B + 1);
    // the pipelined loop's: stage s of a step (its Q, dO, lse, D), its copy, the dSᵀ tile out
    auto step_at = [&](int s) {
        return DkvStep{mma_sm80::smem_u32(sq + s * S::kItemBytes), mma_sm80::smem_u32(sdo + s * S::kItemBytes),
                       slse + s * kWgItem, sd + s * kWgItem};
    };
    auto load_step = [&](int s, int li, int chunk) {
        sw_load_item<HD, nw * 32>(sq + s * S::kItemBytes, sdo + s * S::kItemBytes, slse + s * kWgItem, sd + s * kWgItem,
                                  a, s_list[li], chunk, kh);
    };
    // step (li, chunk)'s dSᵀ out for the dq CTAs while its dV, dK run
    auto store_ds = [&](const uint32_t (&da)[kWgItem / 16][4], int li, int chunk, int lo) {
        if (a.dsw)
            store_ds_tile(sds, da, a.dsw + ws_slot(a, kh, s_list[li], chunk, nchunk, src, tile, lo) * (kWgKeys * kWgItem));
    };

    // Every block of s_list sees some key row of the tile (gather_blocks: lo < rend, hi > row0), so every step computes.
    for (int cb = cand_lo; cb < cand_hi; cb += nw * 32) {
        const int items = gather_blocks(a, src, cb, cand_hi, row0, rend, nw, s_wcount, s_list) * nchunk;
        if (items == 0) continue;
        load_step(0, 0, 0);
        cp_async_commit();
        // Stage it & 1 holds step it. Step it+1's Sᵀ is issued right behind step it's dV, dK; once those are
        // done (the wait lets Sᵀ(it+1) run on), stage it & 1 is refilled with step it+2 (the copies have a step to
        // land, waited for before Sᵀ(it+2)) and dPᵀ(it+1) is issued: its accumulators take the registers of Pᵀ,
        // dSᵀ, so dK, dV, Sᵀ, dPᵀ and the fragments never all live at once (255 registers).
        float st[32], dpt[32];
        uint32_t pa[kWgItem / 16][4], da[kWgItem / 16][4];
        // step i's block and chunk from i alone (one live counter; nchunk is 1 for B·G = 64)
        auto load_nth = [&](int s, int i) { load_step(s, i / nchunk, i % nchunk); };
        if (items > 1) {
            load_nth(1, 1);
            cp_async_commit();
            cp_async_wait<1>(); // K, V and step 0
        } else {
            cp_async_wait<0>();
        }
        fence_proxy_async(); // this thread's copies, visible to the wgmma (async proxy) after the barrier
        __syncthreads();
        dkv_issue_t<HD>(st, kaddr, step_at(0).qaddr);
        dkv_issue_t<HD>(dpt, vaddr, step_at(0).doaddr);
        for (int it = 0;; it++) { // the next step's wgmma issued on every way round: no branch between a wgmma and its wait
            const int stage = it & 1, li = it / nchunk, chunk = it - li * nchunk;
            wgmma_wait<1>(); // Sᵀ(it) done (dPᵀ(it) may run)
            fence_regs(st);
            int lo, hi;
            block_interval(a, src, s_list[li], lo, hi);
            dkv_p(a, st, pa, step_at(stage).tl, wr0, lo, hi, src, s_list[li], chunk);
            wgmma_wait<0>(); // dPᵀ(it)
            fence_regs(dpt);
            dkv_ds(st, dpt, da, step_at(stage).td);
            dkv_issue_dv_dk<HD>(dv, dk, pa, da, step_at(stage));
            store_ds(da, li, chunk, lo);
            if (it + 1 == items) break;
            cp_async_wait<0>(); // step it+1's copies (this thread's), then everyone's: the wgmma may read them
            fence_proxy_async();
            __syncthreads(); // also: the dS staging tile is read out before step it+1 rewrites it
            const DkvStep n = step_at(stage ^ 1);
            dkv_issue_t<HD>(st, kaddr, n.qaddr);
            wgmma_wait<1>(); // dV(it), dK(it) done; Sᵀ(it+1) may run
            fence_frags<kWgItem / 16>(pa);
            fence_frags<kWgItem / 16>(da);
            if (it + 2 < items) {
                __syncthreads(); // every warp's dV/dK(it) done: this stage is free
                load_nth(stage, it + 2);
                cp_async_commit();
            }
            dkv_issue_t<HD>(dpt, vaddr, n.doaddr);
        }
        wgmma_wait<0>(); // the batch's last dV/dK
        fence_regs(dv);
        fence_regs(dk);
        fence_frags<kWgItem / 16>(pa);
        fence_frags<kWgItem / 16>(da);
        __syncthreads(); // the next scan overwrites s_list, the next batch's first copy stage 0
    }
    cp_async_wait<0>(); // a tile no block sees still has its K/V copy in flight
    if (parts > 1 && !sum_parts<HD>(a, dk, dv, tile * a.nkv + kh, part, parts)) return; // another part writes the tile

    store_dkv_rows<HD>(
        a, src, kh, [&](int i, int e) { return dk[4 * i + e]; }, [&](int i, int e) { return dv[4 * i + e]; }, wr0, g,
        tig, bound);
}
#endif

// ---- the dk/dv CTAs of a producer and two consumer warpgroups (DFLASH_ATTENTION_DKV=wg2, with the dS workspace) ----
//
// FlashAttention-3's backward shape: a CTA owns 128 key rows of one kv head, consumer warpgroup c (1 + c of the CTA)
// the 64-key tile 2·tile2 + c of today's dk/dv CTAs (its own K, V in shared memory, its dK, dV in registers, its own
// dS staging tile and workspace tiles, its own context partial and counter), and the producer warpgroup (0) stages
// each step's Q, dO, lse and D once for both through a ring of stages (cp.async by its 128 threads, each step's
// copies announced on the stage's "full" mbarrier as wg2_sched says; each consumer warp arrives on the stage's "empty"
// one when its GEMMs have read the stage). setmaxnreg
// moves registers from the producer to the consumers. The steps are the CTA's blocks (gather_blocks over its 128 rows)
// x query chunks in block order, as today; consumer c computes a step exactly when today's CTA of its 64-key tile has
// that block in its list (gather_blocks' test on its own rows: lo < hi, lo < min(its end, bound), hi > its first row),
// else it waits for the stage and arrives on its empty barrier only. So each of its dK, dV rows sums the same terms in
// the same order, each through the same instructions (dkv_issue_t, dkv_p, dkv_ds, dkv_issue_dv_dk as the pipelined
// loop; the serial loop's math written out), and each dS tile it writes is today's, in today's slot: the same bits.
// Context tiles split over a.ctx_parts CTAs by the same block ranges, each consumer summing its own 64-key tile's
// partials (sum_parts_at) in part order. A consumer whose 64 rows lie past the source's end (the last 128-row tile of
// an odd count) sees no block, and writes nothing.
constexpr int kWg2Consumers = 2, kWg2Threads = (kWg2Consumers + 1) * 128;
constexpr int kWg2Rows = kWg2Consumers * kWgKeys; // key rows a CTA
// launched at 168 registers a thread (384 threads, one CTA an SM): the producer's 128 threads free 128 x (168 - 24),
// the consumers' 256 take exactly that, 256 x (240 - 168) (an inc the frees do not cover would wait forever)
[[maybe_unused]] constexpr int kWg2ProducerRegs = 24, kWg2ConsumerRegs = 240;
static_assert(128 * (168 - kWg2ProducerRegs) == 256 * (kWg2ConsumerRegs - 168), "the consumers take what the producer frees");
// The schedule of the wg2 dk/dv CTAs, one row of kDkvVariants (below) each: the ring's stages, how a stage's copies
// are announced, and whether a consumer pipelines its steps. Waited (the first): each producer thread waits for the
// step before's copies (cp.async.wait_group) once this step's are issued, makes them visible to the async proxy, and
// each producer warp arrives once: two steps' copies in flight at most. Tracked: each producer thread's
// cp.async.mbarrier.arrive.noinc arrives on the stage's full barrier when its copies (and all its earlier ones: K and V
// before the first step) have landed, and the producer goes on: up to STAGES steps in flight; the consumers make the
// landed copies visible to their wgmma (fence.proxy.async) after the wait. Pipelined: as dkv_sm90's loop, a step's
// dV, dK run on under the next step's Sᵀ. Turns (not with pipelined): the two consumers take turns at the tensor
// cores (turn_begin / turn_end on named barriers 3 and 4), two turns a step: the issue of Sᵀ and dPᵀ, then of dV and
// dK, so one's GEMMs run under the other's exp and dS; a consumer that skips a step still takes both turns. Bulk dS:
// each step's dS tile goes out as one bulk copy by the consumer's thread 0 (store_ds_tile_at<true>), not by 128
// threads' loads and stores. TMA (where wg2_tma_shape allows, else the same schedule on cp.async): the bulk tensor copy
// engine stages the tiles, as the causal attention's producer does (its cp.async staging measured 2.2x slower,
// bench/RESULTS.md): K and V of both consumers once, on their own barrier (kv); each step's Q and dO as boxes of B rows
// x 64 columns, one a query head and panel, by producer thread 0 on the stage's full barrier with their byte count;
// lse and D by producer warp 1's cp.async, each lane arriving as its copies land (noinc). The boxes land where
// sw_load_item puts the rows (a head's B rows start on a 1024-byte swizzle atom: B % 8 == 0), rows past the block's
// B·G stay zero from the start (B·G < 64, the one chunk). The same values through the same instructions in the same
// order every way, so the same bits.
template <int STAGES, bool TRACKED, bool PIPELINED, bool TURNS = false, bool BULK_DS = false, bool TMA = false>
struct wg2_sched {
    static constexpr int kStages = STAGES;
    static constexpr bool kTracked = TRACKED, kPipelined = PIPELINED, kTurns = TURNS, kBulkDs = BULK_DS, kTma = TMA;
    // each producer thread (tracked), each producer warp (waited), or (TMA) thread 0's expect_tx and warp 1's lanes
    static constexpr uint32_t kFullArrivals = TMA ? 1 + 32 : TRACKED ? 128 : 4;
    using CpAsync = wg2_sched<STAGES, TRACKED, PIPELINED, TURNS, BULK_DS, false>; // where TMA cannot stage the shape
};
template <int HD, class R> struct wg2_dkv_shape { // R: its wg2_sched
    static constexpr int kKBytes = kWgKeys * HD * 2;  // one consumer's K (and V) tile: HD/64 panels of 64 rows
    static constexpr int kItemBytes = kWgItem * HD * 2; // Q (and dO) of one step
    static constexpr int kDsBytes = kWgKeys * kWgItem * 2;
    static constexpr int kStageOff = 2 * kWg2Consumers * kKBytes;                 // K0, K1, V0, V1
    static constexpr int kDsOff = kStageOff + 2 * R::kStages * kItemBytes;          // the stages' Q, then their dO
    static constexpr int kRowOff = kDsOff + kWg2Consumers * kDsBytes;               // the consumers' dS staging tiles
    static constexpr int kBarOff = kRowOff + 2 * R::kStages * kWgItem * (int)sizeof(float); // lse, D of each stage
    static constexpr int kSmem = kBarOff + (2 * R::kStages + R::kTma) * 8 + 1024;   // full, empty (kv); to align
    static_assert(kDsOff % 1024 == 0 && kDsBytes % 1024 == 0, "wg2_dkv_shape: the swizzled tiles on 1024-byte atoms");
    static_assert(kSmem + 2048 <= 227 * 1024, "wg2_dkv_shape: the ring and the static lists within an SM's shared memory");
    static_assert(R::kFullArrivals == (R::kTma ? 33u : R::kTracked ? 128u : 4u),
                  "wg2_dkv_shape: a full barrier's arrivals, as announced");
    static_assert(!R::kPipelined || R::kStages >= 2, "wg2_dkv_shape: a pipelined consumer holds a stage a step longer");
    static_assert(!(R::kPipelined && R::kTurns), "wg2_dkv_shape: a pipelined step's waits would hold the turn");
    static_assert(!R::kBulkDs || kDsBytes % 16 == 0, "wg2_dkv_shape: a bulk copy moves 16-byte units");
};

// The tensor maps of the TMA-staged wg2 CTAs: q and dout (N·B rows of nh·HD columns, boxes of B rows), kc, vc (T rows)
// and kb, vb (N·B rows) of nkv·HD columns, boxes of 64 rows; all 64-column boxes, 128-byte swizzled.
struct Wg2Maps {
    CUtensorMap q, dout, kc, vc, kb, vb;
};
// whether TMA can stage a step of shape (B, G) as sw_load_item does: a head's B rows start on a 1024-byte swizzle atom
// (B % 8 == 0), a chunk holds whole heads (64 % B == 0), and either one chunk (B·G <= 64: its rows past B·G zeroed
// once) or only full ones (B·G % 64 == 0)
inline bool wg2_tma_shape(int B, int G)
{
    return B % 8 == 0 && kWgItem % B == 0 && (B * G <= kWgItem || B * G % kWgItem == 0);
}

#ifdef DFLASH_SM90A
// one step's Q and dO by TMA (producer thread 0): chunk c of block j's B·G rows (heads c·64/B ..), each head's B rows
// and panel one box onto the stage's full barrier, announced with their byte count
template <int HD>
__device__ __forceinline__ void wg2_tma_item(unsigned char *sq, unsigned char *sdo, uint64_t *full, const Wg2Maps *m,
                                             const Args &a, int j, int c, int kh)
{
    using namespace wgmma_sm90;
    const int g0 = c * kWgItem / a.B, g1 = min(a.G, g0 + kWgItem / a.B);
    mbar_arrive_expect_tx(full, (uint32_t)((g1 - g0) * a.B * 2 * HD * 2));
    for (int g = g0; g < g1; g++) {
        const int r = g * a.B - c * kWgItem; // the head's first row in the tile (a multiple of 8)
#pragma unroll
        for (int p = 0; p < HD / 64; p++) {
            const int col = (kh * a.G + g) * HD + p * 64, off = p * kWgItem * 128 + r * 128;
            tma_load_2d(sq + off, &m->q, col, j * a.B, full);
            tma_load_2d(sdo + off, &m->dout, col, j * a.B, full);
        }
    }
}
// one step's lse and D by producer warp 1 (lane: rows lane and lane + 32, as sw_load_item), each lane arriving on the
// stage's full barrier once its copies have landed
__device__ __forceinline__ void wg2_rows_item(float *slse, float *sd, uint64_t *full, const Args &a, int j, int c, int kh,
                                              int lane)
{
    const int GB = a.G * a.B;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = lane + 32 * h, rho = c * kWgItem + r;
        const bool valid = rho < GB;
        const size_t i = valid ? ((size_t)j * a.B + rho % a.B) * a.nh + (size_t)kh * a.G + rho / a.B : 0;
        cp_async4(slse + r, a.lse + i, valid);
        cp_async4(sd + r, a.delta + i, valid);
    }
    cp_async_mbar_arrive_noinc(full);
}

// CTA w of source src (w < n_ctx: context, (tile2, part) w / nkv of kv head w % nkv; else block rows); R: its wg2_sched
template <int HD, class R>
__device__ __forceinline__ void dkv_wg2_sm90(const Args &a, unsigned char *smem, int n_ctx, const Wg2Maps *maps)
{
    static_assert(HD == 128, "dkv_wg2_sm90: head_dim 128 (the accumulators of 64 x HD, the n128 wgmma)");
    using S = wg2_dkv_shape<HD, R>;
    constexpr int kStages = R::kStages;
    using namespace wgmma_sm90;
    constexpr int nw = kWg2Threads / 32;
    __shared__ int s_list[nw * 32];
    __shared__ int s_wcount[nw];
    __shared__ int s_last[kWg2Consumers];
    unsigned char *sk = smem, *sv = sk + kWg2Consumers * S::kKBytes, *sq = smem + S::kStageOff;
    unsigned char *sdo = sq + kStages * S::kItemBytes;
    float *slse = reinterpret_cast<float *>(smem + S::kRowOff), *sd = slse + kStages * kWgItem;
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + S::kBarOff), *empty = full + kStages, *kvbar = empty + kStages;
    int w = blockIdx.x;
    const int src = w < n_ctx ? 0 : 1;
    w -= src ? n_ctx : 0;
    const int parts = src == 0 ? a.ctx_parts : 1;
    const int tile2 = w / a.nkv / parts, part = w / a.nkv % parts, kh = w % a.nkv;
    const int row0 = tile2 * kWg2Rows, bound = src == 0 ? a.T : a.N * a.B, rend = min(row0 + kWg2Rows, bound);
    const int wg = threadIdx.x / 128, lane = threadIdx.x % 32;
    const int nchunk = (a.G * a.B + kWgItem - 1) / kWgItem;
    int cand_lo = (int)((long long)a.N * part / parts), cand_hi = (int)((long long)a.N * (part + 1) / parts);
    if (src == 1) cand_lo = row0 / a.B, cand_hi = min(a.N, (rend - 1) / a.B + 1);
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; s++) {
            mbar_init(full + s, R::kFullArrivals);
            mbar_init(empty + s, kWg2Consumers * 4); // one per consumer warp
        }
        if (R::kTma) mbar_init(kvbar, 1);
        mbar_init_fence();
    }
    if (R::kTma && wg == 0 && a.G * a.B < kWgItem) { // the rows no box writes: zero in every stage, once
        const int gb = a.G * a.B;
        for (int x = threadIdx.x; x < 2 * kStages * (kWgItem - gb) * (HD / 8); x += 128) {
            const int r = gb + x / (HD / 8) % (kWgItem - gb), ch = x % (HD / 8), tile = x / (HD / 8) / (kWgItem - gb);
            *reinterpret_cast<uint4 *>(sq + tile * S::kItemBytes + sw_off<kWgItem>(r, ch)) = make_uint4(0, 0, 0, 0);
        }
        fence_proxy_async(); // the zeros, to the wgmma (async proxy)
    }
    if (!R::kTma && wg == 0) { // both halves' K and V: their copies complete before the first step's full barrier does
        const bf16 *k = src == 0 ? a.kc : a.kb, *v = src == 0 ? a.vc : a.vb;
        const int ldk = src == 0 ? a.ldkc : a.ldkb, ldv = src == 0 ? a.ldvc : a.ldvb;
#pragma unroll
        for (int c = 0; c < kWg2Consumers; c++) {
            sw_load_rows<HD, kWgKeys, 128>(sk + c * S::kKBytes, k + (size_t)kh * HD, ldk, row0 + c * kWgKeys, bound);
            sw_load_rows<HD, kWgKeys, 128>(sv + c * S::kKBytes, v + (size_t)kh * HD, ldv, row0 + c * kWgKeys, bound);
        }
        cp_async_commit();
    }
    __syncthreads(); // the barriers initialised

    // Both roles walk the same batches (gather_blocks: every thread of the CTA, its two barriers keep s_list from being
    // rewritten while either role still reads the batch before) and count the steps t the same way: stage t % S,
    // phase parity (t / S) & 1.
    if (wg == 0) {
        setmaxnreg_dec<kWg2ProducerRegs>();
        if (R::kTma && threadIdx.x == 0) { // both halves' K and V, once
            const CUtensorMap *mk = src == 0 ? &maps->kc : &maps->kb, *mv = src == 0 ? &maps->vc : &maps->vb;
            mbar_arrive_expect_tx(kvbar, 2 * kWg2Consumers * S::kKBytes);
#pragma unroll
            for (int c = 0; c < kWg2Consumers; c++)
#pragma unroll
                for (int p = 0; p < HD / 64; p++) {
                    const int col = kh * HD + p * 64, row = row0 + c * kWgKeys;
                    tma_load_2d(sk + c * S::kKBytes + p * kWgKeys * 128, mk, col, row, kvbar);
                    tma_load_2d(sv + c * S::kKBytes + p * kWgKeys * 128, mv, col, row, kvbar);
                }
        }
        // the step's copies announced on its full barrier: this thread's landed (and made visible to the wgmma's async
        // proxy), the warp's, then one arrival
        auto announce = [&](int stage) {
            fence_proxy_async();
            __syncwarp();
            if (lane == 0) mbar_arrive(full + stage);
        };
        int t = 0;
        for (int cb = cand_lo; cb < cand_hi; cb += nw * 32) {
            const int items = gather_blocks(a, src, cb, cand_hi, row0, rend, nw, s_wcount, s_list) * nchunk;
            int li = 0, chunk = 0;
            for (int it = 0; it < items; it++, t++) {
                const int stage = t % kStages;
                if constexpr (R::kTma) {
                    if (threadIdx.x == 0 || threadIdx.x / 32 == 1) {
                        if (t >= kStages) mbar_wait(empty + stage, (uint32_t)(((t / kStages) & 1) ^ 1));
                        if (threadIdx.x == 0)
                            wg2_tma_item<HD>(sq + stage * S::kItemBytes, sdo + stage * S::kItemBytes, full + stage,
                                             maps, a, s_list[li], chunk, kh);
                        else
                            wg2_rows_item(slse + stage * kWgItem, sd + stage * kWgItem, full + stage, a, s_list[li],
                                          chunk, kh, lane);
                    }
                    const bool wrap = chunk + 1 == nchunk;
                    li += wrap, chunk = wrap ? 0 : chunk + 1;
                    continue;
                }
                if (t >= kStages) mbar_wait(empty + stage, (uint32_t)(((t / kStages) & 1) ^ 1)); // t - S read
                sw_load_item<HD, 128, 1>(sq + stage * S::kItemBytes, sdo + stage * S::kItemBytes, slse + stage * kWgItem,
                                      sd + stage * kWgItem, a, s_list[li], chunk, kh);
                if constexpr (R::kTracked) {
                    cp_async_mbar_arrive_noinc(full + stage); // when this thread's copies so far have landed
                } else {
                    cp_async_commit();
                    if (it > 0) {
                        cp_async_wait<1>(); // step t - 1's (and the K, V before them)
                        announce((t - 1) % kStages);
                    }
                }
                const bool wrap = chunk + 1 == nchunk;
                li += wrap, chunk = wrap ? 0 : chunk + 1;
            }
            if (!R::kTracked && !R::kTma && items > 0) {
                cp_async_wait<0>();
                announce((t - 1) % kStages);
            }
        }
        if constexpr (R::kTracked || R::kTma) cp_async_commit(); // its step copies are in no group yet
        cp_async_wait<0>(); // a CTA no block sees still has its K/V copy in flight
        if (R::kTma && threadIdx.x == 0) mbar_wait(kvbar, 0); // (likewise its K/V boxes)
        return;
    }

    setmaxnreg_inc<kWg2ConsumerRegs>();
    if (R::kTma) mbar_wait(kvbar, 0); // K and V landed
    const int cw = wg - 1, tid = threadIdx.x - wg * 128, warp = tid / 32, g = lane >> 2, tig = lane & 3;
    const int tile = tile2 * kWg2Consumers + cw; // today's 64-key tile: its workspace slots, partial and counter
    const int wgr0 = row0 + cw * kWgKeys, wend = min(wgr0 + kWgKeys, bound), wr0 = wgr0 + warp * 16;
    const uint32_t kaddr = wgmma_sm90::smem_u32(sk + cw * S::kKBytes), vaddr = wgmma_sm90::smem_u32(sv + cw * S::kKBytes);
    unsigned char *sds = smem + S::kDsOff + cw * S::kDsBytes;
    float dk[HD / 2], dv[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) dk[i] = dv[i] = 0.0f;
    // Pipelined (R::kPipelined): a step's dV and dK run on while the next step it computes issues its Sᵀ; they are
    // waited for (and their stage released) behind it, or before a step this consumer skips, or at the end. The
    // fragments stay with their GEMMs until then.
    uint32_t pa[kWgItem / 16][4], da[kWgItem / 16][4];
    int pending = -1; // the stage whose dV, dK are in flight (pipelined), or -1
    constexpr int kTurnBar = 3; // turns on named barriers 3 and 4 (1 + cw: each consumer's own, 0: the CTA's)
    if (cw == 1) turn_end<R::kTurns>(cw, kTurnBar); // consumer 0 takes the first turn
    // the pending step's dV, dK done (the Sᵀ issued behind them, if any, may run on): its stage to the producer
    auto retire = [&](auto behind) {
        wgmma_wait<decltype(behind)::value>();
        fence_regs(dv);
        fence_regs(dk);
        fence_frags<kWgItem / 16>(pa);
        fence_frags<kWgItem / 16>(da);
        if (pending >= 0) release(empty + pending, lane);
        pending = -1;
    };
    int t = 0;
    for (int cb = cand_lo; cb < cand_hi; cb += nw * 32) {
        const int items = gather_blocks(a, src, cb, cand_hi, row0, rend, nw, s_wcount, s_list) * nchunk;
        int li = 0, chunk = 0;
        for (int it = 0; it < items; it++, t++) {
            const int stage = t % kStages, jb = s_list[li];
            int lo, hi;
            block_interval(a, src, jb, lo, hi);
            mbar_wait(full + stage, (uint32_t)((t / kStages) & 1));
            if constexpr (R::kTracked) fence_proxy_async(); // the producer's landed copies, to this thread's wgmma
            if (lo < hi && lo < wend && hi > wgr0) { // today's CTA of this 64-key tile has the block (gather_blocks)
                const DkvStep p{wgmma_sm90::smem_u32(sq + stage * S::kItemBytes), wgmma_sm90::smem_u32(sdo + stage * S::kItemBytes),
                                slse + stage * kWgItem, sd + stage * kWgItem};
                float st[32], dpt[32];
                turn_begin<R::kTurns>(cw, kTurnBar);
                dkv_issue_t<HD>(st, kaddr, p.qaddr);
                if constexpr (R::kPipelined) retire(std::integral_constant<int, 1>{}); // the fragments are free
                dkv_issue_t<HD>(dpt, vaddr, p.doaddr);
                turn_end<R::kTurns>(cw, kTurnBar);
                wgmma_wait<1>(); // Sᵀ done; dPᵀ may still run
                fence_regs(st);
                dkv_p(a, st, pa, p.tl, wr0, lo, hi, src, jb, chunk);
                wgmma_wait<0>();
                fence_regs(dpt);
                dkv_ds(st, dpt, da, p.td);
                turn_begin<R::kTurns>(cw, kTurnBar);
                dkv_issue_dv_dk<HD>(dv, dk, pa, da, p);
                turn_end<R::kTurns>(cw, kTurnBar);
                if (a.dsw) { // dSᵀ out for the dq CTAs while the two GEMMs run (the barrier: the last tile read out)
                    if (R::kBulkDs && tid == 0) bulk_wait_read<0>();
                    named_sync(1 + cw, 128);
                    store_ds_tile_at<R::kBulkDs>(
                        sds, da, a.dsw + ws_slot(a, kh, jb, chunk, nchunk, src, tile, lo) * (kWgKeys * kWgItem),
                        (unsigned)tid, 1 + cw);
                }
                if constexpr (R::kPipelined) pending = stage; // released behind the next step's Sᵀ
                else retire(std::integral_constant<int, 0>{}); // (nothing pending: the wait and the fences)
            } else if constexpr (R::kPipelined) {
                retire(std::integral_constant<int, 0>{}); // a pending stage held over skipped ones could starve the ring
            } else if constexpr (R::kTurns) { // both turns, passed on: the other consumer's count stays in step
                turn_begin<true>(cw, kTurnBar);
                turn_end<true>(cw, kTurnBar);
                turn_begin<true>(cw, kTurnBar);
                turn_end<true>(cw, kTurnBar);
            }
            if (!R::kPipelined || pending != stage) release(empty + stage, lane); // done with the stage (GEMMs waited for)
            const bool wrap = chunk + 1 == nchunk;
            li += wrap, chunk = wrap ? 0 : chunk + 1;
        }
    }
    if constexpr (R::kPipelined) retire(std::integral_constant<int, 0>{});
    if (R::kBulkDs && tid == 0) bulk_wait<0>(); // the dS tiles written before this warpgroup ends
    if (wgr0 >= bound) return; // rows past the source's end: no tile (nor partial, nor counter) of today's
    if (parts > 1 &&
        !sum_parts_at<HD>(a, dk, dv, tile * a.nkv + kh, part, parts, (unsigned)tid, s_last[cw], [&] { named_sync(1 + cw, 128); }))
        return; // another part writes the tile

    store_dkv_rows<HD>(
        a, src, kh, [&](int i, int e) { return dk[4 * i + e]; }, [&](int i, int e) { return dv[4 * i + e]; }, wr0, g,
        tig, bound);
}
#endif

// The wg2 dk/dv launch: the context CTAs (n_ctx: 128-row tiles x parts x kv heads) first, then the block-row ones.
template <int HD, class R> __global__ void __launch_bounds__(kWg2Threads, 1) dkv_wg2_sm90_kernel(const Args a, int n_ctx)
{
#ifdef DFLASH_SM90A
    extern __shared__ unsigned char smem_wg2[];
    unsigned char *smem = (unsigned char *)(((uintptr_t)smem_wg2 + 1023) & ~(uintptr_t)1023);
    dkv_wg2_sm90<HD, R>(a, smem, n_ctx, nullptr);
#endif
}
// the same, its tiles staged by TMA (R::kTma)
template <int HD, class R>
__global__ void __launch_bounds__(kWg2Threads, 1)
    dkv_wg2_tma_sm90_kernel(const Args a, int n_ctx, const __grid_constant__ Wg2Maps maps)
{
#ifdef DFLASH_SM90A
    extern __shared__ unsigned char smem_wg2[];
    unsigned char *smem = (unsigned char *)(((uintptr_t)smem_wg2 + 1023) & ~(uintptr_t)1023);
    dkv_wg2_sm90<HD, R>(a, smem, n_ctx, &maps);
#endif
}

// ---- Hopper forward and dq (head_dim 128): wgmma ----
//
// The query-row CTAs of fwd_kernel and dq_tile on wgmma: kFwdWgs (forward) or kBwdWgs (dq) warpgroups of 64 query rows
// (the rows of qrows_setup<16>: warp w owns CTA rows 16w..16w+15), 64-key K/V tiles of the same walk (ktile) through two cp.async
// stages of swizzled panels. Forward: S = Q·Kᵀ (64 x 64 fp32), mask where a warp's rows see part of the tile, online
// softmax in log2 units, O += P·V with P as the bf16 register A operand. dq: S = Q·Kᵀ and dP = dO·Vᵀ issued together,
// dS = P (dP - D), dQ += dS·K. A warpgroup skips a tile none of its rows sees.
constexpr int kFwdRows = kFwdWgs * 64, kWgDqRows = kBwdWgs * 64, kWgKT = 64; // query rows a CTA; keys a K/V tile
template <int HD> struct wg_q_shape {
    static constexpr int kFwdQBytes = kFwdRows * HD * 2; // the forward's Q, panels of kFwdRows rows
    static constexpr int kQBytes = kWgDqRows * HD * 2;   // dq's Q (and dO), panels of kWgDqRows rows
    static constexpr int kKvBytes = kWgKT * HD * 2;      // one K (or V) tile, panels of kWgKT rows
    static constexpr int kSmemFwd = kFwdQBytes + 4 * kKvBytes + 1024;
    static constexpr int kSmemDq = 2 * kQBytes + 4 * kKvBytes + 1024;
};

#ifdef DFLASH_SM90A
// the CTA's query rows of x (row qrow, columns head*HD..), swizzled; rows past the end zero
template <int HD, int ROWS, int NT = 0> // NT: the threads 0..NT-1 copy (0: the whole CTA)
__device__ __forceinline__ void sw_load_qrows(unsigned char *tile, const bf16 *x, int ld, const QRows &r)
{
    constexpr int kChunks = HD / 8;
#pragma unroll 4
    for (int c = threadIdx.x; c < ROWS * kChunks; c += NT ? NT : blockDim.x) {
        const int row = c / kChunks, ch = c % kChunks, qrow = r.qrow[row];
        const bool valid = qrow >= 0;
        cp_async16(tile + sw_off<ROWS>(row, ch), x + (valid ? (size_t)qrow * ld + (size_t)r.head[row] * HD + ch * 8 : 0),
                   valid);
    }
}

template <int HD, int NT>
__device__ __forceinline__ void sw_load_kv(unsigned char *sk, unsigned char *sv, const Args &a, const KTile &t, int kh)
{
    const bf16 *k = t.src == 0 ? a.kc : a.kb, *v = t.src == 0 ? a.vc : a.vb;
    const int ldk = t.src == 0 ? a.ldkc : a.ldkb, ldv = t.src == 0 ? a.ldvc : a.ldvb;
    sw_load_rows<HD, kWgKT, NT>(sk, k + (size_t)kh * HD, ldk, t.row0, t.bound);
    sw_load_rows<HD, kWgKT, NT>(sv, v + (size_t)kh * HD, ldv, t.row0, t.bound);
}

// does some row of warpgroup wg see a key of [k0, k0 + kWgKT) of source src
__device__ __forceinline__ bool wg_sees(const QRows &r, int src, int wg, int k0)
{
    bool any = false;
#pragma unroll
    for (int x = 0; x < 4; x++) {
        const int4 w = r.warp[src][wg * 4 + x];
        any |= k0 < w.y && k0 + kWgKT > w.x;
    }
    return any;
}

// kv_ring_step of the wgmma query-row CTAs (NT threads copy), through wg_stage_next
template <int HD, int NT>
__device__ __forceinline__ KTile wg_kv_ring_step(unsigned char *sk, unsigned char *sv, const Args &a, const QRows &rows,
                                                 int it, int nt, int nct, int kh)
{
    constexpr int kKvBytes = wg_q_shape<HD>::kKvBytes;
    const int next = (it & 1) ^ 1;
    wg_stage_next(it + 1 < nt, [&] {
        sw_load_kv<HD, NT>(sk + next * kKvBytes, sv + next * kKvBytes, a, ktile(rows, it + 1, nct, kWgKT), kh);
    });
    return ktile(rows, it, nct, kWgKT);
}

// S (64 x 64) = A rows (64 of a tile of AROWS-row panels at aaddr) · B tile (kWgKT-row panels at baddr)ᵀ, issued
template <int HD, int AROWS> __device__ __forceinline__ void issue_s(float (&s)[32], uint32_t aaddr, uint32_t baddr)
{
    const uint64_t da = wgmma_sm90::sw128_desc(aaddr, 16, 1024), db = wgmma_sm90::sw128_desc(baddr, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        wgmma_sm90::wgmma_ss_m64n64k16(s, desc_at(da, (kk / 4) * AROWS * 128 + (kk % 4) * 32),
                                       desc_at(db, (kk / 4) * kWgKT * 128 + (kk % 4) * 32), kk > 0);
}
// D (64 x 128) += A (64 x kWgKT, bf16 fragments) · tile (kWgKT rows, MN-major), issued
__device__ __forceinline__ void issue_pv(float (&d)[64], const uint32_t (&pa)[kWgKT / 16][4], uint32_t baddr)
{
    const uint64_t db = wgmma_sm90::sw128_desc(baddr, kWgKT * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < kWgKT / 16; kk++) wgmma_sm90::wgmma_rs_m64n128k16_tb(d, pa[kk], desc_at(db, kk * 2048), 1);
}

// query tile of CTA w (kv head fastest, the latest blocks, the longest contexts, first)
__device__ __forceinline__ void wg_qtile(const Args &a, int &tile, int &kh)
{
    const int nq = (int)gridDim.x / a.nkv;
    tile = nq - 1 - (int)blockIdx.x / a.nkv, kh = (int)blockIdx.x % a.nkv;
}
#endif

#ifdef DFLASH_SM90A
// The forward's per-tile softmax (the wgmma CTAs): S of walk tile (src, k0) (a warpgroup's 64 x 64, the thread's rows
// r0 and r0 + 8) masked where need_mask (the rows' intervals), the online max in log2 units (m_run; corr: the factor O
// and l take), P = exp2(S·scale - m) as bf16 A fragments (pa) and l_run = l_run·corr + rowsum(P). O is rescaled by
// fwd_rescale before the tile's P·V is added.
__device__ __forceinline__ void fwd_softmax(float (&s)[32], uint32_t (&pa)[kWgKT / 16][4], float (&corr)[2],
                                            float (&m_run)[2], float (&l_run)[2], const Args &a, const QRows &rows,
                                            int src, int k0, bool need_mask, int r0, int tig)
{
    if (need_mask) {
        const int lo0 = rows.lo[src][r0], hi0 = rows.hi[src][r0];
        const int lo1 = rows.lo[src][r0 + 8], hi1 = rows.hi[src][r0 + 8];
#pragma unroll
        for (int t = 0; t < kWgKT / 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = k0 + t * 8 + tig * 2 + (e & 1);
                const int lo = e < 2 ? lo0 : lo1, hi = e < 2 ? hi0 : hi1;
                if (key < lo || key >= hi) s[4 * t + e] = -INFINITY;
            }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int t = 0; t < kWgKT / 8; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * t + e]);
    float neg_m[2];
#pragma unroll
    for (int r = 0; r < 2; r++) online_max(mx[r], m_run[r], a.scale_log2, corr[r], neg_m[r]);
    float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
    for (int t = 0; t < kWgKT / 8; t++) {
        const float p0 = fast_exp2(fmaf(s[4 * t], a.scale_log2, neg_m[0]));
        const float p1 = fast_exp2(fmaf(s[4 * t + 1], a.scale_log2, neg_m[0]));
        const float p2 = fast_exp2(fmaf(s[4 * t + 2], a.scale_log2, neg_m[1]));
        const float p3 = fast_exp2(fmaf(s[4 * t + 3], a.scale_log2, neg_m[1]));
        rs0 += p0 + p1, rs1 += p2 + p3;
        pa[t / 2][(t & 1) * 2 + 0] = pack_bf16(p0, p1);
        pa[t / 2][(t & 1) * 2 + 1] = pack_bf16(p2, p3);
    }
    l_run[0] = l_run[0] * corr[0] + rs0;
    l_run[1] = l_run[1] * corr[1] + rs1;
}
// O (the thread's rows r0, r0 + 8) times the tile's corr
template <int HD> __device__ __forceinline__ void fwd_rescale(float (&o)[HD / 2], const float (&corr)[2])
{
#pragma unroll
    for (int i = 0; i < HD / 8; i++) {
        o[4 * i] *= corr[0], o[4 * i + 1] *= corr[0];
        o[4 * i + 2] *= corr[1], o[4 * i + 3] *= corr[1];
    }
}
// the thread's rows r0, r0 + 8 of the CTA: out = O / l (l summed over the row's quad), lse = (m + log2 l)·ln 2
template <int HD>
__device__ __forceinline__ void fwd_store(const Args &a, const float (&o)[HD / 2], const float (&m_run)[2],
                                          float (&l_run)[2], const QRows &rows, int r0, int tig)
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    }
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const int row = r0 + rr * 8, qrow = rows.qrow[row], head = rows.head[row];
        if (qrow < 0) continue;
        const float l = l_run[rr], inv = 1.0f / l;
        bf16 *orow = a.out + (size_t)qrow * a.ldo + (size_t)head * HD;
#pragma unroll
        for (int i = 0; i < HD / 8; i++)
            *reinterpret_cast<uint32_t *>(orow + i * 8 + tig * 2) =
                pack_bf16(o[4 * i + rr * 2] * inv, o[4 * i + rr * 2 + 1] * inv);
        if (tig == 0) a.lse_out[(size_t)qrow * a.nh + head] = (m_run[rr] + log2f(l)) * kLn2;
    }
}
#endif

// The tensor maps of the TMA-staged forward (DFLASH_ATTENTION_FWD=tma): kc, vc (T rows), kb, vb (N·B rows) of nkv·HD
// columns, boxes of 64 rows x 64 columns, 128-byte swizzled.
struct FwdMaps {
    CUtensorMap kc, vc, kb, vb;
};

#ifdef DFLASH_SM90A
// The forward CTA: its body with K and V staged by cp.async (maps NULL), or by TMA: thread 0 brings the next walk
// tile's K and V (four boxes) onto the other stage's full barrier while the CTA computes this one. A box reads the
// rows past the walk's end (r.cta's hi) that cp.async leaves zero: every row of the CTA masks those keys (S = -inf,
// P = 0), so they add nothing.
template <int HD, bool TMA> __device__ __forceinline__ void fwd_sm90(const Args &a, const FwdMaps *maps)
{
    static_assert(HD == 128, "fwd_sm90_kernel: head_dim 128");
    using S = wg_q_shape<HD>;
    using namespace wgmma_sm90;
    extern __shared__ unsigned char smem_wg[];
    __shared__ QRows rows;
    unsigned char *smem = (unsigned char *)(((uintptr_t)smem_wg + 1023) & ~(uintptr_t)1023);
    unsigned char *sq = smem, *sk = sq + S::kFwdQBytes, *sv = sk + 2 * S::kKvBytes;
    uint64_t *full = reinterpret_cast<uint64_t *>(sv + 2 * S::kKvBytes); // (TMA) the two stages' barriers
    int tile, kh;
    wg_qtile(a, tile, kh);
    if (TMA && threadIdx.x == 0) {
        mbar_init(full, 1);
        mbar_init(full + 1, 1);
        mbar_init_fence(); // (qrows_setup's barriers publish them)
    }
    qrows_setup<16>(rows, a, tile, kh);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tig = lane & 3, wg = warp / 4;
    const int nct = ntiles(rows.cta[0], kWgKT), nt = nct + ntiles(rows.cta[1], kWgKT);
    // (TMA) walk tile it's K and V into stage st, announced on its full barrier (thread 0)
    auto tma_tile = [&](int it, int st) {
        const KTile kt = ktile(rows, it, nct, kWgKT);
        const CUtensorMap *mk = kt.src == 0 ? &maps->kc : &maps->kb, *mv = kt.src == 0 ? &maps->vc : &maps->vb;
        mbar_arrive_expect_tx(full + st, 2 * S::kKvBytes);
#pragma unroll
        for (int p = 0; p < HD / 64; p++) {
            tma_load_2d(sk + st * S::kKvBytes + p * kWgKT * 128, mk, kh * HD + p * 64, kt.row0, full + st);
            tma_load_2d(sv + st * S::kKvBytes + p * kWgKT * 128, mv, kh * HD + p * 64, kt.row0, full + st);
        }
    };
    sw_load_qrows<HD, kFwdRows>(sq, a.q, a.ldq, rows);
    if (!TMA) sw_load_kv<HD, kFwdWgs * 128>(sk, sv, a, ktile(rows, 0, nct, kWgKT), kh);
    cp_async_commit();
    if (TMA) {
        if (threadIdx.x == 0 && nt > 0) tma_tile(0, 0);
        cp_async_wait<0>(); // Q, visible to the wgmma
        fence_proxy_async();
        __syncthreads();
    }
    const uint32_t qaddr = mma_sm80::smem_u32(sq) + wg * kWgKeys * 128;
    const int r0 = warp * 16 + g; // the thread's CTA rows r0 and r0 + 8

    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    for (int it = 0; it < nt; it++) {
        const int stage = it & 1;
        KTile kt;
        if (TMA) {
            if (threadIdx.x == 0 && it + 1 < nt) tma_tile(it + 1, stage ^ 1); // its last readers passed the barrier
            mbar_wait(full + stage, (uint32_t)((it >> 1) & 1));
            kt = ktile(rows, it, nct, kWgKT);
        } else {
            kt = wg_kv_ring_step<HD, kFwdWgs * 128>(sk, sv, a, rows, it, nt, nct, kh);
        }
        const int k0 = kt.row0;
        if (wg_sees(rows, kt.src, wg, k0)) {
            const int4 w = rows.warp[kt.src][warp];
            const bool need_mask = !(w.z <= k0 && k0 + kWgKT <= w.w);
            float s[32];
            wgmma_fence();
            issue_s<HD, kFwdRows>(s, qaddr, mma_sm80::smem_u32(sk + stage * S::kKvBytes));
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(s);
            uint32_t pa[kWgKT / 16][4];
            float corr[2];
            fwd_softmax(s, pa, corr, m_run, l_run, a, rows, kt.src, k0, need_mask, r0, tig);
            fwd_rescale<HD>(o, corr);
            fence_frags<kWgKT / 16>(pa);
            wgmma_fence();
            issue_pv(o, pa, mma_sm80::smem_u32(sv + stage * S::kKvBytes));
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(o);
        }
        __syncthreads(); // the next iteration's prefetch overwrites this stage
    }
    fwd_store<HD>(a, o, m_run, l_run, rows, r0, tig);
}
#endif

template <int HD> __global__ void __launch_bounds__(kFwdWgs * 128, 2) fwd_sm90_kernel(const Args a)
{
#ifdef DFLASH_SM90A
    fwd_sm90<HD, false>(a, nullptr);
#endif
}
template <int HD>
__global__ void __launch_bounds__(kFwdWgs * 128, 2) fwd_tma_sm90_kernel(const Args a, const __grid_constant__ FwdMaps maps)
{
#ifdef DFLASH_SM90A
    fwd_sm90<HD, true>(a, &maps);
#endif
}

// The forward in FlashAttention-3's shape (DFLASH_ATTENTION_FWD=ws, not yet run on a GPU): the same 128 query rows a
// CTA, walk, masks and softmax (fwd_softmax), one CTA an SM of a producer warpgroup and two consumer warpgroups of 64
// rows (setmaxnreg as the wg2 dk/dv CTAs). The producer gathers Q by cp.async once (its 128 threads arriving noinc on
// qbar) and brings each walk tile's K and V by TMA (thread 0) through kFwsStages stages (full: the byte count; empty:
// every consumer warp). A consumer takes the tiles it sees in runs of consecutive ones: a run's first tile is S, wait,
// softmax, O rescaled; then each next tile's S is issued with the last one's P·V, the softmax runs under that P·V, and
// O is rescaled once it is done; the run's last P·V is finished before a tile the consumer skips (holding its stage
// over skipped tiles could starve the ring: the producer would wait for it before the tile the consumer waits for).
// O takes the same operations in the same order as in fwd_sm90 (rescaled by tile j's factor, then P_j·V_j added):
// the same bits. Rows between the walk's end and a tile's end are read by the boxes and masked (as FWD=tma).
constexpr int kFwsStages = 4, kFwsThreads = 3 * 128;
template <int HD> struct fws_shape {
    static constexpr int kQBytes = kFwdRows * HD * 2, kKvBytes = kWgKT * HD * 2;
    static constexpr int kBarOff = kQBytes + 2 * kFwsStages * kKvBytes; // Q, the stages' K, then their V
    static constexpr int kSmem = kBarOff + (2 * kFwsStages + 1) * 8 + 1024;  // full, empty, qbar; to align
};

// TURNS (DFLASH_ATTENTION_FWD=ws_turns): the two consumers also take turns at the tensor cores (turn_begin / turn_end,
// consumer 0 first), one a walk tile each: the issue of a seen tile's S (and the last tile's P·V), or an empty turn for a
// tile it skips; the waits and the softmax run outside the turns, under the other's GEMMs.
template <int HD, bool TURNS = false>
__global__ void __launch_bounds__(kFwsThreads, 1) fwd_ws_sm90_kernel(const Args a, const __grid_constant__ FwdMaps maps)
{
#ifdef DFLASH_SM90A
    static_assert(HD == 128, "fwd_ws_sm90_kernel: head_dim 128");
    using S = fws_shape<HD>;
    using namespace wgmma_sm90;
    extern __shared__ unsigned char smem_ws[];
    __shared__ QRows rows;
    unsigned char *smem = (unsigned char *)(((uintptr_t)smem_ws + 1023) & ~(uintptr_t)1023);
    unsigned char *sq = smem, *sk = sq + S::kQBytes, *sv = sk + kFwsStages * S::kKvBytes;
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + S::kBarOff), *empty = full + kFwsStages,
             *qbar = empty + kFwsStages;
    int tile, kh;
    wg_qtile(a, tile, kh);
    if (threadIdx.x == 0) {
        for (int st = 0; st < kFwsStages; st++) {
            mbar_init(full + st, 1);
            mbar_init(empty + st, 8); // each consumer warp
        }
        mbar_init(qbar, 128); // each producer thread, as its Q copies land
        mbar_init_fence();    // (qrows_setup's barriers publish them)
    }
    qrows_setup<16, 4>(rows, a, tile, kh);
    const int nct = ntiles(rows.cta[0], kWgKT), nt = nct + ntiles(rows.cta[1], kWgKT);
    const int wg = threadIdx.x / 128, lane = threadIdx.x % 32;
    if (wg == 0) {
        setmaxnreg_dec<kWg2ProducerRegs>();
        sw_load_qrows<HD, kFwdRows, 128>(sq, a.q, a.ldq, rows);
        cp_async_mbar_arrive_noinc(qbar);
        if (threadIdx.x == 0)
            for (int it = 0; it < nt; it++) {
                const int st = it % kFwsStages;
                if (it >= kFwsStages) mbar_wait(empty + st, (uint32_t)(((it / kFwsStages) & 1) ^ 1));
                const KTile kt = ktile(rows, it, nct, kWgKT);
                const CUtensorMap *mk = kt.src == 0 ? &maps.kc : &maps.kb, *mv = kt.src == 0 ? &maps.vc : &maps.vb;
                mbar_arrive_expect_tx(full + st, 2 * S::kKvBytes);
#pragma unroll
                for (int p = 0; p < HD / 64; p++) {
                    tma_load_2d(sk + st * S::kKvBytes + p * kWgKT * 128, mk, kh * HD + p * 64, kt.row0, full + st);
                    tma_load_2d(sv + st * S::kKvBytes + p * kWgKT * 128, mv, kh * HD + p * 64, kt.row0, full + st);
                }
            }
        cp_async_commit();
        cp_async_wait<0>();
        return;
    }
    setmaxnreg_inc<kWg2ConsumerRegs>();
    const int cw = wg - 1, warp = threadIdx.x / 32 - 4, g = lane >> 2, tig = lane & 3;
    const int r0 = warp * 16 + g; // the thread's CTA rows r0 and r0 + 8
    const uint32_t qaddr = mma_sm80::smem_u32(sq) + cw * kWgKeys * 128;
    mbar_wait(qbar, 0);
    fence_proxy_async(); // the producer's landed Q copies, to this thread's wgmma
    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    // tile it's S into s (issued and committed), and whether the tile needs its mask
    auto issue_tile_s = [&](float (&s)[32], int it, const KTile &kt) {
        wgmma_fence();
        issue_s<HD, kFwdRows>(s, qaddr, mma_sm80::smem_u32(sk + (it % kFwsStages) * S::kKvBytes));
        wgmma_commit();
        const int4 w = rows.warp[kt.src][warp];
        return !(w.z <= kt.row0 && kt.row0 + kWgKT <= w.w);
    };
    auto issue_tile_pv = [&](uint32_t (&pa)[kWgKT / 16][4], int it) {
        fence_frags<kWgKT / 16>(pa);
        wgmma_fence();
        issue_pv(o, pa, mma_sm80::smem_u32(sv + (it % kFwsStages) * S::kKvBytes));
        wgmma_commit();
    };
    auto wait_full = [&](int it) { mbar_wait(full + it % kFwsStages, (uint32_t)((it / kFwsStages) & 1)); };
    if (cw == 1) turn_end<TURNS>(cw); // consumer 0 takes the first turn
    int it = 0;
    while (it < nt) {
        KTile kt = ktile(rows, it, nct, kWgKT);
        wait_full(it);
        if (!wg_sees(rows, kt.src, cw, kt.row0)) { // a tile this consumer skips (its turn passed on)
            release(empty + it % kFwsStages, lane);
            turn_begin<TURNS>(cw);
            turn_end<TURNS>(cw);
            it++;
            continue;
        }
        // a run's first tile: S, its softmax, O rescaled (its P·V goes with the next tile's S, or ends the run)
        uint32_t pa[kWgKT / 16][4], pb[kWgKT / 16][4]; // the last tile's P and the next's, in turn (no copies)
        {
            float s[32], corr[2];
            turn_begin<TURNS>(cw);
            const bool need_mask = issue_tile_s(s, it, kt);
            turn_end<TURNS>(cw);
            wgmma_wait<0>();
            fence_regs(s);
            fwd_softmax(s, pa, corr, m_run, l_run, a, rows, kt.src, kt.row0, need_mask, r0, tig);
            fwd_rescale<HD>(o, corr);
        }
        int cur = it++;
        // the run's next tile (when there is one it sees: else false): its S with the last tile's P·V (pc), its softmax
        // under that P·V into pn, O rescaled once the P·V is done
        auto next_tile = [&](uint32_t (&pc)[kWgKT / 16][4], uint32_t (&pn)[kWgKT / 16][4]) {
            if (it >= nt) return false;
            const KTile kn = ktile(rows, it, nct, kWgKT);
            if (!wg_sees(rows, kn.src, cw, kn.row0)) return false;
            wait_full(it);
            float s[32], corr[2];
            turn_begin<TURNS>(cw);
            const bool need_mask = issue_tile_s(s, it, kn);
            issue_tile_pv(pc, cur);
            turn_end<TURNS>(cw);
            wgmma_wait<1>(); // S done; the last tile's P·V runs on under the softmax
            fence_regs(s);
            fwd_softmax(s, pn, corr, m_run, l_run, a, rows, kn.src, kn.row0, need_mask, r0, tig);
            wgmma_wait<0>();
            fence_regs(o);
            fence_frags<kWgKT / 16>(pc);
            release(empty + cur % kFwsStages, lane);
            fwd_rescale<HD>(o, corr);
            cur = it++;
            return true;
        };
        // the run's last P·V, before any tile it skips
        auto end_run = [&](uint32_t (&pc)[kWgKT / 16][4]) {
            issue_tile_pv(pc, cur);
            wgmma_wait<0>();
            fence_regs(o);
            fence_frags<kWgKT / 16>(pc);
            release(empty + cur % kFwsStages, lane);
        };
        for (;;) {
            if (!next_tile(pa, pb)) {
                end_run(pa);
                break;
            }
            if (!next_tile(pb, pa)) {
                end_run(pb);
                break;
            }
        }
    }
    fwd_store<HD>(a, o, m_run, l_run, rows, r0, tig);
#endif
}

#ifdef DFLASH_SM90A
// dq of query tile `tile` of kv head kh
template <int HD> __device__ __forceinline__ void dq_sm90(const Args &a, unsigned char *smem, int tile, int kh)
{
    static_assert(HD == 128, "dq_sm90: head_dim 128");
    using S = wg_q_shape<HD>;
    using namespace wgmma_sm90;
    __shared__ QRows rows;
    unsigned char *sq = smem, *sdo = sq + S::kQBytes, *sk = sdo + S::kQBytes, *sv = sk + 2 * S::kKvBytes;
    qrows_setup<16>(rows, a, tile, kh);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tig = lane & 3, wg = warp / 4;
    const int nct = ntiles(rows.cta[0], kWgKT), nt = nct + ntiles(rows.cta[1], kWgKT);
    sw_load_qrows<HD, kWgDqRows>(sq, a.q, a.ldq, rows);
    sw_load_qrows<HD, kWgDqRows>(sdo, a.dout, a.lddo, rows);
    sw_load_kv<HD, kBwdWgs * 128>(sk, sv, a, ktile(rows, 0, nct, kWgKT), kh);
    cp_async_commit();
    const uint32_t qaddr = mma_sm80::smem_u32(sq) + wg * kWgKeys * 128;
    const uint32_t doaddr = mma_sm80::smem_u32(sdo) + wg * kWgKeys * 128;
    const int r0 = warp * 16 + g;
    // lse (log2 units) and D of the thread's two rows; rows past the end have Q = dO = 0 and so dS = 0
    float lse2[2], dd[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = r0 + r * 8, qrow = rows.qrow[row];
        const size_t i = (size_t)qrow * a.nh + rows.head[row];
        lse2[r] = qrow >= 0 ? a.lse[i] * kLog2e : 0.0f;
        dd[r] = qrow >= 0 ? a.delta[i] : 0.0f;
    }
    float dq[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) dq[i] = 0.0f;
    for (int it = 0; it < nt; it++) {
        const int stage = it & 1;
        const KTile kt = wg_kv_ring_step<HD, kBwdWgs * 128>(sk, sv, a, rows, it, nt, nct, kh);
        const int k0 = kt.row0;
        if (wg_sees(rows, kt.src, wg, k0)) {
            const int4 w = rows.warp[kt.src][warp];
            const bool need_mask = !(w.z <= k0 && k0 + kWgKT <= w.w);
            const uint32_t kaddr = mma_sm80::smem_u32(sk + stage * S::kKvBytes);
            float s[32], dp[32];
            wgmma_fence();
            issue_s<HD, kWgDqRows>(s, qaddr, kaddr);
            wgmma_commit();
            issue_s<HD, kWgDqRows>(dp, doaddr, mma_sm80::smem_u32(sv + stage * S::kKvBytes));
            wgmma_commit();
            wgmma_wait<1>();
            fence_regs(s);
            int lo0 = INT_MIN, hi0 = INT_MAX, lo1 = INT_MIN, hi1 = INT_MAX;
            if (need_mask) {
                lo0 = rows.lo[kt.src][r0], hi0 = rows.hi[kt.src][r0];
                lo1 = rows.lo[kt.src][r0 + 8], hi1 = rows.hi[kt.src][r0 + 8];
            }
            // P = exp(S·scale - lse), 0 where masked
#pragma unroll
            for (int t = 0; t < kWgKT / 8; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = fast_exp2(fmaf(s[4 * t + e], a.scale_log2, -lse2[e >> 1]));
                    if (need_mask) {
                        const int key = k0 + t * 8 + tig * 2 + (e & 1);
                        const int lo = e < 2 ? lo0 : lo1, hi = e < 2 ? hi0 : hi1;
                        if (key < lo || key >= hi) p = 0.0f;
                    }
                    s[4 * t + e] = p;
                }
            wgmma_wait<0>();
            fence_regs(dp);
            // dS = P (dP - D) as bf16 A fragments
            uint32_t dsf[kWgKT / 16][4];
#pragma unroll
            for (int t = 0; t < kWgKT / 8; t++) {
                const float *p4 = s + 4 * t, *q4 = dp + 4 * t;
                dsf[t / 2][(t & 1) * 2 + 0] = pack_bf16(p4[0] * (q4[0] - dd[0]), p4[1] * (q4[1] - dd[0]));
                dsf[t / 2][(t & 1) * 2 + 1] = pack_bf16(p4[2] * (q4[2] - dd[1]), p4[3] * (q4[3] - dd[1]));
            }
            fence_frags<kWgKT / 16>(dsf);
            wgmma_fence();
            issue_pv(dq, dsf, kaddr); // dQ += dS·K
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(dq);
        }
        __syncthreads();
    }
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const int row = r0 + rr * 8, qrow = rows.qrow[row];
        if (qrow < 0) continue;
        bf16 *drow = a.dq + (size_t)qrow * a.lddq + (size_t)rows.head[row] * HD;
#pragma unroll
        for (int i = 0; i < HD / 8; i++)
            *reinterpret_cast<uint32_t *>(drow + i * 8 + tig * 2) =
                pack_bf16(dq[4 * i + rr * 2] * a.scale, dq[4 * i + rr * 2 + 1] * a.scale);
    }
}
#endif

// dq from the dk/dv CTAs' dS tiles (a.dsw), no recompute: CTA (kv head kh fastest, the latest blocks first) owns
// query chunk c of block j (rows c·64.. of its B·G, as the dk/dv steps) and sums dQ += dS·K over the key tiles of the
// block's walk in key order (its context tiles, then its block-row tiles): the dS tile (K-major A, 8 KB) and the K
// tile (MN-major B) through two cp.async stages; pure GEMMs, no exp, no lse or D. The same tiles in the same order
// every run: deterministic.
constexpr int kDsTile = kWgKeys * kWgItem; // bf16 elements of a dS tile
template <int HD, int NB = 1> struct wg_dqws_shape { // NB: the blocks a CTA sums (their dS tiles a stage)
    static constexpr int kKBytes = kWgKT * HD * 2, kDsBytes = kDsTile * 2;
    static constexpr int kStageBytes = kKBytes + NB * kDsBytes;
    static constexpr int kSmem = NB == 1 ? 2 * (kKBytes + kDsBytes) + 1024 : 2 * kStageBytes + 1024;
};
// dq_ws_tma_sm90_kernel's: dq_ws_sm90_kernel's and the two stages' full barriers
template <int HD> constexpr int dq_tma_smem() { return wg_dqws_shape<HD>::kSmem + 2 * 8; }

#ifdef DFLASH_SM90A
// the dq CTAs' pieces: a dS tile (8 KB at g) into the stage's swizzled image as the dk/dv CTAs wrote it (a plain copy)
__device__ __forceinline__ void dq_ws_load_ds(unsigned char *sds, const bf16 *tile)
{
    const unsigned char *g = reinterpret_cast<const unsigned char *>(tile);
#pragma unroll
    for (int x = 0; x < kDsTile * 2 / 16 / 128; x++) {
        const int off = ((int)threadIdx.x + x * 128) * 16;
        cp_async16(sds + off, g + off, true);
    }
}
// dQ += dS·K issued (after a wgmma fence; the caller commits): dS K-major as issue_s's Q (a k16 step 32 bytes along
// its 128-byte rows), K MN-major as in issue_pv
template <int HD> __device__ __forceinline__ void dq_ws_issue(float (&dq)[HD / 2], uint32_t dsaddr, uint32_t kaddr)
{
    using namespace wgmma_sm90;
    const uint64_t dsd = sw128_desc(dsaddr, 16, 1024);
    const uint64_t kd = sw128_desc(kaddr, kWgKT * 128, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kWgKT / 16; kk++) wgmma_ss_m64n128k16<1>(dq, desc_at(dsd, kk * 32), desc_at(kd, kk * 2048), 1);
}
// A one-block dq CTA's walk: CTA (kv head kh fastest, the latest blocks first) owns query chunk c of block j; its key
// tiles are the context tiles ct0 .. ct0 + nct - 1, then the block-row tiles bt0 .., ntot in all; ws: its first dS slot
struct DqWalk {
    int j, c, kh, ct0, nct, bt0, ntot;
    const bf16 *ws;
};
__device__ __forceinline__ DqWalk dq_walk(const Args &a)
{
    DqWalk w;
    const int nchunk = (a.G * a.B + kWgItem - 1) / kWgItem;
    w.kh = (int)blockIdx.x % a.nkv;
    const int jc = a.N * nchunk - 1 - (int)blockIdx.x / a.nkv;
    w.j = jc / nchunk, w.c = jc % nchunk;
    int lo, hi;
    block_interval(a, 0, w.j, lo, hi);
    w.ct0 = lo / kWgKT, w.nct = lo < hi ? (hi - 1) / kWgKT - w.ct0 + 1 : 0;
    block_interval(a, 1, w.j, lo, hi);
    w.bt0 = lo / kWgKT, w.ntot = w.nct + (hi - 1) / kWgKT - w.bt0 + 1;
    w.ws = a.dsw + ws_slot(a, w.kh, w.j, w.c, nchunk, 0, 0, 0) * kDsTile;
    return w;
}

// the CTA's dQ rows of query chunk c of block j to a.dq: CTA row r = 16·warp + g (+8) is row ρ = c·64 + r of the
// block's B·G, head kh·G + ρ / B, slot ρ % B
template <int HD> __device__ __forceinline__ void dq_ws_store(const Args &a, const float (&dq)[HD / 2], int j, int c, int kh)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const int rho = c * kWgItem + warp * 16 + g + rr * 8;
        if (rho >= a.G * a.B) continue;
        bf16 *drow = a.dq + ((size_t)j * a.B + rho % a.B) * a.lddq + ((size_t)kh * a.G + rho / a.B) * HD;
#pragma unroll
        for (int i = 0; i < HD / 8; i++)
            *reinterpret_cast<uint32_t *>(drow + i * 8 + tig * 2) =
                pack_bf16(dq[4 * i + rr * 2] * a.scale, dq[4 * i + rr * 2 + 1] * a.scale);
    }
}
#endif

template <int HD> __global__ void __launch_bounds__(128, 4) dq_ws_sm90_kernel(const Args a)
{
#ifdef DFLASH_SM90A
    static_assert(HD == 128, "dq_ws_sm90_kernel: head_dim 128");
    using S = wg_dqws_shape<HD>;
    using namespace wgmma_sm90;
    extern __shared__ unsigned char smem_wg[];
    unsigned char *smem = (unsigned char *)(((uintptr_t)smem_wg + 1023) & ~(uintptr_t)1023);
    unsigned char *sk = smem, *sds = sk + 2 * S::kKBytes;
    const DqWalk w = dq_walk(a);
    const int j = w.j, c = w.c, kh = w.kh, ct0 = w.ct0, nct = w.nct, bt0 = w.bt0, ntot = w.ntot;
    const bf16 *ws = w.ws;
    // tile it of the walk: its source, first key row, workspace slot
    auto load = [&](int it, int stage) {
        const bool ctx = it < nct;
        const int i = ctx ? it : it - nct;
        sw_load_rows<HD, kWgKT, 128>(sk + stage * S::kKBytes, (ctx ? a.kc : a.kb) + (size_t)kh * HD,
                                     ctx ? a.ldkc : a.ldkb, ((ctx ? ct0 : bt0) + i) * kWgKT, ctx ? a.T : a.N * a.B);
        dq_ws_load_ds(sds + stage * S::kDsBytes, ws + (size_t)((ctx ? 0 : a.ws_nct) + i) * kDsTile);
    };
    float dq[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) dq[i] = 0.0f;
    if (ntot > 0) load(0, 0);
    cp_async_commit();
    for (int it = 0; it < ntot; it++) {
        const int stage = it & 1;
        wg_stage_next(it + 1 < ntot, [&] { load(it + 1, stage ^ 1); });
        dq_ws_issue<HD>(dq, mma_sm80::smem_u32(sds + stage * S::kDsBytes), mma_sm80::smem_u32(sk + stage * S::kKBytes));
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(dq);
        __syncthreads(); // the next prefetch overwrites this stage
    }
    dq_ws_store<HD>(a, dq, j, c, kh);
#endif
}

// dq of two blocks a CTA (DFLASH_ATTENTION_DQ_WS=pair, not yet run on a GPU): CTA (kv head fastest, the latest pairs
// first) owns query chunk c of blocks 2p and 2p + 1 (the second absent past the last block) and walks the union of their
// key tiles (dflash_attn_tile_union_next over each source's two tile ranges: context tiles, then block-row ones), each K
// tile loaded once with the dS tiles of the blocks that meet it, each block summing dQ += dS·K over its own tiles in
// key order through the same wgmma as dq_ws_sm90_kernel: the same bits. A block's neighbour in its sequence meets
// nearly the same context tiles, so K comes once for two (24 KB of copies an MFLOP becomes ~16).
template <int HD> __global__ void __launch_bounds__(128, 3) dq_ws_pair_sm90_kernel(const Args a)
{
#ifdef DFLASH_SM90A
    static_assert(HD == 128, "dq_ws_pair_sm90_kernel: head_dim 128");
    constexpr int NB = 2;
    using S = wg_dqws_shape<HD, NB>;
    using namespace wgmma_sm90;
    extern __shared__ unsigned char smem_wg[];
    unsigned char *smem = (unsigned char *)(((uintptr_t)smem_wg + 1023) & ~(uintptr_t)1023);
    const int nchunk = (a.G * a.B + kWgItem - 1) / kWgItem, npair = (a.N + 1) / 2;
    const int kh = (int)blockIdx.x % a.nkv, pc = npair * nchunk - 1 - (int)blockIdx.x / a.nkv; // latest pairs first
    const int c = pc % nchunk;
    // block b: its tile ranges [c0, c1) of the context and [r0, r1) of the block rows (empty for a missing block)
    int jb[NB], c0[NB], c1[NB], r0[NB], r1[NB];
    const bf16 *ws[NB];
#pragma unroll
    for (int b = 0; b < NB; b++) {
        jb[b] = pc / nchunk * NB + b;
        const bool here = jb[b] < a.N;
        int lo = 0, hi = 0;
        if (here) block_interval(a, 0, jb[b], lo, hi);
        c0[b] = lo / kWgKT, c1[b] = lo < hi ? (hi - 1) / kWgKT + 1 : lo / kWgKT;
        lo = hi = 0;
        if (here) block_interval(a, 1, jb[b], lo, hi);
        r0[b] = lo / kWgKT, r1[b] = lo < hi ? (hi - 1) / kWgKT + 1 : lo / kWgKT;
        ws[b] = here ? a.dsw + ws_slot(a, kh, jb[b], c, nchunk, 0, 0, 0) * kDsTile : nullptr;
    }
    auto next = [&](int src, int t) {
        return src == 0 ? dflash_attn_tile_union_next(t, c0[0], c1[0], c0[1], c1[1])
                        : dflash_attn_tile_union_next(t, r0[0], r1[0], r0[1], r1[1]);
    };
    auto first = [&](int b, int src) { return src == 0 ? c0[b] : r0[b]; };
    auto meets = [&](int b, int src, int t) { return src == 0 ? c0[b] <= t && t < c1[b] : r0[b] <= t && t < r1[b]; };
    // tile (src, t) into a stage: K, and the dS tile of each block that meets it
    auto load = [&](int src, int t, int stage) {
        unsigned char *st = smem + stage * S::kStageBytes;
        sw_load_rows<HD, kWgKT, 128>(st, (src == 0 ? a.kc : a.kb) + (size_t)kh * HD, src == 0 ? a.ldkc : a.ldkb,
                                     t * kWgKT, src == 0 ? a.T : a.N * a.B);
#pragma unroll
        for (int b = 0; b < NB; b++)
            if (meets(b, src, t))
                dq_ws_load_ds(st + S::kKBytes + b * S::kDsBytes,
                              ws[b] + (size_t)((src ? a.ws_nct : 0) + t - first(b, src)) * kDsTile);
    };
    float dq[NB][HD / 2];
#pragma unroll
    for (int b = 0; b < NB; b++)
#pragma unroll
        for (int i = 0; i < HD / 2; i++) dq[b][i] = 0.0f;
    // the walk's cursor (src, t): the context union, then the block-row one; src 2: past the end
    int src = 0, t = next(0, -1);
    if (t == INT_MAX) src = 1, t = next(1, -1);
    if (t == INT_MAX) src = 2;
    if (src < 2) load(src, t, 0);
    cp_async_commit();
    for (int it = 0; src < 2; it++) {
        const int stage = it & 1;
        int nsrc = src, nt = next(src, t);
        if (nt == INT_MAX && nsrc == 0) nsrc = 1, nt = next(1, -1);
        if (nt == INT_MAX) nsrc = 2;
        wg_stage_next(nsrc < 2, [&] { load(nsrc, nt, stage ^ 1); });
        const uint32_t sbase = mma_sm80::smem_u32(smem + stage * S::kStageBytes);
#pragma unroll
        for (int b = 0; b < NB; b++)
            if (meets(b, src, t)) dq_ws_issue<HD>(dq[b], sbase + S::kKBytes + b * S::kDsBytes, sbase);
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int b = 0; b < NB; b++) fence_regs(dq[b]);
        __syncthreads(); // the next prefetch overwrites this stage
        src = nsrc, t = nt;
    }
#pragma unroll
    for (int b = 0; b < NB; b++)
        if (jb[b] < a.N) dq_ws_store<HD>(a, dq[b], jb[b], c, kh);
#endif
}

// dq_ws_sm90_kernel with its tiles staged by the bulk copy engine (DFLASH_ATTENTION_DQ_WS=tma, not yet run on a GPU):
// thread 0 brings the next walk tile's K (two TMA boxes of 64 rows, rows past the source's end zero as sw_load_rows
// leaves them) and dS (one 8 KB bulk copy) into the other stage, completing on its full barrier with their byte count,
// while the CTA's 128 threads issue this tile's wgmma: no cp.async, the same shared image, the same bits.
struct DqMaps {
    CUtensorMap kc, kb;
};
template <int HD> __global__ void __launch_bounds__(128, 4) dq_ws_tma_sm90_kernel(const Args a, const __grid_constant__ DqMaps maps)
{
#ifdef DFLASH_SM90A
    static_assert(HD == 128, "dq_ws_tma_sm90_kernel: head_dim 128");
    using S = wg_dqws_shape<HD>;
    using namespace wgmma_sm90;
    extern __shared__ unsigned char smem_wg[];
    unsigned char *smem = (unsigned char *)(((uintptr_t)smem_wg + 1023) & ~(uintptr_t)1023);
    unsigned char *sk = smem, *sds = sk + 2 * S::kKBytes;
    uint64_t *full = reinterpret_cast<uint64_t *>(sds + 2 * S::kDsBytes);
    const DqWalk w = dq_walk(a);
    const int j = w.j, c = w.c, kh = w.kh, ct0 = w.ct0, nct = w.nct, bt0 = w.bt0, ntot = w.ntot;
    const bf16 *ws = w.ws;
    if (threadIdx.x == 0) {
        mbar_init(full, 1);
        mbar_init(full + 1, 1);
        mbar_init_fence();
    }
    __syncthreads();
    auto load = [&](int it, int stage) { // (thread 0)
        const bool ctx = it < nct;
        const int i = ctx ? it : it - nct;
        mbar_arrive_expect_tx(full + stage, S::kKBytes + S::kDsBytes);
#pragma unroll
        for (int p = 0; p < HD / 64; p++)
            tma_load_2d(sk + stage * S::kKBytes + p * kWgKT * 128, ctx ? &maps.kc : &maps.kb, kh * HD + p * 64,
                        ((ctx ? ct0 : bt0) + i) * kWgKT, full + stage);
        bulk_load(sds + stage * S::kDsBytes, ws + (size_t)((ctx ? 0 : a.ws_nct) + i) * kDsTile, S::kDsBytes,
                  full + stage);
    };
    float dq[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) dq[i] = 0.0f;
    if (threadIdx.x == 0 && ntot > 0) load(0, 0);
    for (int it = 0; it < ntot; it++) {
        const int stage = it & 1;
        if (threadIdx.x == 0 && it + 1 < ntot) load(it + 1, stage ^ 1); // that stage's last reader finished last time
        mbar_wait(full + stage, (uint32_t)((it >> 1) & 1));
        dq_ws_issue<HD>(dq, mma_sm80::smem_u32(sds + stage * S::kDsBytes), mma_sm80::smem_u32(sk + stage * S::kKBytes));
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(dq);
        __syncthreads(); // every warp's wgmma have read this stage: the next load may overwrite it
    }
    dq_ws_store<HD>(a, dq, j, c, kh);
#endif
}

// The Hopper backward's CTAs in one launch, heaviest kinds first (as bwd_kernel): context dk/dv tiles (the first
// rows, seen by the most blocks, first), dq tiles (latest blocks first; DQ, the launch without a dS workspace), block-row
// dk/dv tiles. The launch with a workspace takes the instance without dq code (DQ false; with it, ptxas would share
// the pipelined dk/dv loop's 255 registers with dq_sm90's and spill).
template <int HD, bool DQ>
__global__ void __launch_bounds__(kBwdWgs * 128, 2) bwd_sm90_kernel(const Args a, int n_ctx, int n_q)
{
#ifdef DFLASH_SM90A
    extern __shared__ unsigned char smem_wg[];
    unsigned char *smem = (unsigned char *)(((uintptr_t)smem_wg + 1023) & ~(uintptr_t)1023);
    int w = blockIdx.x;
    if (w < n_ctx) {
        dkv_sm90<HD>(a, smem, 0, w);
        return;
    }
    w -= n_ctx;
    if (DQ && w < n_q) { // without DQ (n_q 0) the kernel holds no dq code
        dq_sm90<HD>(a, smem, n_q / a.nkv - 1 - w / a.nkv, w % a.nkv);
        return;
    }
    dkv_sm90<HD>(a, smem, 1, w - n_q);
#endif
}

// ---- scalar path ----

// The keys of one query slot: ncv context rows from row cfirst, then block rows from bfirst; nk in all.
struct SlotKeys {
    int cfirst, ncv, bfirst, nk;
};
__device__ __forceinline__ SlotKeys slot_keys(const Args &a, int j, int i)
{
    int c0, b0, b1;
    const int cl = a.ctx_len[j];
    dflash_attn_window(cl, a.B, i, a.W, &c0, &b0, &b1);
    SlotKeys k = {a.ctx_start[j] + c0, cl - c0, j * a.B + b0, 0};
    k.nk = k.ncv + b1 - b0;
    return k;
}

// Key row r (0 <= r < nk) of a slot: the context rows first, then the block's rows.
__device__ __forceinline__ const bf16 *key_row(const bf16 *ctx, int ldc, const bf16 *blk, int ldb, const SlotKeys &k,
                                               int r)
{
    return r < k.ncv ? ctx + (size_t)(k.cfirst + r) * ldc : blk + (size_t)(k.bfirst + r - k.ncv) * ldb;
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// Forward: one warp per (query row, head); each lane scores one key of a 32-key chunk, online softmax.
__global__ void fwd_scalar_kernel(const Args a)
{
    extern __shared__ float sh[]; // per warp: q, acc (hd floats each)
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, hd = a.hd;
    const long long item = (long long)blockIdx.x * (blockDim.x / 32) + warp;
    if (item >= (long long)a.N * a.B * a.nh) return;
    const int qrow = (int)(item / a.nh), h = (int)(item % a.nh), j = qrow / a.B, kh = h / a.G;
    float *qs = sh + (size_t)warp * 2 * hd, *acc = qs + hd;
    for (int d = lane; d < hd; d += 32) {
        qs[d] = __bfloat162float(a.q[(size_t)qrow * a.ldq + (size_t)h * hd + d]);
        acc[d] = 0.0f;
    }
    __syncwarp();
    const SlotKeys sk = slot_keys(a, j, qrow % a.B);
    const int L = sk.nk;
    float m = -INFINITY, l = 0.0f;
    for (int base = 0; base < L; base += 32) {
        const int r = base + lane;
        float sc = -INFINITY;
        if (r < L) {
            const bf16 *kr = key_row(a.kc, a.ldkc, a.kb, a.ldkb, sk, r) + (size_t)kh * hd;
            float dot = 0.0f;
            for (int d = 0; d < hd; d++) dot += qs[d] * __bfloat162float(kr[d]);
            sc = dot * a.scale;
        }
        float bm = sc;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, off));
        const float m_new = fmaxf(m, bm); // finite: lane 0's key exists
        const float corr = expf(m - m_new), p = r < L ? expf(sc - m_new) : 0.0f;
        l = l * corr + warp_sum(p);
        m = m_new;
        const int nk = min(32, L - base);
        for (int d = lane; d < hd; d += 32) acc[d] *= corr;
        for (int jj = 0; jj < nk; jj++) {
            const float pj = __shfl_sync(0xffffffffu, p, jj);
            const bf16 *vr = key_row(a.vc, a.ldvc, a.vb, a.ldvb, sk, base + jj) + (size_t)kh * hd;
            for (int d = lane; d < hd; d += 32) acc[d] += pj * __bfloat162float(vr[d]);
        }
    }
    for (int d = lane; d < hd; d += 32)
        a.out[(size_t)qrow * a.ldo + (size_t)h * hd + d] = __float2bfloat16_rn(acc[d] / l);
    if (lane == 0) a.lse_out[item] = m + logf(l);
}

// dq: one warp per (query row, head); each lane takes one key of a 32-key chunk, then the chunk's dS·K in key order.
__global__ void dq_scalar_kernel(const Args a)
{
    extern __shared__ float sh[]; // per warp: q, dout, acc
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, hd = a.hd;
    const long long item = (long long)blockIdx.x * (blockDim.x / 32) + warp;
    if (item >= (long long)a.N * a.B * a.nh) return;
    const int qrow = (int)(item / a.nh), h = (int)(item % a.nh), j = qrow / a.B, kh = h / a.G;
    float *qs = sh + (size_t)warp * 3 * hd, *ds_ = qs + hd, *acc = ds_ + hd;
    for (int d = lane; d < hd; d += 32) {
        qs[d] = __bfloat162float(a.q[(size_t)qrow * a.ldq + (size_t)h * hd + d]);
        ds_[d] = __bfloat162float(a.dout[(size_t)qrow * a.lddo + (size_t)h * hd + d]);
        acc[d] = 0.0f;
    }
    __syncwarp();
    const float lse = a.lse[item], D = a.delta[item];
    const SlotKeys sk = slot_keys(a, j, qrow % a.B);
    const int L = sk.nk;
    for (int base = 0; base < L; base += 32) {
        const int r = base + lane;
        float ds = 0.0f;
        if (r < L) {
            const bf16 *kr = key_row(a.kc, a.ldkc, a.kb, a.ldkb, sk, r) + (size_t)kh * hd;
            const bf16 *vr = key_row(a.vc, a.ldvc, a.vb, a.ldvb, sk, r) + (size_t)kh * hd;
            float s = 0.0f, dp = 0.0f;
            for (int d = 0; d < hd; d++)
                s += qs[d] * __bfloat162float(kr[d]), dp += ds_[d] * __bfloat162float(vr[d]);
            ds = expf(s * a.scale - lse) * (dp - D);
        }
        const int nk = min(32, L - base);
        for (int jj = 0; jj < nk; jj++) {
            const float dj = __shfl_sync(0xffffffffu, ds, jj);
            const bf16 *kr = key_row(a.kc, a.ldkc, a.kb, a.ldkb, sk, base + jj) + (size_t)kh * hd;
            for (int d = lane; d < hd; d += 32) acc[d] += dj * __bfloat162float(kr[d]);
        }
    }
    for (int d = lane; d < hd; d += 32)
        a.dq[(size_t)qrow * a.lddq + (size_t)h * hd + d] = __float2bfloat16_rn(acc[d] * a.scale);
}

// dk, dv: one warp per (key row, kv head), key rows = the T context rows then the N*B block rows; the blocks that see
// the row in block order, their query rows in (head, slot) order.
__global__ void dkv_scalar_kernel(const Args a)
{
    extern __shared__ float sh[]; // per warp: k, v, dk, dv
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, hd = a.hd;
    const long long item = (long long)blockIdx.x * (blockDim.x / 32) + warp;
    const long long nrows = (long long)a.T + (long long)a.N * a.B;
    if (item >= nrows * a.nkv) return;
    const int vr = (int)(item / a.nkv), kh = (int)(item % a.nkv), src = vr < a.T ? 0 : 1, row = src ? vr - a.T : vr;
    const bf16 *kp = (src ? a.kb + (size_t)row * a.ldkb : a.kc + (size_t)row * a.ldkc) + (size_t)kh * hd;
    const bf16 *vp = (src ? a.vb + (size_t)row * a.ldvb : a.vc + (size_t)row * a.ldvc) + (size_t)kh * hd;
    float *ks = sh + (size_t)warp * 4 * hd, *vs = ks + hd, *dk = vs + hd, *dv = dk + hd;
    for (int d = lane; d < hd; d += 32) {
        ks[d] = __bfloat162float(kp[d]), vs[d] = __bfloat162float(vp[d]);
        dk[d] = dv[d] = 0.0f;
    }
    __syncwarp();
    const int jlo = src ? row / a.B : 0, jhi = src ? row / a.B + 1 : a.N;
    for (int j = jlo; j < jhi; j++) {
        int lo, hi;
        block_interval(a, src, j, lo, hi);
        if (row < lo || row >= hi) continue;
        for (int g = 0; g < a.G; g++) {
            const int h = kh * a.G + g;
            for (int i = 0; i < a.B; i++) {
                if (a.W > 0) { // the slot's own interval under the window
                    int slo, shi;
                    row_interval(a, src, j, i, slo, shi);
                    if (row < slo || row >= shi) continue;
                }
                const size_t qrow = (size_t)j * a.B + i;
                const bf16 *qr = a.q + qrow * a.ldq + (size_t)h * hd, *dr = a.dout + qrow * a.lddo + (size_t)h * hd;
                float s = 0.0f, dp = 0.0f;
                for (int d = lane; d < hd; d += 32)
                    s += __bfloat162float(qr[d]) * ks[d], dp += __bfloat162float(dr[d]) * vs[d];
                s = warp_sum(s), dp = warp_sum(dp);
                const float p = expf(s * a.scale - a.lse[qrow * a.nh + h]);
                const float ds = p * (dp - a.delta[qrow * a.nh + h]) * a.scale;
                for (int d = lane; d < hd; d += 32) {
                    dv[d] += p * __bfloat162float(dr[d]);
                    dk[d] += ds * __bfloat162float(qr[d]);
                }
            }
        }
    }
    bf16 *dkp = (src ? a.dkb + (size_t)row * a.lddkb : a.dkc + (size_t)row * a.lddkc) + (size_t)kh * hd;
    bf16 *dvp = (src ? a.dvb + (size_t)row * a.lddvb : a.dvc + (size_t)row * a.lddvc) + (size_t)kh * hd;
    for (int d = lane; d < hd; d += 32) dkp[d] = __float2bfloat16_rn(dk[d]), dvp[d] = __float2bfloat16_rn(dv[d]);
}

// ---- host ----

constexpr int kScalarWarps = 4;

template <int HD> constexpr size_t fwd_smem()
{
    return (size_t)(tiles<HD>::kQRows + 4 * tiles<HD>::FK) * (HD + 8) * sizeof(bf16);
}
template <int HD> constexpr size_t bwd_smem()
{
    const size_t dq = (size_t)(2 * tiles<HD>::kDqRows + 4 * tiles<HD>::DK) * (HD + 8) * sizeof(bf16);
    const size_t dkv = (size_t)(2 * tiles<HD>::kKvRows + 4 * tiles<HD>::IR) * (HD + 8) * sizeof(bf16) +
                       4 * tiles<HD>::IR * sizeof(float);
    return dq > dkv ? dq : dkv;
}

bool wgmma_device();
// The dS workspace's slots per step (kv head, block, query chunk): ctx for the context tiles a block's interval can meet
// (a window's W-1 rows at most, T at most, ceil(T/64) tiles at most), blk for its block-row tiles (one where 64 % B is
// 0: a block never straddles a tile). From the host's shape alone: the size function and the launch both call it.
// After the dS tiles: the split context dk/dv tiles' fp32 partials (kCtxParts a tile and kv head, 64 x HD x 2 each)
// and their counters. kCtxParts: the heaviest context tile (the first rows, seen by every block of a sorted sequence)
// is the backward's longest chain of steps; split in two it is no longer than the average load of a CTA slot.
constexpr int kCtxParts = 2;
struct WsLayout {
    int ctx, blk, nchunk;
    size_t part_off, count_off, bytes;
};
WsLayout ws_layout(const dflash_attn_shape *s, int T)
{
    const int B = s->block_size, G = s->nh / s->nkv;
    // the rows of one block's context at most: the caller's bound (the longest context), then the window's
    const long long ctx = s->max_ctx > 0 && s->max_ctx < T ? s->max_ctx : T;
    const long long span = s->window > 0 && s->window - 1 < ctx ? s->window - 1 : ctx;
    const int ctx_cap = (T + kWgKeys - 1) / kWgKeys, blk_cap = (int)(((long long)s->nblocks * B + kWgKeys - 1) / kWgKeys);
    WsLayout l;
    l.ctx = span > 0 ? (int)std::min<long long>((span + kWgKeys - 2) / kWgKeys + 1, ctx_cap) : 0;
    l.blk = kWgKeys % B == 0 ? 1 : std::min((B + kWgKeys - 2) / kWgKeys + 1, blk_cap);
    l.nchunk = (G * B + kWgItem - 1) / kWgItem;
    const size_t ctx_slots = (size_t)(T + kWgKeys - 1) / kWgKeys * s->nkv;
    l.part_off = (size_t)s->nkv * s->nblocks * l.nchunk * (l.ctx + l.blk) * kDsTile * sizeof(bf16);
    l.count_off = l.part_off + ctx_slots * kCtxParts * kWgKeys * s->hd * 2 * sizeof(float);
    l.bytes = l.count_off + ctx_slots * sizeof(int);
    return l;
}

template <int HD> constexpr int bwd_sm90_smem()
{
    return wg_dkv_shape<HD>::kSmem > wg_q_shape<HD>::kSmemDq ? wg_dkv_shape<HD>::kSmem : wg_q_shape<HD>::kSmemDq;
}

// The row of table (n rows, each with a .name) named name (a default's: it must exist)
template <class V> int variant_named(const V *table, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(name, table[i].name)) return i;
    fprintf(stderr, "dflash_attention: no variant row named %s\n", name);
    exit(1);
}
// The row of table (n rows, each with a .name) that environment variable var names, or unset the default (dflt); a
// name no row has exits, listing the names. One rule for the variant tables.
template <class V> int variant_from_env(const char *var, const V *table, int n, int dflt)
{
    const char *e = getenv(var);
    if (!e || !*e) return dflt;
    for (int i = 0; i < n; i++)
        if (!strcmp(e, table[i].name)) return i;
    fprintf(stderr, "dflash_attention: %s=%s is none of", var, e);
    for (int i = 0; i < n; i++) fprintf(stderr, " %s", table[i].name);
    fprintf(stderr, "\n");
    exit(1);
}

// The forward's wgmma CTAs (head_dim 128), one row each; the same bits all ways (checked on an H100). cp_async: K and V
// staged by the CTA's threads (fwd_sm90_kernel); tma: by the bulk tensor copy engine (fwd_tma_sm90_kernel), the
// default: 0.415 against 0.532 ms at the 8B drafter row, 0.148 against 0.167 under a 256-row window, 2.5 against 3.4
// ms of a bench_drafter step (H100, bench/RESULTS.md, 2026-12-05 10:37); ws, ws_turns: FlashAttention-3's shape
// (fwd_ws_sm90_kernel; 0.523, 0.526 ms: no faster). The mapped rows take cp_async where the driver cannot make the
// tensor maps. DFLASH_ATTENTION_FWD=<name> (read once) or dflash_attention_fwd_force picks one.
void launch_fwd_cp_async(const Args &a, unsigned n, cudaStream_t st)
{
    fwd_sm90_kernel<128><<<n, kFwdWgs * 128, wg_q_shape<128>::kSmemFwd, st>>>(a);
}
// A forward CTA kind that reads K and V through tensor maps (kernel k, threads and smem bytes a CTA; the smem set once
// per kind: attr_set), or cp_async where the driver cannot make the maps
void launch_fwd_mapped(const Args &a, unsigned n, cudaStream_t st, void (*k)(const Args, const FwdMaps), int threads,
                       int smem, bool &attr_set)
{
    FwdMaps m;
    using wgmma_sm90::make_map;
    const int kc = a.nkv * 128, nb = a.N * a.B;
    if (!make_map(&m.kb, a.kb, a.ldkb, kc, nb, kWgKT) || !make_map(&m.vb, a.vb, a.ldvb, kc, nb, kWgKT) ||
        (a.T > 0 && (!make_map(&m.kc, a.kc, a.ldkc, kc, a.T, kWgKT) || !make_map(&m.vc, a.vc, a.ldvc, kc, a.T, kWgKT)))) {
        launch_fwd_cp_async(a, n, st);
        return;
    }
    if (a.T == 0) m.kc = m.kb, m.vc = m.vb; // (no walk meets a context tile)
    if (!attr_set) {
        CHECK_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        attr_set = true;
    }
    k<<<n, threads, smem, st>>>(a, m);
}
void launch_fwd_tma(const Args &a, unsigned n, cudaStream_t st)
{
    static bool attr_set = false;
    launch_fwd_mapped(a, n, st, fwd_tma_sm90_kernel<128>, kFwdWgs * 128, wg_q_shape<128>::kSmemFwd + 2 * 8, attr_set);
}
// the FlashAttention-3-shaped forward (fwd_ws_sm90_kernel)
void launch_fwd_ws(const Args &a, unsigned n, cudaStream_t st)
{
    static bool attr_set = false;
    launch_fwd_mapped(a, n, st, fwd_ws_sm90_kernel<128>, kFwsThreads, fws_shape<128>::kSmem, attr_set);
}
void launch_fwd_ws_turns(const Args &a, unsigned n, cudaStream_t st)
{
    static bool attr_set = false;
    launch_fwd_mapped(a, n, st, fwd_ws_sm90_kernel<128, true>, kFwsThreads, fws_shape<128>::kSmem, attr_set);
}
struct FwdVariant {
    const char *name;
    void (*launch)(const Args &, unsigned, cudaStream_t);
};
const FwdVariant kFwdVariants[] = {
    {"cp_async", launch_fwd_cp_async},
    {"tma", launch_fwd_tma}, // not yet run on a GPU (bench/RESULTS.md, 2026-12-05, fourth session)
    {"ws", launch_fwd_ws},   // likewise
    {"ws_turns", launch_fwd_ws_turns}, // likewise
};
constexpr int kNFwdVariants = (int)(sizeof kFwdVariants / sizeof kFwdVariants[0]);
int g_fwd_forced = -2; // a row of kFwdVariants, or -2: the environment not read yet
const FwdVariant &fwd_variant()
{
    if (g_fwd_forced == -2)
        g_fwd_forced = variant_from_env("DFLASH_ATTENTION_FWD", kFwdVariants, kNFwdVariants,
                                        variant_named(kFwdVariants, kNFwdVariants, "tma"));
    return kFwdVariants[g_fwd_forced];
}

template <int HD> void launch_fwd(const Args &a, cudaStream_t st)
{
    static bool attr_set = false; // per template instance, once per process
    if (!attr_set) {
        CHECK_CUDA(cudaFuncSetAttribute(fwd_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fwd_smem<HD>()));
        if constexpr (HD == 128)
            CHECK_CUDA(cudaFuncSetAttribute(fwd_sm90_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            wg_q_shape<HD>::kSmemFwd));
        attr_set = true;
    }
    const long long rows = (long long)a.N * a.B * a.G;
    if constexpr (HD == 128) {
        if (wgmma_device()) {
            const unsigned n = (unsigned)((rows + kFwdRows - 1) / kFwdRows * a.nkv);
            fwd_variant().launch(a, n, st);
            CHECK_CUDA_LAUNCH();
            return;
        }
    }
    constexpr int kQRows = tiles<HD>::kQRows;
    dim3 grid((unsigned)((rows + kQRows - 1) / kQRows), (unsigned)a.nkv);
    fwd_kernel<HD><<<grid, kThreads, fwd_smem<HD>(), st>>>(a);
    CHECK_CUDA_LAUNCH();
}

// the wgmma kernels run (head_dim 128): attention.h's rule, as the causal attention's (an sm_90 device,
// DFLASH_ATTENTION not mma_sync)
bool wgmma_device() { return attention_wgmma_chosen(128) != 0; }

// The wg2 dk/dv launch of schedule R (its shared memory set once per process): n_ctx context CTAs, then n_blk block-row ones
template <class R> void launch_dkv_wg2(const Args &a, int n_ctx, int n_blk, cudaStream_t st)
{
    using S = wg2_dkv_shape<128, R>;
    if constexpr (R::kTma) { // TMA where the shape and the driver allow, else the same schedule on cp.async
        Wg2Maps m;
        using wgmma_sm90::make_map;
        const int qc = a.nh * 128, kc = a.nkv * 128, nb = a.N * a.B;
        if (!wg2_tma_shape(a.B, a.G) || !make_map(&m.q, a.q, a.ldq, qc, nb, a.B) ||
            !make_map(&m.dout, a.dout, a.lddo, qc, nb, a.B) ||
            (a.T > 0 && (!make_map(&m.kc, a.kc, a.ldkc, kc, a.T, kWgKeys) ||
                         !make_map(&m.vc, a.vc, a.ldvc, kc, a.T, kWgKeys))) ||
            !make_map(&m.kb, a.kb, a.ldkb, kc, nb, kWgKeys) || !make_map(&m.vb, a.vb, a.ldvb, kc, nb, kWgKeys)) {
            launch_dkv_wg2<typename R::CpAsync>(a, n_ctx, n_blk, st);
            return;
        }
        if (a.T == 0) m.kc = m.kb, m.vc = m.vb; // (no context CTA reads them)
        static bool attr_set = false;
        if (!attr_set) {
            CHECK_CUDA(cudaFuncSetAttribute(dkv_wg2_tma_sm90_kernel<128, R>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            S::kSmem));
            attr_set = true;
        }
        dkv_wg2_tma_sm90_kernel<128, R><<<(unsigned)(n_ctx + n_blk), kWg2Threads, S::kSmem, st>>>(a, n_ctx, m);
    } else {
        static bool attr_set = false;
        if (!attr_set) {
            CHECK_CUDA(cudaFuncSetAttribute(dkv_wg2_sm90_kernel<128, R>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            S::kSmem));
            attr_set = true;
        }
        dkv_wg2_sm90_kernel<128, R><<<(unsigned)(n_ctx + n_blk), kWg2Threads, S::kSmem, st>>>(a, n_ctx);
    }
}

// The dk/dv CTAs the backward can run where it takes the dS workspace (head_dim 128 on wgmma), one row each; the same
// bits all ways. wg1: one warpgroup of 64 key rows (dkv_sm90); the others a producer and two consumer warpgroups of
// 128 key rows (dkv_wg2_sm90) with their schedule (wg2_sched). Unset, the backward takes wg2_tma4_bulk without a window
// (the fastest row on an H100: the 8B backward 1.488 against wg2's 1.56-1.62 ms; in a bench_drafter step 9.1-9.9
// against 10.0-10.2 ms; bench/RESULTS.md, 2026-12-05 10:37; wg2 was wg1's successor there on the H200: 117.7 against
// 120.3 ms a step), else wg1 (faster under a 256-row window: 0.717 against 0.738 ms).
// DFLASH_ATTENTION_DKV=<name> (read once) or dflash_attention_dkv_force forces one.
struct DkvVariant {
    const char *name;
    void (*launch_wg2)(const Args &, int, int, cudaStream_t); // NULL: wg1
};
const DkvVariant kDkvVariants[] = {
    {"wg1", nullptr},
    {"wg2", launch_dkv_wg2<wg2_sched<3, false, false>>},
    // not yet run on a GPU (bench/RESULTS.md, 2026-12-05, fourth session): tests/gpu/dkv_ring_ab.sh
    {"wg2_tracked", launch_dkv_wg2<wg2_sched<3, true, false>>},
    {"wg2_tracked4", launch_dkv_wg2<wg2_sched<4, true, false>>},
    {"wg2_pipe", launch_dkv_wg2<wg2_sched<3, false, true>>},
    {"wg2_tracked4_pipe", launch_dkv_wg2<wg2_sched<4, true, true>>},
    {"wg2_turns", launch_dkv_wg2<wg2_sched<3, false, false, true>>},
    {"wg2_tracked4_turns", launch_dkv_wg2<wg2_sched<4, true, false, true>>},
    {"wg2_bulk", launch_dkv_wg2<wg2_sched<3, false, false, false, true>>},
    {"wg2_tracked4_bulk", launch_dkv_wg2<wg2_sched<4, true, false, false, true>>},
    {"wg2_tma", launch_dkv_wg2<wg2_sched<3, false, false, false, false, true>>},
    {"wg2_tma4", launch_dkv_wg2<wg2_sched<4, false, false, false, false, true>>},
    {"wg2_tma4_bulk", launch_dkv_wg2<wg2_sched<4, false, false, false, true, true>>},
    {"wg2_tma4_turns", launch_dkv_wg2<wg2_sched<4, false, false, true, false, true>>},
};
constexpr int kNDkvVariants = (int)(sizeof kDkvVariants / sizeof kDkvVariants[0]);
constexpr int kDkvByWindow = -1;
int g_dkv_forced = -2; // a row of kDkvVariants, kDkvByWindow, or -2: the environment not read yet

// the row the backward runs under window W
const DkvVariant &dkv_variant(int window)
{
    if (g_dkv_forced == -2) g_dkv_forced = variant_from_env("DFLASH_ATTENTION_DKV", kDkvVariants, kNDkvVariants, kDkvByWindow);
    static const int no_window = variant_named(kDkvVariants, kNDkvVariants, "wg2_tma4_bulk");
    return kDkvVariants[g_dkv_forced >= 0 ? g_dkv_forced : window == 0 ? no_window : 0];
}

// The dq CTAs after the dk/dv ones (with the dS workspace), one row each; the same bits all ways. one: a block each,
// cp.async (dq_ws_sm90_kernel); pair: two blocks each (dq_ws_pair_sm90_kernel); tma: a block each, staged by the bulk
// copy engine (dq_ws_tma_sm90_kernel, where the driver makes its tensor maps, else one). DFLASH_ATTENTION_DQ_WS=<name>
// (read once) or dflash_attention_dq_force picks one; unset: one.
template <int HD> void launch_dq_one(const Args &a, int nchunk, cudaStream_t st)
{
    dq_ws_sm90_kernel<HD><<<(unsigned)(a.N * nchunk * a.nkv), 128, wg_dqws_shape<HD>::kSmem, st>>>(a);
}
template <int HD> void launch_dq_pair(const Args &a, int nchunk, cudaStream_t st)
{
    dq_ws_pair_sm90_kernel<HD><<<(unsigned)((a.N + 1) / 2 * nchunk * a.nkv), 128, wg_dqws_shape<HD, 2>::kSmem, st>>>(a);
}
template <int HD> void launch_dq_tma(const Args &a, int nchunk, cudaStream_t st)
{
    DqMaps m;
    const int kc = a.nkv * HD, nb = a.N * a.B;
    if (!wgmma_sm90::make_map(&m.kb, a.kb, a.ldkb, kc, nb, kWgKT) ||
        (a.T > 0 && !wgmma_sm90::make_map(&m.kc, a.kc, a.ldkc, kc, a.T, kWgKT))) {
        launch_dq_one<HD>(a, nchunk, st);
        return;
    }
    if (a.T == 0) m.kc = m.kb; // (no walk meets a context tile)
    dq_ws_tma_sm90_kernel<HD><<<(unsigned)(a.N * nchunk * a.nkv), 128, dq_tma_smem<HD>(), st>>>(a, m);
}
struct DqVariant {
    const char *name;
    void (*launch)(const Args &, int, cudaStream_t);
};
const DqVariant kDqVariants[] = {
    {"one", launch_dq_one<128>},
    {"pair", launch_dq_pair<128>}, // not yet run on a GPU (bench/RESULTS.md, 2026-12-05, fourth session)
    {"tma", launch_dq_tma<128>},   // likewise
};
constexpr int kNDqVariants = (int)(sizeof kDqVariants / sizeof kDqVariants[0]);
int g_dq_forced = -2; // a row of kDqVariants, or -2: the environment not read yet
const DqVariant &dq_variant()
{
    if (g_dq_forced == -2) g_dq_forced = variant_from_env("DFLASH_ATTENTION_DQ_WS", kDqVariants, kNDqVariants, 0);
    return kDqVariants[g_dq_forced];
}

template <int HD> void launch_bwd(const Args &a, cudaStream_t st)
{
    static bool attr_set = false;
    if (!attr_set) {
        CHECK_CUDA(cudaFuncSetAttribute(bwd_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bwd_smem<HD>()));
        if constexpr (HD == 128) {
            for (auto k : {bwd_sm90_kernel<HD, true>, bwd_sm90_kernel<HD, false>})
                CHECK_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bwd_sm90_smem<HD>()));
            CHECK_CUDA(cudaFuncSetAttribute(dq_ws_sm90_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            wg_dqws_shape<HD>::kSmem));
            CHECK_CUDA(cudaFuncSetAttribute(dq_ws_pair_sm90_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            wg_dqws_shape<HD, 2>::kSmem));
            CHECK_CUDA(cudaFuncSetAttribute(dq_ws_tma_sm90_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            dq_tma_smem<HD>()));
        }
        attr_set = true;
    }
    const long long rows = (long long)a.N * a.B * a.G;
    constexpr int kQRows = tiles<HD>::kDqRows, kKvRows = tiles<HD>::kKvRows, P = tiles<HD>::DKV_PARTS;
    const int n_q = (int)((rows + kQRows - 1) / kQRows) * a.nkv;
    if constexpr (HD == 128) {
        if (wgmma_device()) {
            const int n_ctx = (a.T + kWgRows - 1) / kWgRows * a.nkv;
            const int n_blk = (a.N * a.B + kWgRows - 1) / kWgRows * a.nkv;
            if (a.dsw) { // the dk/dv CTAs alone (they write dS; context tiles in ctx_parts), then dq from their tiles
                const int n_ctx_parts = n_ctx * a.ctx_parts;
                if (a.ctx_parts > 1 && n_ctx > 0)
                    CHECK_CUDA(cudaMemsetAsync(a.dkv_count, 0, (size_t)n_ctx * sizeof(int), st));
                const DkvVariant &v = dkv_variant(a.W);
                if (v.launch_wg2) { // the CTAs of 128 key rows: a producer and two consumer warpgroups
                    const int n2_ctx = (a.T + kWg2Rows - 1) / kWg2Rows * a.nkv * a.ctx_parts;
                    const int n2_blk = (a.N * a.B + kWg2Rows - 1) / kWg2Rows * a.nkv;
                    v.launch_wg2(a, n2_ctx, n2_blk, st);
                } else {
                    bwd_sm90_kernel<HD, false><<<(unsigned)(n_ctx_parts + n_blk), kBwdWgs * 128, bwd_sm90_smem<HD>(), st>>>(a, n_ctx_parts, 0);
                }
                CHECK_CUDA_LAUNCH();
                const int nchunk = (a.G * a.B + kWgItem - 1) / kWgItem;
                dq_variant().launch(a, nchunk, st);
                CHECK_CUDA_LAUNCH();
                return;
            }
            const int nq = (int)((rows + kWgDqRows - 1) / kWgDqRows) * a.nkv;
            bwd_sm90_kernel<HD, true><<<(unsigned)(n_ctx + nq + n_blk), kBwdWgs * 128, bwd_sm90_smem<HD>(), st>>>(a, n_ctx, nq);
            CHECK_CUDA_LAUNCH();
            return;
        }
    }
    const int n_ctx = (a.T + kKvRows - 1) / kKvRows * a.nkv * P;
    const int n_blk = (a.N * a.B + kKvRows - 1) / kKvRows * a.nkv * P;
    bwd_kernel<HD><<<(unsigned)(n_ctx + n_q + n_blk), tiles<HD>::BW * 32, bwd_smem<HD>(), st>>>(a, n_ctx, n_q);
    CHECK_CUDA_LAUNCH();
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// Tensor cores: head dims 16, 32, 64, 128, 256 and every row 16-byte aligned.
bool use_tc(const Args &a, bool bwd)
{
    if (a.hd != 16 && a.hd != 32 && a.hd != 64 && a.hd != 128 && a.hd != 256) return false;
    bool ok = a.ldq % 8 == 0 && a.ldkc % 8 == 0 && a.ldvc % 8 == 0 && a.ldkb % 8 == 0 && a.ldvb % 8 == 0 &&
              aligned16(a.q) && aligned16(a.kc) && aligned16(a.vc) && aligned16(a.kb) && aligned16(a.vb);
    if (!bwd) return ok && a.ldo % 2 == 0 && ((uintptr_t)a.out & 3) == 0;
    return ok && a.lddo % 8 == 0 && aligned16(a.dout) && a.lddq % 2 == 0 && a.lddkc % 2 == 0 && a.lddvc % 2 == 0 &&
           a.lddkb % 2 == 0 && a.lddvb % 2 == 0 && ((uintptr_t)a.dq & 3) == 0 && ((uintptr_t)a.dkc & 3) == 0 &&
           ((uintptr_t)a.dvc & 3) == 0 && ((uintptr_t)a.dkb & 3) == 0 && ((uintptr_t)a.dvb & 3) == 0;
}

Args make_args(const dflash_attn_cuda_in *in, const dflash_attn_shape *s, const char *who)
{
    if (!in || !s || s->nblocks < 0 || s->block_size <= 0 || s->hd <= 0 || s->nkv <= 0 || s->nh <= 0 ||
        s->nh % s->nkv != 0 || in->T < 0 || s->window < 0) {
        fprintf(stderr, "%s: bad shape (N=%d B=%d nh=%d nkv=%d hd=%d T=%d window=%d)\n", who, s ? s->nblocks : -1,
                s ? s->block_size : -1, s ? s->nh : -1, s ? s->nkv : -1, s ? s->hd : -1, in ? in->T : -1,
                s ? s->window : -1);
        exit(1);
    }
    Args a = {};
    a.q = (const bf16 *)in->q, a.kc = (const bf16 *)in->kc, a.vc = (const bf16 *)in->vc;
    a.kb = (const bf16 *)in->kb, a.vb = (const bf16 *)in->vb;
    a.ldq = in->ldq, a.ldkc = in->ldkc, a.ldvc = in->ldvc, a.ldkb = in->ldkb, a.ldvb = in->ldvb;
    a.ctx_start = in->ctx_start, a.ctx_len = in->ctx_len;
    a.T = in->T, a.N = s->nblocks, a.B = s->block_size, a.nh = s->nh, a.nkv = s->nkv, a.G = s->nh / s->nkv;
    a.hd = s->hd;
    a.W = s->window;
    a.scale = s->scale, a.scale_log2 = s->scale * kLog2e;
    a.ctx_parts = 1;
    return a;
}

unsigned scalar_grid(long long items) { return (unsigned)((items + kScalarWarps - 1) / kScalarWarps); }

} // namespace

extern "C" void dflash_attention_forward_cuda(uint16_t *out, int ldo, float *lse, const dflash_attn_cuda_in *in,
                                              const dflash_attn_shape *s, void *stream)
{
    Args a = make_args(in, s, "dflash_attention_forward_cuda");
    if (a.N == 0) return;
    a.out = (bf16 *)out, a.ldo = ldo, a.lse_out = lse;
    cudaStream_t st = (cudaStream_t)stream;
    if (use_tc(a, false)) {
        switch (a.hd) {
        case 16: launch_fwd<16>(a, st); return;
        case 32: launch_fwd<32>(a, st); return;
        case 64: launch_fwd<64>(a, st); return;
        case 128: launch_fwd<128>(a, st); return;
        case 256: launch_fwd<256>(a, st); return;
        default: break;
        }
    }
    fwd_scalar_kernel<<<scalar_grid((long long)a.N * a.B * a.nh), kScalarWarps * 32,
                        (size_t)kScalarWarps * 2 * a.hd * sizeof(float), st>>>(a);
    CHECK_CUDA_LAUNCH();
}

// the dS workspace is used (its size nonzero): head_dim 128 on the wgmma kernels
static bool ws_applies(const dflash_attn_shape *s) { return s->hd == 128 && wgmma_device(); }

extern "C" int dflash_attention_fwd_variants(void) { return kNFwdVariants; }
extern "C" const char *dflash_attention_fwd_variant(int i)
{
    return i >= 0 && i < kNFwdVariants ? kFwdVariants[i].name : NULL;
}
extern "C" void dflash_attention_fwd_force(int i) { g_fwd_forced = i >= 0 && i < kNFwdVariants ? i : -2; }
extern "C" int dflash_attention_dq_variants(void) { return kNDqVariants; }
extern "C" const char *dflash_attention_dq_variant(int i)
{
    return i >= 0 && i < kNDqVariants ? kDqVariants[i].name : NULL;
}
extern "C" void dflash_attention_dq_force(int i) { g_dq_forced = i >= 0 && i < kNDqVariants ? i : -2; }

extern "C" int dflash_attention_dkv_variants(void) { return kNDkvVariants; }
extern "C" const char *dflash_attention_dkv_variant(int i)
{
    return i >= 0 && i < kNDkvVariants ? kDkvVariants[i].name : NULL;
}
extern "C" void dflash_attention_dkv_force(int i) { g_dkv_forced = i >= 0 && i < kNDkvVariants ? i : -2; }

extern "C" size_t dflash_attention_backward_workspace(const dflash_attn_shape *s, int T)
{
    return s->nblocks > 0 && ws_applies(s) ? ws_layout(s, T).bytes : 0;
}

extern "C" void dflash_attention_backward_cuda(const dflash_attn_cuda_grads *g, float *delta, void *workspace,
                                               size_t workspace_bytes, const uint16_t *dout, int lddo,
                                               const uint16_t *out, int ldo, const float *lse,
                                               const dflash_attn_cuda_in *in, const dflash_attn_shape *s,
                                               void *stream)
{
    Args a = make_args(in, s, "dflash_attention_backward_cuda");
    static int recompute = -1; // DFLASH_ATTENTION_DQ=recompute: dq recomputes dS (the one-launch backward), for A/B
    if (workspace && !env_switch(&recompute, "DFLASH_ATTENTION_DQ", "recompute") && a.N > 0 && ws_applies(s)) {
        const WsLayout l = ws_layout(s, a.T);
        if (workspace_bytes >= l.bytes) { // a smaller one: this call recomputes
            static int unsplit = -1; // DFLASH_ATTENTION_DKV_SPLIT=0: the context dk/dv tiles in one CTA each, for A/B
            a.dsw = (bf16 *)workspace, a.ws_nct = l.ctx, a.ws_stride = l.ctx + l.blk;
            a.ctx_parts = env_switch(&unsplit, "DFLASH_ATTENTION_DKV_SPLIT", "0") ? 1 : kCtxParts;
            a.dkv_part = (float *)((char *)workspace + l.part_off), a.dkv_count = (int *)((char *)workspace + l.count_off);
        }
    }
    cudaStream_t st = (cudaStream_t)stream;
    const size_t kd = (size_t)a.nkv * a.hd * sizeof(uint16_t);
    if (a.N == 0) { // no query sees the context: its gradients are zero
        if (a.T > 0) {
            CHECK_CUDA(cudaMemset2DAsync(g->dkc, (size_t)g->lddkc * 2, 0, kd, (size_t)a.T, st));
            CHECK_CUDA(cudaMemset2DAsync(g->dvc, (size_t)g->lddvc * 2, 0, kd, (size_t)a.T, st));
        }
        return;
    }
    a.dout = (const bf16 *)dout, a.lddo = lddo, a.lse = lse, a.delta = delta;
    a.dq = (bf16 *)g->dq, a.dkc = (bf16 *)g->dkc, a.dvc = (bf16 *)g->dvc, a.dkb = (bf16 *)g->dkb;
    a.dvb = (bf16 *)g->dvb;
    a.lddq = g->lddq, a.lddkc = g->lddkc, a.lddvc = g->lddvc, a.lddkb = g->lddkb, a.lddvb = g->lddvb;
    const long long qitems = (long long)a.N * a.B * a.nh;
    delta_kernel<<<(unsigned)((qitems + 7) / 8), 256, 0, st>>>(delta, a.dout, lddo, (const bf16 *)out, ldo,
                                                                 a.N * a.B, a.nh, a.hd);
    CHECK_CUDA_LAUNCH();
    if (use_tc(a, true)) {
        switch (a.hd) {
        case 16: launch_bwd<16>(a, st); return;
        case 32: launch_bwd<32>(a, st); return;
        case 64: launch_bwd<64>(a, st); return;
        case 128: launch_bwd<128>(a, st); return;
        case 256: launch_bwd<256>(a, st); return;
        default: break;
        }
    }
    dq_scalar_kernel<<<scalar_grid(qitems), kScalarWarps * 32, (size_t)kScalarWarps * 3 * a.hd * sizeof(float),
                       st>>>(a);
    CHECK_CUDA_LAUNCH();
    const long long kitems = ((long long)a.T + (long long)a.N * a.B) * a.nkv;
    dkv_scalar_kernel<<<scalar_grid(kitems), kScalarWarps * 32, (size_t)kScalarWarps * 4 * a.hd * sizeof(float),
                        st>>>(a);
    CHECK_CUDA_LAUNCH();
}
