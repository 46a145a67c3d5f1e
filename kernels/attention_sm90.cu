// attention_sm90: causal flash attention forward over packed variable-length sequences, GQA, bf16 in/out, for Hopper
// (sm_90a): the tensor cores fed by wgmma from shared memory, the tiles staged by the bulk tensor copy engine (TMA).
//
// Persistent: one CTA per SM walks work items (a block of 128 queries of one head of one sequence), query blocks from
// the last (longest causal rows) to the first, heads fastest (a GQA group's heads share K/V in L2), CTA b taking the
// b-th, (b + grid)-th, ... of the items that exist (dealt as a snake); a sequence's last block of at most 64 queries is
// one item for two heads of a GQA group (next_item). Three warpgroups. Warpgroup 0 is the producer:
// one warp brings each item's Q tile into one of two Q buffers (so it lands while the previous item runs), one streams
// the K tiles and one the V tiles (128 keys x head_dim) of its causal range through two shared-memory stages each,
// every buffer guarded by a "full" mbarrier (the copy landed) and an "empty" one (both consumers are done with it);
// each runs ahead into the next item as its buffers free up. Tiles come by TMA (one 64-column box per panel, completing
// on the full barrier with its byte count); a sequence's last, partial tile reads the next sequence's first rows with
// it (keys masked for every stored row, query rows never stored), and only a box past the end of the packed rows (whose
// count this API does not carry) comes by cp.async from the producer warp with the rows past the sequence zero.
// Warpgroups 1 and 2 are consumers, 64 query rows each: S = Q·Kᵀ (wgmma, Q and K from shared memory, 64 x 128 fp32 in
// registers), the causal mask on the diagonal tile, the online softmax in registers (fp32 running max and sum, exp2
// with the scale folded in), P rounded to bf16 in registers as the A operand of O += P·V (wgmma with V from shared
// memory, transposed by its descriptor). S of tile j is issued together with P(j-1)·V(j-1), so the softmax of tile j
// runs while the tensor cores do the previous tile's second GEMM; an item's last P·V goes with the next item's first S.
// The two consumers take turns issuing (a named-barrier ping-pong, as FlashAttention-3), so one's softmax overlaps the
// other's GEMMs. setmaxnreg moves registers from the producer to the consumers. Shared-memory tiles are 128-byte
// swizzled 64-column panels (wgmma_sm90.cuh), written identically by TMA and by the cp.async path. Fixed order within
// an item and no atomics: the result is deterministic. head_dim 64 and 128 (attention.cu's mma.sync kernel takes the
// others).
// The fold (attention_qfold, opt-in: its own kernel instances, FOLD 1 and 2): Q arrives raw and each consumer norms
// and rotates its 64 rows of the tile in shared memory (qfold_pass, qk_norm_rope_cuda's per-token arithmetic to the
// bit) before its first S of the item; FOLD 2 does most of those passes ahead, one per step of the previous item
// while its GEMMs run, once the next Q tile has landed, and begin() only the passes left.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "attention.h"
#include "cuda_check.h"
#include "env_switch.h"
#include "mma_sm80.cuh"
#include "wgmma_sm90.cuh"

namespace {

using namespace wgmma_sm90;

constexpr int kConsumers = 2;                     // consumer warpgroups, 64 query rows each
constexpr int kThreads = (kConsumers + 1) * 128;  // + the producer warpgroup
constexpr int kBM = 64 * kConsumers;              // queries per CTA
constexpr int kStages = 2;
// setmaxnreg moves registers within the CTA: launched at 168 a thread (384 threads), the producer's 128 threads free
// 128 x (168 - 40) and the consumers' 256 take exactly that, 256 x (232 - 168); an inc the frees do not cover waits
// forever (48 for the producer hung the kernel)
[[maybe_unused]] constexpr int kProducerRegs = 40, kConsumerRegs = 232;
static_assert(128 * (168 - kProducerRegs) == 256 * (kConsumerRegs - 168), "the consumers take what the producer frees");

template <int HD> struct sm90_shape {
    static constexpr int kBN = 128; // keys per K/V tile
    static constexpr int kPanels = HD / 64; // 64-column (128-byte) swizzled panels per row
    static constexpr int kQBytes = kBM * HD * 2;
    static constexpr int kTileBytes = kBN * HD * 2; // one K or V tile
    static constexpr int kBarOffset = 2 * kQBytes + 2 * kStages * kTileBytes; // two Q buffers, the K and V stages
    // 12 barriers and the fold's 4 next-item records (attention_qfold); slack to align the base to 1024 bytes
    static constexpr int kSmem = kBarOffset + 128 + 1024;
};
// the head dims the kernel takes fill whole 128-byte panels (also read where the sm_90a code is compiled out)
static_assert(sm90_shape<64>::kPanels == 1 && sm90_shape<128>::kPanels == 2, "head_dim 64 and 128: 1 and 2 panels");

// The Q side of qk_norm_rope folded in (attention_qfold; device pointers, w NULL: no norm)
struct qfold_args {
    const __nv_bfloat16 *w;
    float eps;
    const int32_t *pos;
    const double *inv_freq;
};

#ifdef DFLASH_SM90A
// rows [row0, row0 + ROWS) of a (len, HD) slice with row stride ld into swizzled panels PANEL_ROWS rows apart, rows
// >= len zero; threads tid, tid + nthr, ... of the caller each issue their share of 16-byte cp.async copies
template <int HD, int ROWS, int PANEL_ROWS>
__device__ __forceinline__ void cp_tile_sw128(unsigned char *tile, const __nv_bfloat16 *base, int ld, int row0,
                                              int len, int tid, int nthr)
{
    constexpr int kChunks = HD / 8;
#pragma unroll 4
    for (int c = tid; c < ROWS * kChunks; c += nthr) {
        const int r = c / kChunks, ch = c % kChunks, panel = ch >> 3, cc = ch & 7;
        const bool valid = row0 + r < len;
        const __nv_bfloat16 *src = base + (size_t)(valid ? row0 + r : 0) * ld + ch * 8;
        mma_sm80::cp_async16(tile + panel * PANEL_ROWS * 128 + r * 128 + ((cc ^ (r & 7)) << 4), src, valid);
    }
}

template <int HD>
__device__ __forceinline__ void wgmma_pv(float (&o)[HD / 2], const uint32_t (&a)[4], uint64_t db);
template <> __device__ __forceinline__ void wgmma_pv<128>(float (&o)[64], const uint32_t (&a)[4], uint64_t db)
{
    wgmma_rs_m64n128k16_tb(o, a, db, 1);
}
template <> __device__ __forceinline__ void wgmma_pv<64>(float (&o)[32], const uint32_t (&a)[4], uint64_t db)
{
    wgmma_rs_m64n64k16_tb(o, a, db, 1);
}

// online softmax state of a thread's two rows (g and g + 8 of its warp's 16): running max (log2 units), partial row
// sum (this thread's columns), and the factor the last step rescaled by
struct softmax_state {
    float m_a, m_b, l_a, l_b, corr_a, corr_b;
};

// S = Q·Kᵀ for this warpgroup's 64 rows and a 128-key tile: HD/16 wgmma k16 steps (32 bytes along a panel's row,
// the next panel every 4 steps), issued, not waited for
template <int BN> __device__ __forceinline__ void wgmma_qk(float (&s)[BN / 2], uint64_t da, uint64_t db, int scale_d);
template <> __device__ __forceinline__ void wgmma_qk<128>(float (&s)[64], uint64_t da, uint64_t db, int scale_d)
{
    wgmma_ss_m64n128k16(s, da, db, scale_d);
}

template <int HD, int kBN>
__device__ __forceinline__ void issue_qk(float (&s)[kBN / 2], uint32_t sq_addr, uint32_t sk_addr)
{
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const uint32_t off = (uint32_t)(kk % 4) * 32;
        wgmma_qk<kBN>(s, sw128_desc(sq_addr + (kk / 4) * kBM * 128 + off, 16, 1024),
                      sw128_desc(sk_addr + (kk / 4) * kBN * 128 + off, 16, 1024), kk > 0);
    }
}

// O += P·V: V panels kBN * 128 bytes apart, 8-key groups 1024 bytes, 16 keys (2048 bytes) a step; issued only
template <int HD, int kBN>
__device__ __forceinline__ void issue_pv(float (&o)[HD / 2], const uint32_t (&pa)[kBN / 16][4], uint32_t sv_addr)
{
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; kk++) wgmma_pv<HD>(o, pa[kk], sw128_desc(sv_addr + kk * 2048, kBN * 128, 1024));
}

// The fold: this consumer's 64 Q rows of an item (row r of 64-column panel p at tile + p * kBM * 128 + r * 128,
// 16-byte chunk c at chunk c ^ (r & 7); packed row row0 + r, its position pos[row0 + r]) normed and rotated in place,
// bitwise as
// qk_norm_rope_cuda's per-token kernel (qk_norm_rope_tok_kernel) does them. There lane v of a row's G = HD/8 holds
// chunk v (elements 8v..8v+7) and sums its squares as nvcc contracts `ss += f.x * f.x + f.y * f.y` from 0: ((q0 +
// q1) + q2) + q3, q_j = fma(x_2j, x_2j, x_2j+1²); the row's sum is the butterfly over xor G/2, G/4, .., 1; rstd =
// rsqrt(fma(ss, 1/HD, eps)) (its ss / HD + eps); a = w·(rstd·x); element i < HD/2 pairs with i + HD/2 (the lane
// G/2 away); the angle pos·inv_freq[i] in double, reduced to [-π, π] by fma(rint(ang / 2π), -2π, ang), __sincosf
// of it as a float; x1' = fma(c, x1, -(s·x2)), x2' = fma(c, x2, s·x1); one bf16 rounding. Here a thread holds chunk
// u and its partner u + G/2 (the butterfly's first stage is the sum of their two sums: the same tree) and writes
// both: G/2 threads a row, 256/G rows a pass (kQfoldPasses passes of 64 rows; a warp's rows are its own in every
// pass). The explicit _rn intrinsics keep nvcc from contracting otherwise.
// Element pairs are re-read from shared memory 4 bytes at a time, the pair index rotated by the row's place in its
// warp so that a warp's accesses hit 32 different banks: the consumers' registers are nearly all held by O, S and P
// here (a whole row in registers spilled). Rows r >= nvalid (past the sequence: the next sequence's, or zero) become
// zero. Generic-proxy stores: the caller fences and syncs before the wgmma reads them.
template <int HD> constexpr int kQfoldPasses = 64 / (128 / (HD / 16)); // 4 at HD 128, 2 at HD 64

// shared-memory accesses of the fold by 32-bit address (no 64-bit generic pointers: registers are scarce there)
__device__ __forceinline__ uint4 lds128(uint32_t a)
{
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a)
                 : "memory");
    return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t a)
{
    uint32_t v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(a) : "memory");
    return v;
}
__device__ __forceinline__ void sts32(uint32_t a, uint32_t v)
{
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
}
__device__ __forceinline__ int2 lds64(uint32_t a)
{
    int2 v;
    asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(a) : "memory");
    return v;
}
__device__ __forceinline__ void sts64(uint32_t a, int x, int y)
{
    asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(a), "r"(x), "r"(y) : "memory");
}
__device__ __forceinline__ float2 bf2_to_f2(uint32_t v)
{
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&v));
}
__device__ __forceinline__ uint32_t f2_to_bf2(float lo, float hi)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

// pass `pass` of the fold (one row of each thread's; the same across a warp) over the rows of the tile at shared
// address tile whose packed row is row0 + r, valid (the rest zero) for r < nvalid; UNROLL element pairs in flight
template <int HD, int UNROLL>
__device__ __forceinline__ void qfold_pass(uint32_t tile, int row0, int nvalid, const qfold_args &f, int tid, int pass)
{
    constexpr int G = HD / 8, P = G / 2, kRows = 128 / P;
    const double two_pi = 6.283185307179586476925, inv_two_pi = 0.15915494309189533577;
    const int u = tid % P, r_in = tid / P, slot = r_in % (32 / P); // slot: the row's place in its warp
    const int ca = u, cb = u + P; // chunk indices along the row (8 per panel)
    const int r = r_in + pass * kRows;
    const uint32_t pa = tile + (ca >> 3) * kBM * 128 + r * 128 + (((ca & 7) ^ (r & 7)) << 4);
    const uint32_t pb = tile + (cb >> 3) * kBM * 128 + r * 128 + (((cb & 7) ^ (r & 7)) << 4);
    float ss;
    {
        const uint4 xa = lds128(pa), xb = lds128(pb);
        const uint32_t ha[4] = {xa.x, xa.y, xa.z, xa.w}, hb[4] = {xb.x, xb.y, xb.z, xb.w};
        float ssa = 0.0f, ssb = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float2 fa = bf2_to_f2(ha[j]), fb = bf2_to_f2(hb[j]);
            const float qa = __fmaf_rn(fa.x, fa.x, __fmul_rn(fa.y, fa.y));
            const float qb = __fmaf_rn(fb.x, fb.x, __fmul_rn(fb.y, fb.y));
            ssa = j ? __fadd_rn(ssa, qa) : qa, ssb = j ? __fadd_rn(ssb, qb) : qb;
        }
        ss = __fadd_rn(ssa, ssb); // the butterfly's stage xor G/2
    }
#pragma unroll
    for (int o = P / 2; o > 0; o >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, o));
    const float rstd = rsqrtf(__fmaf_rn(ss, 1.0f / (float)HD, f.eps));
    const bool valid = r < nvalid;
    const double p = (double)(valid ? f.pos[row0 + r] : 0);
#pragma unroll UNROLL
    for (int jj = 0; jj < 4; jj++) { // a pair of elements of each chunk at a time
        const int j = (jj + slot) & 3, i0 = 8 * ca + 2 * j;
        float2 a = bf2_to_f2(lds32(pa + 4 * j)), b = bf2_to_f2(lds32(pb + 4 * j));
        if (f.w) {
            const float2 wa = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(f.w + i0));
            const float2 wb = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(f.w + i0 + HD / 2));
            a.x = __fmul_rn(wa.x, __fmul_rn(rstd, a.x)), a.y = __fmul_rn(wa.y, __fmul_rn(rstd, a.y));
            b.x = __fmul_rn(wb.x, __fmul_rn(rstd, b.x)), b.y = __fmul_rn(wb.y, __fmul_rn(rstd, b.y));
        }
        float o1[2], o2[2];
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const float x1 = e ? a.y : a.x, x2 = e ? b.y : b.x;
            double ang = __dmul_rn(f.inv_freq[i0 + e], p);
            ang = __fma_rn(rint(__dmul_rn(ang, inv_two_pi)), -two_pi, ang);
            float sn, cs;
            __sincosf((float)ang, &sn, &cs);
            o1[e] = __fmaf_rn(cs, x1, -__fmul_rn(sn, x2));
            o2[e] = __fmaf_rn(cs, x2, __fmul_rn(sn, x1));
        }
        sts32(pa + 4 * j, valid ? f2_to_bf2(o1[0], o1[1]) : 0u);
        sts32(pb + 4 * j, valid ? f2_to_bf2(o2[0], o2[1]) : 0u);
    }
}

// whether the phase of the given parity has completed, without waiting, the same answer across the warp
__device__ __forceinline__ bool mbar_done_warp(uint64_t *bar, uint32_t parity)
{
    uint32_t ok;
    asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(ok)
                 : "r"(smem_u32(bar)), "r"(parity)
                 : "memory");
    return __all_sync(0xffffffffu, ok);
}

// the causal mask (when a key of the tile can pass a row of this warpgroup; keys >= len then pass every stored row
// too), then the online softmax in log2 units: p = 2^(s·scale_log2 − m), rounded to bf16 into the A fragments of
// P·V (a[0] row g keys 2t.., a[1] row g+8, a[2] row g keys 8+2t.., a[3] row g+8)
template <int kBN>
__device__ __forceinline__ void online_softmax(float (&s)[kBN / 2], bool mask, int k0, int row_a, int row_b,
                                               float scale_log2, softmax_state &st, uint32_t (&pa)[kBN / 16][4])
{
    const int t4 = threadIdx.x & 3;
    if (mask) {
#pragma unroll
        for (int i = 0; i < kBN / 8; i++) {
            const int key = k0 + i * 8 + t4 * 2;
            if (key > row_a) s[4 * i] = -INFINITY;
            if (key + 1 > row_a) s[4 * i + 1] = -INFINITY;
            if (key > row_b) s[4 * i + 2] = -INFINITY;
            if (key + 1 > row_b) s[4 * i + 3] = -INFINITY;
        }
    }
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int i = 0; i < kBN / 8; i++) {
        mx_a = fmaxf(mx_a, fmaxf(s[4 * i], s[4 * i + 1]));
        mx_b = fmaxf(mx_b, fmaxf(s[4 * i + 2], s[4 * i + 3]));
    }
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
    const float mn_a = fmaxf(st.m_a, mx_a * scale_log2), mn_b = fmaxf(st.m_b, mx_b * scale_log2);
    st.corr_a = mma_sm80::fast_exp2(st.m_a - mn_a), st.corr_b = mma_sm80::fast_exp2(st.m_b - mn_b);
    st.m_a = mn_a, st.m_b = mn_b;
    float rs_a = 0.0f, rs_b = 0.0f;
#pragma unroll
    for (int i = 0; i < kBN / 8; i++) {
        const float p0 = mma_sm80::fast_exp2(fmaf(s[4 * i], scale_log2, -mn_a));
        const float p1 = mma_sm80::fast_exp2(fmaf(s[4 * i + 1], scale_log2, -mn_a));
        const float p2 = mma_sm80::fast_exp2(fmaf(s[4 * i + 2], scale_log2, -mn_b));
        const float p3 = mma_sm80::fast_exp2(fmaf(s[4 * i + 3], scale_log2, -mn_b));
        rs_a += p0 + p1, rs_b += p2 + p3;
        pa[i / 2][(i & 1) * 2] = mma_sm80::pack_bf16(p0, p1);
        pa[i / 2][(i & 1) * 2 + 1] = mma_sm80::pack_bf16(p2, p3);
    }
    st.l_a = st.l_a * st.corr_a + rs_a, st.l_b = st.l_b * st.corr_b + rs_b;
}

// pins the P fragments in their registers before the wgmma fence (so no move of them lands among the wgmmas)
template <int kBN> __device__ __forceinline__ void fence_regs_u(uint32_t (&p)[kBN / 16][4])
{
#pragma unroll
    for (int kk = 0; kk < kBN / 16; kk++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(p[kk][e])::"memory");
}

template <int HD> __device__ __forceinline__ void rescale(float (&o)[HD / 2], const softmax_state &st)
{
#pragma unroll
    for (int i = 0; i < HD / 8; i++) {
        o[4 * i] *= st.corr_a, o[4 * i + 1] *= st.corr_a;
        o[4 * i + 2] *= st.corr_b, o[4 * i + 3] *= st.corr_b;
    }
}

// the consumers' turns at the tensor cores (turn_begin / turn_end, wgmma_sm90.cuh): in each step (S(j) with
// P(j-1)·V(j-1)) warpgroup w waits for its turn before it issues its wgmmas and hands the turn over after, so the two
// alternate and the softmax of one runs while the other's GEMMs do. Both walk the same steps; the last hand-over
// (consumer 1's, on barrier 1) is left unmatched at exit.

// The work items in order: query blocks from the last (the longest causal rows) to the first, within one the
// sequences that reach it, heads fastest (a GQA group's heads are neighbours in time and share K/V in L2). The items
// that exist are dealt to the CTAs in rounds of gridDim.x, CTA b taking the b-th of a round and the b-th from the
// end of the next (a snake: the longer items of each round go to the CTAs that got the shorter ones of the one
// before). Dealt over every (query block, sequence, head) slot, the blocks past a sequence's end left holes that
// unbalanced the CTAs by ~9% on the benchmark batch; dealt round robin over the existing ones ~3%, as a snake ~1.6%
// (in tiles). Producer and consumers walk it alike. cursor (qb, seq): the pair under the walk, c: its head 0's
// index among the existing items, next: the index this CTA takes next, in round `round`.
// A sequence's last query block with at most 64 rows (8 of the benchmark batch's 16) would leave consumer 1's rows
// all past the end, computed for nothing over the longest causal range of the sequence; when the GQA group is even
// (pairs) such a block is one item for two heads of a group instead (a paired item: head and head + 1, the same K/V
// tiles), consumer c taking the block's rows of head head + c. Those pairs have nh / 2 items.
struct item_walk {
    int qb, seq, c, next, round;
};
struct work_item {
    int qb, head, start, len, pair;
};
__device__ __forceinline__ bool next_item(item_walk &w, const int32_t *cu_seqlens, int nseq, int nh, int pairs,
                                          work_item &it)
{
    while (w.qb >= 0) {
        const int start = cu_seqlens[w.seq], len = cu_seqlens[w.seq + 1] - start;
        if (w.qb * kBM < len) {
            const int pair = pairs && len - w.qb * kBM <= 64, cnt = nh >> pair;
            if (w.next < w.c + cnt) {
                it.qb = w.qb, it.head = (w.next - w.c) << pair, it.start = start, it.len = len, it.pair = pair;
                w.round++;
                w.next = w.round * (int)gridDim.x +
                         ((w.round & 1) ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x);
                return true;
            }
            w.c += cnt;
        }
        if (++w.seq == nseq) w.seq = 0, w.qb--;
    }
    return false;
}
#endif

template <int HD, bool PINGPONG, int FOLD>
__global__ void __launch_bounds__(kThreads, 1)
    flash_fwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                          const __grid_constant__ CUtensorMap tm_v, int use_tma, __nv_bfloat16 *out, int ldo,
                          const __nv_bfloat16 *q, int ldq, const __nv_bfloat16 *k, int ldk, const __nv_bfloat16 *v,
                          int ldv, const int32_t *cu_seqlens, int nseq, int nh, int nqb, int group, float scale_log2,
                          int pairs, qfold_args fold)
{
#ifdef DFLASH_SM90A
    using S = sm90_shape<HD>;
    constexpr int kBN = S::kBN;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    unsigned char *sq = smem, *sk = sq + 2 * S::kQBytes, *sv = sk + kStages * S::kTileBytes; // Q double-buffered
    uint64_t *bars = reinterpret_cast<uint64_t *>(smem + S::kBarOffset);
    uint64_t *full_k = bars, *full_v = bars + kStages, *empty_k = bars + 2 * kStages, *empty_v = bars + 3 * kStages;
    uint64_t *full_q = bars + 4 * kStages, *empty_q = full_q + 2;
    // the fold's next-item record of consumer c in item n: (first packed row, valid rows) at nx_rec + 2 c + (n & 1)
    uint64_t *const nx_rec = empty_q + 2;
    static_assert(4 * kStages + 4 + 4 <= 128 / 8, "the barriers and the fold's records fit their 128 bytes");

    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; s++) {
            mbar_init(full_k + s, 1);
            mbar_init(full_v + s, 1);
            mbar_init(empty_k + s, kConsumers * 4); // one arrival per consumer warp
            mbar_init(empty_v + s, kConsumers * 4);
        }
        for (int b = 0; b < 2; b++) mbar_init(full_q + b, 1), mbar_init(empty_q + b, kConsumers * 4);
        mbar_init_fence();
    }
    __syncthreads();

    // Persistent: CTA b walks its work items (next_item). Producer and consumers walk the same items, so the tile
    // counter t (stage t % kStages, parity (t / kStages) & 1) and the item counter n (Q buffer n & 1, parity
    // (n >> 1) & 1) agree between them.
    const int wg = threadIdx.x / 128;
    item_walk walk{nqb - 1, 0, 0, (int)blockIdx.x, 0};
    work_item it;
    if (wg == 0) { // producer: warp 0 streams the K tiles, warp 1 the V tiles, warp 2 the Q tiles
        setmaxnreg_dec<kProducerRegs>();
        const int pw = threadIdx.x / 32, lane = threadIdx.x % 32;
        if (pw > 2) return;
        if (use_tma && threadIdx.x == 0) tma_prefetch_map(&tm_q), tma_prefetch_map(&tm_k), tma_prefetch_map(&tm_v);
        // TMA reads a box whole: a tile that ends past its sequence (its last, partial one) reads the next
        // sequence's first rows, which only keys masked for every stored row (p exactly 0) and query rows never
        // stored see; only a box past the packed rows' end (the last sequence's last tile) comes by cp.async instead
        const int total = cu_seqlens[nseq];
        // one K or V tile (rows [row0, row0 + kBN) of a sequence slice at base) into dst: TMA when the box stays
        // inside the packed rows, else cp.async with the rows past the sequence zero; completes on full
        auto load = [&](unsigned char *dst, const CUtensorMap *map, const __nv_bfloat16 *base, int ld, int col,
                        int start, int row0, int len, uint64_t *full) {
            if (use_tma && start + row0 + kBN <= total) {
                if (lane == 0) {
                    mbar_arrive_expect_tx(full, S::kTileBytes);
#pragma unroll
                    for (int p = 0; p < S::kPanels; p++)
                        tma_load_2d(dst + p * kBN * 128, map, col + p * 64, start + row0, full);
                }
                __syncwarp();
            } else {
                cp_tile_sw128<HD, kBN, kBN>(dst, base + (size_t)start * ld + col, ld, row0, len, lane, 32);
                mma_sm80::cp_async_commit();
                mma_sm80::cp_async_wait<0>();
                fence_proxy_async(); // the wgmma reads these bytes through the async proxy
                __syncwarp();
                if (lane == 0) mbar_arrive(full);
            }
        };
        // one item's queries: buffer rows 0-63 (consumer 0's) and 64-127 (consumer 1's), each half 64 rows of a head
        // (the item's 128 rows of its head, or a paired item's 64 rows of head and head + 1); TMA when both boxes
        // stay inside the packed rows, else cp.async
        auto load_q = [&](unsigned char *dst, const work_item &w, uint64_t *full) {
            const int pair = w.pair, row1 = w.qb * kBM + (pair ? 0 : 64); // the second half's first row
            if (use_tma && w.start + row1 + 64 <= total) {
                if (lane == 0) {
                    mbar_arrive_expect_tx(full, S::kQBytes);
#pragma unroll
                    for (int h = 0; h < 2; h++)
#pragma unroll
                        for (int p = 0; p < S::kPanels; p++)
                            tma_load_2d(dst + p * kBM * 128 + h * 64 * 128, &tm_q,
                                        (w.head + (pair ? h : 0)) * HD + p * 64,
                                        w.start + w.qb * kBM + (pair ? 0 : h * 64), full);
                }
                __syncwarp();
            } else {
                for (int h = 0; h < 2; h++)
                    cp_tile_sw128<HD, 64, kBM>(dst + h * 64 * 128,
                                               q + (size_t)w.start * ldq + (w.head + (pair ? h : 0)) * HD, ldq,
                                               w.qb * kBM + (pair ? 0 : h * 64), w.len, lane, 32);
                mma_sm80::cp_async_commit();
                mma_sm80::cp_async_wait<0>();
                fence_proxy_async(); // the wgmma reads these bytes through the async proxy
                __syncwarp();
                if (lane == 0) mbar_arrive(full);
            }
        };
        // Each warp walks the items on its own and waits only for its own buffers: a K tile goes as soon as the S
        // two tiles back is done (not behind the V before it, which waits for a P·V), and an item's queries as
        // soon as the item two back has done its last S (about an item ahead of their use, not a tile)
        if (pw == 2) { // each item's queries into the buffer item n - 2 used
            for (int n = 0; next_item(walk, cu_seqlens, nseq, nh, pairs, it); n++) {
                const int qs = n & 1;
                if (n >= 2) mbar_wait(empty_q + qs, (uint32_t)(((n >> 1) - 1) & 1));
                load_q(sq + qs * S::kQBytes, it, full_q + qs);
            }
            return;
        }
        const bool is_k = pw == 0; // the K tiles, or the V tiles
        unsigned char *const buf = is_k ? sk : sv;
        const CUtensorMap *const map = is_k ? &tm_k : &tm_v;
        const __nv_bfloat16 *const src = is_k ? k : v;
        const int ld = is_k ? ldk : ldv;
        uint64_t *const full = is_k ? full_k : full_v, *const empty = is_k ? empty_k : empty_v;
        for (int t = 0; next_item(walk, cu_seqlens, nseq, nh, pairs, it);) {
            const int nkb = (min(it.len, it.qb * kBM + kBM) + kBN - 1) / kBN, kcol = (it.head / group) * HD;
            for (int j = 0; j < nkb; j++, t++) {
                const int stage = t % kStages;
                if (t >= kStages) mbar_wait(empty + stage, (uint32_t)(((t / kStages) & 1) ^ 1)); // t - kStages done
                load(buf + stage * S::kTileBytes, map, src, ld, kcol, it.start, j * kBN, it.len, full + stage);
            }
        }
        return;
    }

    // consumers
    setmaxnreg_inc<kConsumerRegs>();
    const int cw = wg - 1, tid = threadIdx.x - wg * 128;
    const int warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
    const uint32_t sk0 = smem_u32(sk), sv0 = smem_u32(sv);
    if (cw == 1) turn_end<PINGPONG>(cw); // consumer 0 takes the first turn
    if (!next_item(walk, cu_seqlens, nseq, nh, pairs, it)) return;

    // the item under way (it): t its first tile's counter, n its own, nkb its tiles, r0 this warpgroup's first query
    // row (sequence-local), row_a / row_b this thread's, sq_addr its 64 rows in each Q panel (panels kBM rows apart)
    int t = 0, n = 0, nkb = 0, r0 = 0, row_a = 0, row_b = 0;
    uint32_t sq_addr = 0;
    // the fold (FOLD 1: in begin() only; 2: ahead too): a warp's passes of item n's rows done ahead, during item
    // n - 1's steps (ahead; the same across a warp): each step folds a pass of the next item's rows into the other Q
    // buffer while its GEMMs run, once that Q has landed; begin() does the passes left. The next item's first packed
    // row and valid rows are in shared memory (nx_rec, two per consumer by item parity: written before begin()'s
    // barrier, read in the item's steps, never while a warp still reads the other), not in registers: there every
    // register is held by S, O and P
    int ahead = 0;
    auto begin = [&]() {
        nkb = (min(it.len, it.qb * kBM + kBM) + kBN - 1) / kBN;
        r0 = it.qb * kBM + (it.pair ? 0 : cw * 64);
        row_a = r0 + warp * 16 + g, row_b = row_a + 8;
        sq_addr = smem_u32(sq + (n & 1) * S::kQBytes + cw * 64 * 128);
        mbar_wait(full_q + (n & 1), (uint32_t)((n >> 1) & 1));
        if constexpr (FOLD > 0) { // this warpgroup's rows normed and rotated in place before its first S reads them
#pragma unroll 1
            for (int pass = ahead; pass < kQfoldPasses<HD>; pass++)
                qfold_pass<HD, 2>(smem_u32(sq + (n & 1) * S::kQBytes + cw * 64 * 128), it.start + r0, it.len - r0,
                                  fold, tid, pass);
            if constexpr (FOLD == 2) { // the next item (none: no passes ahead)
                item_walk peek = walk;
                work_item nx{0, 0, 0, 0, 0};
                ahead = next_item(peek, cu_seqlens, nseq, nh, pairs, nx) ? 0 : kQfoldPasses<HD>;
                if (tid == 0) {
                    const int nr0 = nx.qb * kBM + (nx.pair ? 0 : cw * 64);
                    sts64(smem_u32(nx_rec + 2 * cw + (n & 1)), nx.start + nr0, nx.len - nr0);
                }
            }
            fence_proxy_async(); // the wgmma reads the stores through the async proxy
            named_sync(3 + cw, 128); // every warp's rows stored (barriers 1 and 2 are the ping-pong's)
        }
    };
    // O of the item, relative to the running max of the tile whose P is being added; rescaled after that GEMM
    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = 0.0f;
    // key 0 is visible to every row (rows past len too, whose results are never stored), and tile 0 comes first,
    // so the running max is finite from the first tile on
    const softmax_state fresh{-INFINITY, -INFINITY, 0.0f, 0.0f, 0.0f, 0.0f};
    softmax_state st = fresh;
    float s[kBN / 2];
    uint32_t pa[kBN / 16][4], pn[kBN / 16][4];

    // the first S of the CTA's first item, alone (every later item's goes with its predecessor's last P·V)
    begin();
    mbar_wait(full_k, 0);
    issue_qk<HD, kBN>(s, sq_addr, sk0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);
    release(empty_k, lane);
    online_softmax<kBN>(s, kBN - 1 > r0, 0, row_a, row_b, scale_log2, st, pa);

    // one step: S(j) and P(j-1)·V(j-1) in flight together, then the softmax of S(j) (exp2 on the SFU, shuffles)
    // into p_next while the tensor cores do the second GEMM. P alternates between pa and pn without copies (a copy
    // the compiler placed among the wgmmas would serialise them)
    auto step = [&](int j, uint32_t(&p_prev)[kBN / 16][4], uint32_t(&p_next)[kBN / 16][4]) {
        const int stage = (t + j) % kStages, pstage = (t + j - 1) % kStages;
        const uint32_t parity = (uint32_t)(((t + j) / kStages) & 1);
        const uint32_t pparity = (uint32_t)(((t + j - 1) / kStages) & 1);
        mbar_wait(full_k + stage, parity);
        mbar_wait(full_v + pstage, pparity);
        fence_regs_u<kBN>(p_prev);
        turn_begin<PINGPONG>(cw);
        issue_qk<HD, kBN>(s, sq_addr, sk0 + stage * S::kTileBytes);
        wgmma_commit();
        issue_pv<HD, kBN>(o, p_prev, sv0 + pstage * S::kTileBytes);
        wgmma_commit();
        turn_end<PINGPONG>(cw);
        // a pass of the next item's rows (the other Q buffer) while the GEMMs run. Its parity test is safe because
        // this consumer waited (begin) for the phase before, item n - 1's tile in that buffer, and the producer
        // refills it only after both consumers' 8 releases of item n + 1: the phase tested is never two short nor
        // passed
        if constexpr (FOLD == 2)
            if (ahead < kQfoldPasses<HD> && mbar_done_warp(full_q + ((n + 1) & 1), (uint32_t)(((n + 1) >> 1) & 1))) {
                const int2 nx = lds64(smem_u32(nx_rec + 2 * cw + (n & 1)));
                qfold_pass<HD, 1>(smem_u32(sq + ((n + 1) & 1) * S::kQBytes + cw * 64 * 128), nx.x, nx.y, fold, tid,
                                  ahead++);
            }
        wgmma_wait<1>(); // S(j) done, P(j-1)·V(j-1) may still run
        fence_regs(s);
        release(empty_k + stage, lane);
        online_softmax<kBN>(s, j * kBN + kBN - 1 > r0, j * kBN, row_a, row_b, scale_log2, st, p_next);
        wgmma_wait<0>();
        fence_regs(o);
        release(empty_v + pstage, lane);
        rescale<HD>(o, st);
    };

    // O / l into rows [0, len) of the item's sequence, of this warpgroup's head (the row sums are partial per
    // thread: reduced over the 4 threads of a row)
    auto store = [&](const work_item &w, float l_a, float l_b) {
        const int pair = w.pair, ra = w.qb * kBM + (pair ? 0 : cw * 64) + warp * 16 + g, rb = ra + 8;
        l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
        l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
        l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
        l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
        const float inv_a = 1.0f / l_a, inv_b = 1.0f / l_b;
        __nv_bfloat16 *obase = out + (size_t)w.start * ldo + (size_t)(w.head + (pair ? cw : 0)) * HD;
#pragma unroll
        for (int i = 0; i < HD / 8; i++) {
            const int col = i * 8 + t4 * 2;
            if (ra < w.len)
                *reinterpret_cast<uint32_t *>(obase + (size_t)ra * ldo + col) =
                    mma_sm80::pack_bf16(o[4 * i] * inv_a, o[4 * i + 1] * inv_a);
            if (rb < w.len)
                *reinterpret_cast<uint32_t *>(obase + (size_t)rb * ldo + col) =
                    mma_sm80::pack_bf16(o[4 * i + 2] * inv_b, o[4 * i + 3] * inv_b);
        }
    };

    // the item's last P·V (P in p_last), issued together with the next item's first S, whose softmax (fresh state)
    // goes into p_free while the GEMM runs; then the item's O is stored and cleared. Returns whether there is a next
    // item (it, t, n and the rest describe it then).
    auto finish = [&](uint32_t(&p_last)[kBN / 16][4], uint32_t(&p_free)[kBN / 16][4]) -> bool {
        const int vstage = (t + nkb - 1) % kStages;
        const uint32_t vparity = (uint32_t)(((t + nkb - 1) / kStages) & 1);
        const work_item done = it;
        const float l_a = st.l_a, l_b = st.l_b;
        const bool more = next_item(walk, cu_seqlens, nseq, nh, pairs, it);
        mbar_wait(full_v + vstage, vparity);
        if (more) {
            t += nkb, n++;
            begin();
            const int stage = t % kStages;
            mbar_wait(full_k + stage, (uint32_t)((t / kStages) & 1));
            fence_regs_u<kBN>(p_last);
            turn_begin<PINGPONG>(cw);
            issue_qk<HD, kBN>(s, sq_addr, sk0 + stage * S::kTileBytes);
            wgmma_commit();
            issue_pv<HD, kBN>(o, p_last, sv0 + vstage * S::kTileBytes);
            wgmma_commit();
            turn_end<PINGPONG>(cw);
            wgmma_wait<1>();
            fence_regs(s);
            release(empty_k + stage, lane);
            st = fresh;
            online_softmax<kBN>(s, kBN - 1 > r0, 0, row_a, row_b, scale_log2, st, p_free);
        } else {
            fence_regs_u<kBN>(p_last);
            issue_pv<HD, kBN>(o, p_last, sv0 + vstage * S::kTileBytes);
            wgmma_commit();
        }
        wgmma_wait<0>();
        fence_regs(o);
        release(empty_v + vstage, lane);
        store(done, l_a, l_b);
#pragma unroll
        for (int i = 0; i < HD / 2; i++) o[i] = 0.0f;
        return more;
    };

    // one item from its tile 0's P in p0: its steps, then finish. Returns 0 after the CTA's last item, else where
    // the next item's tile 0 P is: 1 in p0, 2 in p1
    auto item = [&](uint32_t(&p0)[kBN / 16][4], uint32_t(&p1)[kBN / 16][4]) __attribute__((always_inline)) -> int {
        int j = 1;
        for (; j + 1 < nkb; j += 2) {
            step(j, p0, p1);
            step(j + 1, p1, p0);
        }
        const bool last_in_p1 = j < nkb;
        if (last_in_p1) step(j, p0, p1);
        release(empty_q + (n & 1), lane); // every S of this item is done
        if (last_in_p1) return finish(p1, p0) ? 1 : 0;
        return finish(p0, p1) ? 2 : 0;
    };
    for (int where = 1; where;) { // where the current item's tile 0 P is: 1 pa, 2 pn
        if (where == 1) where = item(pa, pn);
        else {
            const int r = item(pn, pa);
            where = r ? 3 - r : 0;
        }
    }
#else
    // compiled for a target without wgmma: never launched (attention_wgmma_supported says no there)
    (void)tm_q, (void)tm_k, (void)tm_v, (void)use_tma, (void)out, (void)ldo, (void)q, (void)ldq, (void)k, (void)ldk;
    (void)v, (void)ldv, (void)cu_seqlens, (void)nseq, (void)nh, (void)nqb, (void)group, (void)scale_log2;
    (void)pairs, (void)fold;
#endif
}

template <int HD>
void launch_sm90(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k, int ldk, const uint16_t *v,
                 int ldv, const int32_t *cu_seqlens, int nseq, int max_seqlen, int nh, int nkv, float scale,
                 int want_tma, const attention_qfold *qf, cudaStream_t st)
{
    constexpr int smem = sm90_shape<HD>::kSmem;
    static_assert(smem <= 227 * 1024, "the shared memory of one CTA on sm_90");
    // the six instances: ping-pong or not; no fold, the fold in begin() only, the fold ahead too
    typedef void (*kernel_fn)(const CUtensorMap, const CUtensorMap, const CUtensorMap, int, __nv_bfloat16 *, int,
                              const __nv_bfloat16 *, int, const __nv_bfloat16 *, int, const __nv_bfloat16 *, int,
                              const int32_t *, int, int, int, int, float, int, qfold_args);
    static const kernel_fn kernels[2][3] = {
        {flash_fwd_sm90_kernel<HD, false, 0>, flash_fwd_sm90_kernel<HD, false, 1>, flash_fwd_sm90_kernel<HD, false, 2>},
        {flash_fwd_sm90_kernel<HD, true, 0>, flash_fwd_sm90_kernel<HD, true, 1>, flash_fwd_sm90_kernel<HD, true, 2>}};
    static bool attr_set = false; // per template instance; set once per process (device 0 semantics)
    if (!attr_set) {
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 3; b++)
                CHECK_CUDA(cudaFuncSetAttribute(kernels[a][b], cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        attr_set = true;
    }
    // DFLASH_ATTENTION_PINGPONG=0: the consumers issue their wgmmas without taking turns (measured against)
    static int no_pingpong = -1;
    const int pingpong = !env_switch(&no_pingpong, "DFLASH_ATTENTION_PINGPONG", "0");
    // DFLASH_ATTENTION_PAIRS=0: no paired items (next_item; measured against)
    static int no_pairs = -1;
    const int pairs = !env_switch(&no_pairs, "DFLASH_ATTENTION_PAIRS", "0") && (nh / nkv) % 2 == 0;
    // the maps' row count: an upper bound of the packed rows (the kernel reads by TMA only tiles inside a sequence);
    // Q in 64-row boxes, one for each consumer's half of an item (two heads' in a paired one)
    CUtensorMap tm_q, tm_k, tm_v;
    const uint64_t rows = (uint64_t)nseq * (uint64_t)max_seqlen;
    int tma = want_tma && make_map(&tm_q, q, ldq, nh * HD, rows, 64) &&
              make_map(&tm_k, k, ldk, nkv * HD, rows, sm90_shape<HD>::kBN) &&
              make_map(&tm_v, v, ldv, nkv * HD, rows, sm90_shape<HD>::kBN);
    if (!tma) memset(&tm_q, 0, sizeof tm_q), memset(&tm_k, 0, sizeof tm_k), memset(&tm_v, 0, sizeof tm_v);
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        CHECK_CUDA(cudaGetDevice(&dev));
        CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    }
    const int nqb = (max_seqlen + kBM - 1) / kBM;
    const long long items = (long long)nqb * nseq * nh;
    if (items > INT32_MAX - 2LL * sms) { // the walk's indices go up to a round past the items
        fprintf(stderr, "attention_wgmma_forward_cuda: %lld work items (query blocks x sequences x heads) overflow\n",
                items);
        exit(1);
    }
    const unsigned grid = (unsigned)(items < sms ? items : sms); // one CTA per SM (its shared memory), persistent
    const qfold_args fold = {qf ? (const __nv_bfloat16 *)qf->q_w : nullptr, qf ? qf->eps : 0.0f,
                             qf ? qf->pos : nullptr, qf ? qf->inv_freq : nullptr};
    // DFLASH_ATTENTION_QFOLD=begin: the fold in begin() only, none ahead (measured against)
    static int fold_begin = -1;
    const int mode = !qf ? 0 : env_switch(&fold_begin, "DFLASH_ATTENTION_QFOLD", "begin") ? 1 : 2;
    kernels[pingpong][mode]<<<grid, kThreads, smem, st>>>(
        tm_q, tm_k, tm_v, tma, (__nv_bfloat16 *)out, ldo, (const __nv_bfloat16 *)q, ldq, (const __nv_bfloat16 *)k,
        ldk, (const __nv_bfloat16 *)v, ldv, cu_seqlens, nseq, nh, nqb, nh / nkv, scale * 1.4426950408889634f, pairs,
        fold);
    CHECK_CUDA_LAUNCH();
}

} // namespace

extern "C" int attention_wgmma_supported(int hd)
{
    return (hd == 64 || hd == 128) && wgmma_sm90::sm90a_device();
}

extern "C" void attention_wgmma_qfold_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq,
                                                   const uint16_t *k, int ldk, const uint16_t *v, int ldv,
                                                   const int32_t *cu_seqlens, int nseq, int max_seqlen, int nh,
                                                   int nkv, int hd, float scale, int tma, const attention_qfold *fold,
                                                   void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    if (fold && (!fold->pos || !fold->inv_freq || (uintptr_t)fold->q_w % 4 != 0)) {
        fprintf(stderr, "attention_wgmma_qfold_forward_cuda: the fold needs the rows' positions (%p), inv_freq (%p) "
                        "and a 4-byte aligned q_w (%p)\n", (const void *)fold->pos, (const void *)fold->inv_freq,
                (const void *)fold->q_w);
        exit(1);
    }
#define LAUNCH_SM90(H) \
    launch_sm90<H>(out, ldo, q, ldq, k, ldk, v, ldv, cu_seqlens, nseq, max_seqlen, nh, nkv, scale, tma, fold, st)
    if (hd == 128) LAUNCH_SM90(128);
    else if (hd == 64) LAUNCH_SM90(64);
    else {
        fprintf(stderr, "attention_wgmma_forward_cuda: head_dim %d has no wgmma shape (64 and 128 have)\n", hd);
        exit(1);
    }
#undef LAUNCH_SM90
}

extern "C" void attention_wgmma_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k,
                                             int ldk, const uint16_t *v, int ldv, const int32_t *cu_seqlens, int nseq,
                                             int max_seqlen, int nh, int nkv, int hd, float scale, int tma,
                                             void *stream)
{
    attention_wgmma_qfold_forward_cuda(out, ldo, q, ldq, k, ldk, v, ldv, cu_seqlens, nseq, max_seqlen, nh, nkv, hd,
                                       scale, tma, NULL, stream);
}
