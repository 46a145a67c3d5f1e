// gated_delta_chunk: the chunked gated delta rule (forward) on the tensor cores, in the WY/UT form of
// flash-linear-attention's chunk kernel (fla/ops/gated_delta_rule/chunk.py), fused into one kernel so that no
// workspace is needed and the launcher keeps gated_delta_rule_forward_cuda's signature.
//
// One block (16 warps) per (sequence, value head, tile of BV value columns) walks its sequence in chunks of C = 64
// tokens; a chunk never crosses a sequence (the last one of a sequence is partial, its missing rows zero). With S0
// (Dk, BV) the fp32 state at the chunk start, G_t = Σ_{u<=t} g_u the in-chunk cumulative log-decay (G <= 0), and
//   A  = strictly lower  β_t e^{G_t−G_u} k_t·k_u         (C, C)
//   T  = (I + A)^-1                                     (C, C)  unit lower triangular: the UT transform
//   R  = β ⊙ (V − e^{G} ⊙ K S0)                          (C, BV)
//   δ  = T R                                            (C, BV) the chunk's delta-rule writes
//   O  = e^{G} ⊙ Q S0 + (lower e^{G_t−G_u} q_t·k_u) δ    (C, BV)
//   S  = e^{G_{L−1}} S0 + Kᵀ (e^{G_{L−1}−G} ⊙ δ)          (Dk, BV)
// (the recurrence S ← e^{g}S; δ_t = β_t(v_t − Sᵀk_t); S ← S + k_t δ_tᵀ; o_t = Sᵀq_t, unrolled over one chunk).
// Every exponent is <= 0, so nothing overflows however long the sequence or strong the decay. fla computes W = T·βe^G K
// and U = T·βV and δ = U − W S0 per chunk; multiplying T after the subtraction (δ = T R) is the same algebra with the
// cancellation v − Sᵀk done in fp32 before any rounding, and one product fewer.
//
// Stages of one chunk (the barriers between them are the only block-wide synchronisation):
//   1. warp 0: G (a warp scan), e^{G}, e^{G_{L-1}−G}, β;  all warps: K·Kᵀ, Q·Kᵀ, K·S0, Q·S0 (mma m16n8k16)
//   2. A and the gated Q·Kᵀ to shared fp32, R to shared bf16 (hi, lo)
//   3. T = (I + A)^-1 in fp32: the four 16x16 diagonal blocks by forward substitution in registers (one lane per
//      column), then the blocks below them by T_ij = −T_ii Σ_{j<=k<i} A_ik T_kj, one block diagonal at a time, on
//      the tensor cores with split (hi + lo) operands in both modes
//   4. δ = T R (mma); 5. O (mma, written to global bf16); 6. the state update (mma into the fp32 state, which
//      lives in registers; its bf16 hi + lo copy in shared memory is the next chunk's mma operand).
// The next chunk's K (double-buffered), Q and V are fetched with cp.async as soon as their buffers are free.
// Precision (GATED_DELTA_CHUNK_EXACT): q, k, v are bf16 already; every fp32 operand of a product (S0, T, R, δ and
// the gated Q·Kᵀ) is split into bf16 hi + lo and the product takes hi·hi + hi·lo + lo·hi: ~2^-16 relative per term,
// accumulated in fp32. GATED_DELTA_CHUNK_BF16 takes hi·hi only (fla's precision).
// Decoding (gated_delta_chunk_forward_state_cuda): the state registers start from a carried state (a slot per
// sequence, or zeros) and are stored to another slot after the sequence's last chunk; steps of a few rows a sequence
// go to gated_delta_rule's fp32 kernel instead.
#include <cuda_bf16.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "cuda_check.h"
#include "gated_delta_chunk.h"
#include "gated_delta_rule.h"
#include "mma_sm80.cuh"

using namespace mma_sm80;
typedef __nv_bfloat16 bf16;

#define GDC_C 64                /* tokens per chunk */
#ifndef GDC_WARPS
#define GDC_WARPS 16
#endif
#define GDC_THREADS (32 * GDC_WARPS)
#define GDC_LDC (GDC_C + 8)     /* fp32 (C, C) row stride: float2 fragment loads on distinct banks */
#define GDC_FULL 0xffffffffu
#define GDC_SORT_MAX GDC_THREADS /* packed batches of at most this many sequences run longest first */
/* decoding steps of at most this many rows a sequence run gated_delta_rule's fp32 kernel in chunks of their size: a
 * block of this kernel (one an SM) would spend a 64-row chunk's work and its whole state traffic on a few rows */
#define GDC_STATE_SHORT 16

/* shared memory of one block, in bytes from the start; bf16 row strides are 8 elements (16 bytes) past a multiple of
 * 128 bytes so that ldmatrix reads 8 rows on distinct banks */
template <int DK, int BV> struct gdc_layout {
    static constexpr int LDK = DK + 8, LDV = BV + 8;
    static constexpr size_t ks = 0;                                       /* bf16 K (2 buffers, C, LDK) */
    static constexpr size_t qs = ks + 2ull * GDC_C * LDK * 2;             /* bf16 Q (C, LDK) */
    static constexpr size_t vs = qs + 1ull * GDC_C * LDK * 2;             /* bf16 V (C, LDV) */
    static constexpr size_t sh = vs + 1ull * GDC_C * LDV * 2;             /* bf16 S0 hi, then lo (DK, LDV) */
    static constexpr size_t af = sh + 2ull * DK * LDV * 2;                /* fp32 A (C, LDC) */
    static constexpr size_t tf = af + 4ull * GDC_C * GDC_LDC;             /* fp32 T (C, LDC) */
    static constexpr size_t aq = tf + 4ull * GDC_C * GDC_LDC;             /* fp32 gated Q·Kᵀ (C, LDC) */
    static constexpr size_t rd = aq + 4ull * GDC_C * GDC_LDC;             /* bf16 R hi, lo, then δ hi, lo (C, LDV) */
    static constexpr size_t pd = rd + 2ull * GDC_C * LDV * 2;             /* bf16 δ' hi, lo; fp32 solve temp */
    static constexpr size_t vec = pd + 2ull * GDC_C * LDV * 2;            /* fp32 g, β (2 buffers), G, e^G, e^{GL−G}, β */
    static constexpr size_t bytes = vec + 4ull * 8 * GDC_C + 16;          /* + e^{G_{L-1}} */
    static_assert(2ull * GDC_C * LDV * 2 >= 4ull * 6 * 128, "solve temp fits the δ' buffer");
};

__device__ __forceinline__ void split_bf16x2(float a, float b, uint32_t &hi, uint32_t &lo)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    float2 hf = __bfloat1622float2(h);
    __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
    hi = *reinterpret_cast<uint32_t *>(&h);
    lo = *reinterpret_cast<uint32_t *>(&l);
}

/* A fragment (16x16) of a row-major bf16 matrix (rows m, k contiguous) */
__device__ __forceinline__ void gdc_lda(uint32_t *a, const bf16 *base, int ld, int m0, int k0)
{
    const int l = threadIdx.x & 31;
    ldmatrix_x4(a, base + (m0 + (l & 15)) * ld + k0 + (l >> 4) * 8);
}
/* A fragment (16x16) of a matrix stored transposed (rows k, m contiguous) */
__device__ __forceinline__ void gdc_lda_t(uint32_t *a, const bf16 *base, int ld, int m0, int k0)
{
    const int l = threadIdx.x & 31, j = l >> 3, i = l & 7;
    ldmatrix_x4_trans(a, base + (k0 + (j >> 1) * 8 + i) * ld + m0 + (j & 1) * 8);
}
/* B fragments of two n-tiles (n0..n0+15, k0..k0+15) of a matrix stored (n, k contiguous): b[0..1] tile 0, b[2..3] 1 */
__device__ __forceinline__ void gdc_ldb_nk(uint32_t *b, const bf16 *base, int ld, int n0, int k0)
{
    const int l = threadIdx.x & 31;
    ldmatrix_x4(b, base + (n0 + (l & 7) + ((l >> 4) << 3)) * ld + k0 + ((l >> 3) & 1) * 8);
}
/* the same of a matrix stored (k, n contiguous) */
__device__ __forceinline__ void gdc_ldb_kn(uint32_t *b, const bf16 *base, int ld, int n0, int k0)
{
    const int l = threadIdx.x & 31;
    ldmatrix_x4_trans(b, base + (k0 + (l & 7) + ((l >> 3) & 1) * 8) * ld + n0 + (l >> 4) * 8);
}
/* A fragment (16x16) of a row-major fp32 matrix, split into bf16 hi and lo */
template <bool LO>
__device__ __forceinline__ void gdc_lda_f32(uint32_t *hi, uint32_t *lo, const float *base, int ld, int m0, int k0)
{
    const int l = threadIdx.x & 31, g = l >> 2, q = l & 3;
    const float *p = base + (m0 + g) * ld + k0 + 2 * q;
    const float2 x[4] = {*reinterpret_cast<const float2 *>(p), *reinterpret_cast<const float2 *>(p + 8 * ld),
                         *reinterpret_cast<const float2 *>(p + 8), *reinterpret_cast<const float2 *>(p + 8 * ld + 8)};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (LO) split_bf16x2(x[i].x, x[i].y, hi[i], lo[i]);
        else hi[i] = pack_bf16(x[i].x, x[i].y);
    }
}

/* acc[2np], acc[2np+1] += a · (b[0..1], b[2..3]): one A row fragment against one 16-column slice of B (two n8 tiles),
 * the product every tensor-core loop of this kernel is made of */
template <int N>
__device__ __forceinline__ void gdc_mma_n16(float (&acc)[N][4], int np, const uint32_t (&a)[4], const uint32_t (&b)[4])
{
    mma_bf16(acc[2 * np], a, b[0], b[1]);
    mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
}

/* acc (NTO n8 tiles from column n0) += A (the 16 rows from m0 of the row-major fp32 matrix a, its 16-column k tiles
 * 0..kmax, split into bf16 hi and lo) · B (k, n contiguous, bf16 hi at bh and lo at bl): hi·hi, and with EXACT also
 * lo·hi and hi·lo (the products that keep fp32 accuracy) */
template <bool EXACT, int NTO>
__device__ __forceinline__ void gdc_mma_split(float (&acc)[NTO][4], const float *a, int lda, int m0, int kmax,
                                              const bf16 *bh, const bf16 *bl, int ldb, int n0)
{
    for (int kc = 0; kc <= kmax; kc++) {
        uint32_t ah[4], al[4], b[4];
        gdc_lda_f32<EXACT>(ah, al, a, lda, m0, kc * 16);
#pragma unroll
        for (int np = 0; np < NTO / 2; np++) {
            gdc_ldb_kn(b, bh, ldb, n0 + np * 16, kc * 16);
            gdc_mma_n16(acc, np, ah, b);
            if (EXACT) {
                gdc_mma_n16(acc, np, al, b);
                gdc_ldb_kn(b, bl, ldb, n0 + np * 16, kc * 16);
                gdc_mma_n16(acc, np, ah, b);
            }
        }
    }
}

/* B fragment (16x8) of a fp32 matrix stored (k, n contiguous), split into bf16 hi and lo */
template <bool LO>
__device__ __forceinline__ void gdc_ldb_f32(uint32_t *hi, uint32_t *lo, const float *base, int ld, int n0, int k0)
{
    const int l = threadIdx.x & 31, g = l >> 2, q = l & 3;
    const float *p = base + (k0 + 2 * q) * ld + n0 + g;
    const float b00 = p[0], b01 = p[ld], b10 = p[8 * ld], b11 = p[9 * ld];
    if (LO) {
        split_bf16x2(b00, b01, hi[0], lo[0]);
        split_bf16x2(b10, b11, hi[1], lo[1]);
    } else {
        hi[0] = pack_bf16(b00, b01), hi[1] = pack_bf16(b10, b11);
    }
}

/* rows [0, rows) and columns [0, cols) of src (row stride ld) into dst (C, COLS; row stride ldd), zeros elsewhere:
 * cp.async 16-byte pieces when AL (src, ld and cols multiples of 8 elements, 16-byte aligned), else plain loads */
template <int COLS, bool AL>
__device__ __forceinline__ void gdc_load_rows(bf16 *dst, int ldd, const bf16 *src, int ld, int rows, int cols)
{
    if (AL) {
        constexpr int P = COLS / 8;
        for (int i = threadIdx.x; i < GDC_C * P; i += GDC_THREADS) {
            const int r = i / P, c = (i % P) * 8;
            const bool ok = r < rows && c < cols;
            cp_async16(dst + r * ldd + c, ok ? src + (size_t)r * ld + c : src, ok);
        }
    } else {
        const uint16_t *s = reinterpret_cast<const uint16_t *>(src);
        uint16_t *d = reinterpret_cast<uint16_t *>(dst);
        for (int i = threadIdx.x; i < GDC_C * COLS; i += GDC_THREADS) {
            const int r = i / COLS, c = i % COLS;
            d[r * ldd + c] = r < rows && c < cols ? s[(size_t)r * ld + c] : (uint16_t)0;
        }
    }
}
/* C fp32 values, one per token (stride ld), zeros past rows */
__device__ __forceinline__ void gdc_load_vec(float *dst, const float *src, int ld, int rows)
{
    const int i = threadIdx.x;
    if (i < GDC_C) cp_async4(dst + i, i < rows ? src + (size_t)i * ld : src, i < rows);
}

template <int DK, int BV, bool AL, bool EXACT>
static __global__ void __launch_bounds__(GDC_THREADS, 1)
    gdc_kernel(bf16 *out, int ldo, const bf16 *q, int ldq, const bf16 *k, int ldk, const bf16 *v, int ldv,
               const float *g, int ldg, const float *beta, int ldb, const int32_t *cu_seqlens, int nseq, int hv,
               int rep, int dv, float *state, const int32_t *st_in, const int32_t *st_out)
{
    typedef gdc_layout<DK, BV> Lay;
    constexpr int C = GDC_C, LDK = Lay::LDK, LDV = Lay::LDV, LDC = GDC_LDC;
    constexpr int NW = GDC_WARPS;
    constexpr int UW = 4 * C / NW, NTU = UW / 8;            /* a warp's (16, UW) tile of the (C, C) products */
    constexpr int WCOL = NW / 4 < BV / 16 ? NW / 4 : BV / 16; /* warps across the (C, BV) products' columns */
    constexpr int CW = BV / WCOL, NTO = CW / 8;             /* a warp's (16, CW) tile of them */
    constexpr int SROW = NW < DK / 16 ? NW : DK / 16;       /* warps down the state's rows */
    constexpr int MTS = DK / 16 / SROW, SCOL = NW / SROW;   /* a warp's (16 MTS, BV / SCOL) slice of the state */
    constexpr int NTS = BV / SCOL / 8;
    static_assert(NW % 4 == 0 && NTU % 2 == 0 && NTO % 2 == 0 && NTS % 2 == 0 && SROW * SCOL == NW, "tile shapes");
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Ks = reinterpret_cast<bf16 *>(smem + Lay::ks), *Qs = reinterpret_cast<bf16 *>(smem + Lay::qs);
    bf16 *Vs = reinterpret_cast<bf16 *>(smem + Lay::vs);
    bf16 *Sh = reinterpret_cast<bf16 *>(smem + Lay::sh), *Sl = Sh + DK * LDV;
    float *Af = reinterpret_cast<float *>(smem + Lay::af), *Tf = reinterpret_cast<float *>(smem + Lay::tf);
    float *Aq = reinterpret_cast<float *>(smem + Lay::aq);
    bf16 *Rh = reinterpret_cast<bf16 *>(smem + Lay::rd), *Rl = Rh + C * LDV; /* R, then δ */
    bf16 *Ph = reinterpret_cast<bf16 *>(smem + Lay::pd), *Pl = Ph + C * LDV; /* δ' = e^{G_{L-1}−G} δ */
    float *Ptmp = reinterpret_cast<float *>(smem + Lay::pd);                 /* the solve's (6 warps, 16, 8) */
    float *gs = reinterpret_cast<float *>(smem + Lay::vec), *bs = gs + 2 * C;
    float *Gc = bs + 2 * C, *EG = Gc + C, *EL = EG + C, *Bc = EL + C, *eGLp = Bc + C;

    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, gq = lane >> 2, qq = lane & 3;
    /* blocks in launch order: the sequences longest first (every head and value tile of one, then the next), so
     * that the longest chains start in the first wave and the short ones fill the tail */
    const int nz = (dv + BV - 1) / BV, rank = (int)(blockIdx.x / (unsigned)(hv * nz));
    const int h = (int)(blockIdx.x % (unsigned)(hv * nz)) / nz, j0 = (int)(blockIdx.x % (unsigned)nz) * BV;
    __shared__ int s_sel;
    int s = rank;
    if (nseq <= GDC_SORT_MAX) {
        if (tid == 0) s_sel = rank;
        __syncthreads();
        if (tid < nseq) {
            const int len = cu_seqlens[tid + 1] - cu_seqlens[tid];
            int r = 0;
            for (int s2 = 0; s2 < nseq; s2++) {
                const int l2 = cu_seqlens[s2 + 1] - cu_seqlens[s2];
                r += l2 > len || (l2 == len && s2 < tid);
            }
            if (r == rank) s_sel = tid;
        }
        __syncthreads();
        s = s_sel;
    }
    const int kh = h / rep, nj = min(BV, dv - j0);
    const int t0 = cu_seqlens[s], t1 = cu_seqlens[s + 1];
    /* decoding: the state's (DK, nj) slice of this head starts from slot st_in[s] (-1: zeros) and ends in st_out[s] */
    const size_t hoff = (size_t)h * DK * dv + (size_t)j0, sstride = (size_t)hv * DK * dv;
    const float *s0 = state && st_in[s] >= 0 ? state + (size_t)st_in[s] * sstride + hoff : nullptr;
    float *s1 = state ? state + (size_t)st_out[s] * sstride + hoff : nullptr;
    if (t1 <= t0) {
        for (int i = tid; s1 && i < DK * nj; i += GDC_THREADS) {
            const int d = i / nj, j = i - d * nj;
            s1[(size_t)d * dv + j] = s0 ? s0[(size_t)d * dv + j] : 0.0f;
        }
        return;
    }
    const bf16 *qb = q + (size_t)kh * DK, *kb = k + (size_t)kh * DK, *vb = v + (size_t)h * dv + j0;
    bf16 *ob = out + (size_t)h * dv + j0;
    const float *gb = g + h, *bb = beta + h;
    const int nchunks = (t1 - t0 + C - 1) / C;
    const int mb = w & 3, m0 = mb * 16;         /* the warp's 16 rows of the (C, ·) products */
    const int u0 = (w >> 2) * UW;               /* its columns of the (C, C) products */
    const int n0o = (w >> 2) * CW;              /* its columns of the (C, BV) products */
    const bool has_o = (w >> 2) < WCOL;         /* (warps past WCOL columns take no (C, BV) tile) */
    const int d0 = (w % SROW) * 16 * MTS;       /* its rows of the state */
    const int sn0 = (w / SROW) * (BV / SCOL);   /* its columns of the state */
    const bool lower = u0 <= m0 + 15;           /* (C, C) tiles above the diagonal are never read */

    {
        uint16_t *z = reinterpret_cast<uint16_t *>(Sh);
        for (int i = tid; i < 2 * DK * LDV; i += GDC_THREADS) z[i] = 0;
        for (int i = tid; i < C * C; i += GDC_THREADS) { /* T above its diagonal blocks: never written */
            const int t = i / C, u = i % C;
            if ((u >> 4) > (t >> 4)) Tf[t * LDC + u] = 0.0f;
        }
        const int L0 = min(C, t1 - t0);
        gdc_load_rows<DK, AL>(Ks, LDK, kb + (size_t)t0 * ldk, ldk, L0, DK);
        gdc_load_vec(gs, gb + (size_t)t0 * ldg, ldg, L0);
        gdc_load_vec(bs, bb + (size_t)t0 * ldb, ldb, L0);
        gdc_load_rows<DK, AL>(Qs, LDK, qb + (size_t)t0 * ldq, ldq, L0, DK);
        gdc_load_rows<BV, AL>(Vs, LDV, vb + (size_t)t0 * ldv, ldv, L0, nj);
        cp_async_commit();
    }
    float sacc[MTS][NTS][4];
#pragma unroll
    for (int mt = 0; mt < MTS; mt++)
#pragma unroll
        for (int nt = 0; nt < NTS; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) sacc[mt][nt][e] = 0.0f;
    if (s0) { /* the carried state into the accumulators and its hi + lo copy (after the zeroing above) */
        __syncthreads();
#pragma unroll
        for (int mt = 0; mt < MTS; mt++)
#pragma unroll
            for (int nt = 0; nt < NTS; nt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int d = d0 + mt * 16 + gq + hf * 8, j = sn0 + nt * 8 + 2 * qq;
                    float *a = &sacc[mt][nt][2 * hf];
                    a[0] = j < nj ? s0[(size_t)d * dv + j] : 0.0f;
                    a[1] = j + 1 < nj ? s0[(size_t)d * dv + j + 1] : 0.0f;
                    uint32_t hi, lo;
                    split_bf16x2(a[0], a[1], hi, lo);
                    *reinterpret_cast<uint32_t *>(Sh + d * LDV + j) = hi;
                    *reinterpret_cast<uint32_t *>(Sl + d * LDV + j) = lo;
                }
    }

    for (int c = 0; c < nchunks; c++) {
        const int c0 = t0 + c * C, L = min(C, t1 - c0), buf = c & 1;
        const bf16 *Kc = Ks + buf * C * LDK;
        const float *gc = gs + buf * C, *bc = bs + buf * C;
        cp_async_wait<0>();
        __syncthreads(); /* this chunk's K, Q, V, g, β landed; the previous chunk's S0 copy written */
        if (c + 1 < nchunks) { /* the other K buffer and g, β were last read by the previous chunk */
            const int n0 = c0 + C, Ln = min(C, t1 - n0);
            gdc_load_rows<DK, AL>(Ks + (buf ^ 1) * C * LDK, LDK, kb + (size_t)n0 * ldk, ldk, Ln, DK);
            gdc_load_vec(gs + (buf ^ 1) * C, gb + (size_t)n0 * ldg, ldg, Ln);
            gdc_load_vec(bs + (buf ^ 1) * C, bb + (size_t)n0 * ldb, ldb, Ln);
            cp_async_commit();
        }
        /* ---- 1. the gates (warp 0), then the products of K, Q and S0 ---- */
        if (w == 0) { /* inclusive scan of g over the chunk, two tokens a lane; zero-filled g past L */
            const float a = gc[2 * lane], b = gc[2 * lane + 1], pair = a + b;
            float incl = pair;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float y = __shfl_up_sync(GDC_FULL, incl, o);
                if (lane >= o) incl += y;
            }
            const float G0 = incl - pair + a, G1 = incl;
            const float GL = __shfl_sync(GDC_FULL, ((L - 1) & 1) ? G1 : G0, (L - 1) >> 1);
            Gc[2 * lane] = G0, Gc[2 * lane + 1] = G1;
            EG[2 * lane] = expf(G0), EG[2 * lane + 1] = expf(G1);
            EL[2 * lane] = expf(GL - G0), EL[2 * lane + 1] = expf(GL - G1);
            Bc[2 * lane] = bc[2 * lane], Bc[2 * lane + 1] = bc[2 * lane + 1];
            if (lane == 0) *eGLp = expf(GL);
        }
        float kk[NTU][4], qk[NTU][4];
#pragma unroll
        for (int nt = 0; nt < NTU; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) kk[nt][e] = qk[nt][e] = 0.0f;
        if (lower) {
#pragma unroll 4
            for (int k0 = 0; k0 < DK; k0 += 16) {
                uint32_t ak[4], aqf[4], b[4];
                gdc_lda(ak, Kc, LDK, m0, k0);
                gdc_lda(aqf, Qs, LDK, m0, k0);
#pragma unroll
                for (int np = 0; np < NTU / 2; np++) {
                    gdc_ldb_nk(b, Kc, LDK, u0 + np * 16, k0);
                    gdc_mma_n16(kk, np, ak, b);
                    gdc_mma_n16(qk, np, aqf, b);
                }
            }
        }
        float ks[NTO][4], qs[NTO][4];
#pragma unroll
        for (int nt = 0; nt < NTO; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) ks[nt][e] = qs[nt][e] = 0.0f;
        if ((c > 0 || s0) && has_o) { /* S0 = 0 at a sequence start (no carried state) */
#pragma unroll 2
            for (int k0 = 0; k0 < DK; k0 += 16) {
                uint32_t ak[4], aqf[4], b[4];
                gdc_lda(ak, Kc, LDK, m0, k0);
                gdc_lda(aqf, Qs, LDK, m0, k0);
#pragma unroll
                for (int np = 0; np < NTO / 2; np++) {
                    gdc_ldb_kn(b, Sh, LDV, n0o + np * 16, k0);
                    gdc_mma_n16(ks, np, ak, b);
                    gdc_mma_n16(qs, np, aqf, b);
                    if (EXACT) {
                        gdc_ldb_kn(b, Sl, LDV, n0o + np * 16, k0);
                        gdc_mma_n16(ks, np, ak, b);
                        gdc_mma_n16(qs, np, aqf, b);
                    }
                }
            }
        }
        __syncthreads(); /* the gates visible; Q and S0's copy no longer read */
        if (c + 1 < nchunks) {
            const int n0 = c0 + C, Ln = min(C, t1 - n0);
            gdc_load_rows<DK, AL>(Qs, LDK, qb + (size_t)n0 * ldq, ldq, Ln, DK);
            cp_async_commit();
        }
        /* ---- 2. A and the gated Q·Kᵀ (fp32), R (bf16 hi, lo) ---- */
        if (lower) {
#pragma unroll
            for (int nt = 0; nt < NTU; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int t = m0 + gq + (e >> 1) * 8, u = u0 + nt * 8 + 2 * qq + (e & 1);
                    const float dec = u <= t ? __expf(Gc[t] - Gc[u]) : 0.0f; /* never exp of a positive number */
                    Af[t * LDC + u] = u < t ? Bc[t] * dec * kk[nt][e] : 0.0f;
                    Aq[t * LDC + u] = dec * qk[nt][e];
                }
        }
#pragma unroll
        for (int nt = 0; nt < NTO; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                if (!has_o) break;
                const int t = m0 + gq + hf * 8, j = n0o + nt * 8 + 2 * qq;
                const float2 vv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(Vs + t * LDV + j));
                const float r0 = Bc[t] * (vv.x - EG[t] * ks[nt][2 * hf]);
                const float r1 = Bc[t] * (vv.y - EG[t] * ks[nt][2 * hf + 1]);
                uint32_t hi, lo;
                split_bf16x2(r0, r1, hi, lo);
                *reinterpret_cast<uint32_t *>(Rh + t * LDV + j) = hi;
                *reinterpret_cast<uint32_t *>(Rl + t * LDV + j) = lo;
            }
        __syncthreads(); /* A, the gated Q·Kᵀ and R visible; V no longer read */
        if (c + 1 < nchunks) {
            const int n0 = c0 + C, Ln = min(C, t1 - n0);
            gdc_load_rows<BV, AL>(Vs, LDV, vb + (size_t)n0 * ldv, ldv, Ln, nj);
            cp_async_commit();
        }
        /* ---- 3. T = (I + A)^-1, fp32 ---- */
        if (w < 4) { /* diagonal block w: column j of its inverse by forward substitution, in registers */
            const int bo = w * 16, j = lane & 15;
            float x[16];
#pragma unroll
            for (int t = 0; t < 16; t++) {
                float acc = 0.0f;
#pragma unroll
                for (int u = 0; u < t; u++) acc += Af[(bo + t) * LDC + bo + u] * x[u];
                x[t] = t < j ? 0.0f : t == j ? 1.0f : -acc;
            }
            if (lane < 16)
#pragma unroll
                for (int t = 0; t < 16; t++) Tf[(bo + t) * LDC + bo + j] = x[t];
        }
        __syncthreads();
        for (int d = 1; d < 4; d++) { /* the blocks (i, i − d): T_ij = −T_ii Σ_{j<=k<i} A_ik T_kj */
            if (w < 2 * (4 - d)) { /* one warp per (block, 8 of its 16 columns), split products: ~fp32 */
                const int jb = w >> 1, ib = jb + d, n0 = 16 * jb + 8 * (w & 1);
                float p[4] = {0.0f, 0.0f, 0.0f, 0.0f}, y[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                uint32_t ah[4], al[4], bh[2], bl[2];
                for (int kb2 = jb; kb2 < ib; kb2++) {
                    gdc_lda_f32<true>(ah, al, Af, LDC, 16 * ib, 16 * kb2);
                    gdc_ldb_f32<true>(bh, bl, Tf, LDC, n0, 16 * kb2);
                    mma_bf16(p, ah, bh[0], bh[1]);
                    mma_bf16(p, al, bh[0], bh[1]);
                    mma_bf16(p, ah, bl[0], bl[1]);
                }
                float *pw = Ptmp + w * 128; /* the warp's (16, 8) of Σ A_ik T_kj */
                pw[gq * 8 + 2 * qq] = p[0], pw[gq * 8 + 2 * qq + 1] = p[1];
                pw[(gq + 8) * 8 + 2 * qq] = p[2], pw[(gq + 8) * 8 + 2 * qq + 1] = p[3];
                __syncwarp();
                gdc_lda_f32<true>(ah, al, Tf, LDC, 16 * ib, 16 * ib);
                gdc_ldb_f32<true>(bh, bl, pw, 8, 0, 0);
                mma_bf16(y, ah, bh[0], bh[1]);
                mma_bf16(y, al, bh[0], bh[1]);
                mma_bf16(y, ah, bl[0], bl[1]);
                float *tw = Tf + (16 * ib + gq) * LDC + n0 + 2 * qq;
                tw[0] = -y[0], tw[1] = -y[1], tw[8 * LDC] = -y[2], tw[8 * LDC + 1] = -y[3];
            }
            __syncthreads();
        }
        /* ---- 4. δ = T R ---- */
        float dl[NTO][4];
#pragma unroll
        for (int nt = 0; nt < NTO; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) dl[nt][e] = 0.0f;
        gdc_mma_split<EXACT, NTO>(dl, Tf, LDC, m0, has_o ? mb : -1, Rh, Rl, LDV, n0o); /* T is lower triangular */
        __syncthreads(); /* R no longer read: δ takes its place */
#pragma unroll
        for (int nt = 0; nt < NTO; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                if (!has_o) break;
                const int t = m0 + gq + hf * 8, j = n0o + nt * 8 + 2 * qq;
                uint32_t hi, lo;
                split_bf16x2(dl[nt][2 * hf], dl[nt][2 * hf + 1], hi, lo);
                *reinterpret_cast<uint32_t *>(Rh + t * LDV + j) = hi;
                *reinterpret_cast<uint32_t *>(Rl + t * LDV + j) = lo;
                split_bf16x2(EL[t] * dl[nt][2 * hf], EL[t] * dl[nt][2 * hf + 1], hi, lo);
                *reinterpret_cast<uint32_t *>(Ph + t * LDV + j) = hi;
                *reinterpret_cast<uint32_t *>(Pl + t * LDV + j) = lo;
            }
        __syncthreads(); /* δ and δ' visible */
        /* ---- 5. O = e^G Q S0 + (gated Q·Kᵀ) δ, to global ---- */
#pragma unroll
        for (int nt = 0; nt < NTO; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) qs[nt][e] *= EG[m0 + gq + (e >> 1) * 8];
        gdc_mma_split<EXACT, NTO>(qs, Aq, LDC, m0, has_o ? mb : -1, Rh, Rl, LDV, n0o);
#pragma unroll
        for (int nt = 0; nt < NTO; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int t = m0 + gq + hf * 8, j = n0o + nt * 8 + 2 * qq;
                if (t >= L || !has_o) continue;
                bf16 *o = ob + (size_t)(c0 + t) * ldo + j;
                if (AL) {
                    if (j < nj) *reinterpret_cast<__nv_bfloat162 *>(o) = __floats2bfloat162_rn(qs[nt][2 * hf], qs[nt][2 * hf + 1]);
                } else {
                    if (j < nj) o[0] = __float2bfloat16_rn(qs[nt][2 * hf]);
                    if (j + 1 < nj) o[1] = __float2bfloat16_rn(qs[nt][2 * hf + 1]);
                }
            }
        /* ---- 6. S = e^{G_{L-1}} S0 + Kᵀ δ' ---- */
        const float eGL = *eGLp;
#pragma unroll
        for (int mt = 0; mt < MTS; mt++)
#pragma unroll
            for (int nt = 0; nt < NTS; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) sacc[mt][nt][e] *= eGL;
        const int kcn = (L + 15) / 16; /* δ' rows past L are zero */
        for (int kc = 0; kc < kcn; kc++) {
            uint32_t a[MTS][4], b[4];
#pragma unroll
            for (int mt = 0; mt < MTS; mt++) gdc_lda_t(a[mt], Kc, LDK, d0 + mt * 16, kc * 16);
#pragma unroll
            for (int np = 0; np < NTS / 2; np++) {
                gdc_ldb_kn(b, Ph, LDV, sn0 + np * 16, kc * 16);
#pragma unroll
                for (int mt = 0; mt < MTS; mt++) {
                    mma_bf16(sacc[mt][2 * np], a[mt], b[0], b[1]);
                    mma_bf16(sacc[mt][2 * np + 1], a[mt], b[2], b[3]);
                }
                if (EXACT) {
                    gdc_ldb_kn(b, Pl, LDV, sn0 + np * 16, kc * 16);
#pragma unroll
                    for (int mt = 0; mt < MTS; mt++) {
                        mma_bf16(sacc[mt][2 * np], a[mt], b[0], b[1]);
                        mma_bf16(sacc[mt][2 * np + 1], a[mt], b[2], b[3]);
                    }
                }
            }
        }
        /* S0's copy for the next chunk (not read since the barrier after stage 1) */
#pragma unroll
        for (int mt = 0; mt < MTS; mt++)
#pragma unroll
            for (int nt = 0; nt < NTS; nt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int d = d0 + mt * 16 + gq + hf * 8, j = sn0 + nt * 8 + 2 * qq;
                    uint32_t hi, lo;
                    split_bf16x2(sacc[mt][nt][2 * hf], sacc[mt][nt][2 * hf + 1], hi, lo);
                    *reinterpret_cast<uint32_t *>(Sh + d * LDV + j) = hi;
                    *reinterpret_cast<uint32_t *>(Sl + d * LDV + j) = lo;
                }
    }
    if (s1) /* the state after the sequence's last row (each thread its own accumulators) */
#pragma unroll
        for (int mt = 0; mt < MTS; mt++)
#pragma unroll
            for (int nt = 0; nt < NTS; nt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int d = d0 + mt * 16 + gq + hf * 8, j = sn0 + nt * 8 + 2 * qq;
                    if (j < nj) s1[(size_t)d * dv + j] = sacc[mt][nt][2 * hf];
                    if (j + 1 < nj) s1[(size_t)d * dv + j + 1] = sacc[mt][nt][2 * hf + 1];
                }
}

template <int DK, int BV, bool AL, bool EXACT>
static void gdc_launch(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k, int ldk,
                       const uint16_t *v, int ldv, const float *g, int ldg, const float *beta, int ldb,
                       const int32_t *cu_seqlens, int nseq, int hk, int hv, int dv, float *state,
                       const int32_t *st_in, const int32_t *st_out, cudaStream_t st)
{
    const size_t smem = gdc_layout<DK, BV>::bytes;
    CHECK_CUDA(cudaFuncSetAttribute(gdc_kernel<DK, BV, AL, EXACT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem));
    const unsigned nblocks = (unsigned)nseq * (unsigned)hv * (unsigned)((dv + BV - 1) / BV);
    gdc_kernel<DK, BV, AL, EXACT><<<nblocks, GDC_THREADS, smem, st>>>(
        (bf16 *)out, ldo, (const bf16 *)q, ldq, (const bf16 *)k, ldk, (const bf16 *)v, ldv, g, ldg, beta, ldb,
        cu_seqlens, nseq, hv, hv / hk, dv, state, st_in, st_out);
    CHECK_CUDA_LAUNCH();
}

template <int DK, int BV>
static void gdc_dispatch(bool al, bool exact, uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k,
                         int ldk, const uint16_t *v, int ldv, const float *g, int ldg, const float *beta, int ldb,
                         const int32_t *cu, int nseq, int hk, int hv, int dv, float *S, const int32_t *si,
                         const int32_t *so, cudaStream_t st)
{
    if (al && exact) gdc_launch<DK, BV, true, true>(out, ldo, q, ldq, k, ldk, v, ldv, g, ldg, beta, ldb, cu, nseq, hk, hv, dv, S, si, so, st);
    else if (al) gdc_launch<DK, BV, true, false>(out, ldo, q, ldq, k, ldk, v, ldv, g, ldg, beta, ldb, cu, nseq, hk, hv, dv, S, si, so, st);
    else if (exact) gdc_launch<DK, BV, false, true>(out, ldo, q, ldq, k, ldk, v, ldv, g, ldg, beta, ldb, cu, nseq, hk, hv, dv, S, si, so, st);
    else gdc_launch<DK, BV, false, false>(out, ldo, q, ldq, k, ldk, v, ldv, g, ldg, beta, ldb, cu, nseq, hk, hv, dv, S, si, so, st);
}

/* the tensor-core launch of both entries (dk 128 or 256, mode checked) */
static void gdc_run(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k, int ldk, const uint16_t *v,
                    int ldv, const float *g, int ldg, const float *beta, int ldb, const int32_t *cu_seqlens, int nseq,
                    int hk, int hv, int dk, int dv, int mode, float *S, const int32_t *si, const int32_t *so,
                    void *stream)
{
    /* 16-byte cp.async pieces where every row start is 16-byte aligned and the value tile ends on a piece */
    const uintptr_t ptrs = (uintptr_t)out | (uintptr_t)q | (uintptr_t)k | (uintptr_t)v;
    const bool al = (ptrs & 15) == 0 && ldq % 8 == 0 && ldk % 8 == 0 && ldv % 8 == 0 && ldo % 8 == 0 && dv % 8 == 0;
    const bool exact = mode == GATED_DELTA_CHUNK_EXACT;
    cudaStream_t st = (cudaStream_t)stream;
    if (dk == 128)
        gdc_dispatch<128, 64>(al, exact, out, ldo, q, ldq, k, ldk, v, ldv, g, ldg, beta, ldb, cu_seqlens, nseq, hk, hv, dv, S, si, so, st);
    else
        gdc_dispatch<256, 32>(al, exact, out, ldo, q, ldq, k, ldk, v, ldv, g, ldg, beta, ldb, cu_seqlens, nseq, hk, hv, dv, S, si, so, st);
}

extern "C" void gated_delta_chunk_forward_mode_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq,
                                                    const uint16_t *k, int ldk, const uint16_t *v, int ldv,
                                                    const float *g, int ldg, const float *beta, int ldb,
                                                    const int32_t *cu_seqlens, int nseq, int hk, int hv, int dk,
                                                    int dv, int mode, void *stream)
{
    if (nseq <= 0 || hv <= 0 || dv <= 0) return;
    if (hk <= 0 || hv % hk || dk <= 0 || dk > 256 ||
        (mode != GATED_DELTA_CHUNK_EXACT && mode != GATED_DELTA_CHUNK_BF16)) {
        fprintf(stderr, "gated_delta_chunk_forward_cuda: hk %d / hv %d / dk %d / mode %d unsupported\n", hk, hv, dk,
                mode);
        exit(1);
    }
    if (dk != 128 && dk != 256) { /* head sizes without a tensor-core tiling: the fp32 chunked kernel */
        gated_delta_rule_forward_cuda(out, ldo, q, ldq, k, ldk, v, ldv, g, ldg, beta, ldb, cu_seqlens, nseq, hk, hv,
                                      dk, dv, stream);
        return;
    }
    gdc_run(out, ldo, q, ldq, k, ldk, v, ldv, g, ldg, beta, ldb, cu_seqlens, nseq, hk, hv, dk, dv, mode, NULL, NULL,
            NULL, stream);
}

extern "C" void gated_delta_chunk_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k,
                                               int ldk, const uint16_t *v, int ldv, const float *g, int ldg,
                                               const float *beta, int ldb, const int32_t *cu_seqlens, int nseq,
                                               int hk, int hv, int dk, int dv, void *stream)
{
    gated_delta_chunk_forward_mode_cuda(out, ldo, q, ldq, k, ldk, v, ldv, g, ldg, beta, ldb, cu_seqlens, nseq, hk,
                                        hv, dk, dv, GATED_DELTA_CHUNK_EXACT, stream);
}

extern "C" void gated_delta_chunk_forward_state_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq,
                                                     const uint16_t *k, int ldk, const uint16_t *v, int ldv,
                                                     const float *g, int ldg, const float *beta, int ldb,
                                                     const int32_t *cu_seqlens, int nseq, int max_seqlen, int hk,
                                                     int hv, int dk, int dv, float *state, const int32_t *state_in,
                                                     const int32_t *state_out, void *stream)
{
    if (nseq <= 0 || hv <= 0 || dv <= 0) return;
    if (hk <= 0 || hv % hk || dk <= 0 || dk > 256) {
        fprintf(stderr, "gated_delta_chunk_forward_state_cuda: hk %d / hv %d / dk %d unsupported\n", hk, hv, dk);
        exit(1);
    }
    if ((dk != 128 && dk != 256) || max_seqlen <= GDC_STATE_SHORT) { /* short steps, other heads: the fp32 kernel */
        gated_delta_rule_forward_state_cuda(out, ldo, q, ldq, k, ldk, v, ldv, g, ldg, beta, ldb, cu_seqlens, nseq,
                                            max_seqlen, hk, hv, dk, dv, state, state_in, state_out, stream);
        return;
    }
    gdc_run(out, ldo, q, ldq, k, ldk, v, ldv, g, ldg, beta, ldb, cu_seqlens, nseq, hk, hv, dk, dv,
            GATED_DELTA_CHUNK_EXACT, state, state_in, state_out, stream);
}
