// attention: causal flash attention forward over packed variable-length sequences, GQA, bf16 in/out.
// Tensor-core path (head_dim 16/32/64/128, and 256 with the smaller tiles of flash_shape below): a CTA of 4 warps
// takes 128 queries of one head of one sequence (each K/V tile brought from L2 serves 128 queries); each warp owns 32
// query rows (two m16 tiles), so every K and V fragment read from shared memory feeds both tiles (half the
// shared-memory traffic per MMA of one m16 tile per warp); Q fragments are re-read from shared memory per K/V tile
// (registers go to the 2x(HD/8)x4 fp32 accumulators). 255 registers at head_dim 128, two CTAs per SM. K/V tiles of
// 64 keys stream through shared memory (cp.async, two stages, rows padded by 16 bytes so ldmatrix is conflict-free).
// S = Q·Kᵀ and O += P·V are mma.sync.m16n8k16 bf16 with fp32 accumulators; the softmax is online (running max and sum
// in fp32, exp2 with the scale folded in; only the tiles that cross a warp's diagonal are masked; tiles wholly above a
// warp's rows are skipped); P is rounded to bf16 only as the A operand of P·V. The score matrix never leaves registers.
// Grid: x = query heads, y = sequences, z = query blocks in reverse (the longest causal rows start first).
// Scalar path (any head_dim, unaligned strides): one warp per (query, head), online softmax over keys.
// gpt-oss's options (attention_causal_opts_forward_cuda): a sliding window (query t sees keys t-window+1 .. t: key
// tiles wholly before a warp's windows are skipped, the tiles crossing a window's start masked; a row with no key yet
// keeps a running max of -inf, its tile's exponentials taken against 0) and a sink logit per head (fp32, device),
// added to the softmax's denominator at the end: o / (l + 2^(sink·log2e − m)), with m raised to the sink first.
#include <cuda_bf16.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "attention.h"
#include "cuda_check.h"
#include "env_switch.h"
#include "mma_sm80.cuh"

namespace {

constexpr int kWarps = 4;
// per head_dim: MT m16 tiles of query rows per warp (kBlockM = 4 warps x 16 x MT queries a CTA), BN keys a K/V tile.
// Up to 128: MT 2, BN 64. At 256 the O accumulators of two m-tiles would not fit in registers: MT 1, BN 32 (64
// queries a CTA; 2 x 100 KB of shared memory, two CTAs per SM).
template <int HD> struct flash_shape {
    static constexpr int MT = HD <= 128 ? 2 : 1, BN = HD <= 128 ? 64 : 32;
    static constexpr int kBlockM = kWarps * 16 * MT, kRowsPerWarp = 16 * MT;
};

using namespace mma_sm80;

// ldmatrix into four named registers (this file's fragments are held in scalars)
__device__ __forceinline__ void ldmatrix_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3, const void *p)
{
    uint32_t r[4];
    mma_sm80::ldmatrix_x4(r, p);
    r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
                                                  const void *p)
{
    uint32_t r[4];
    mma_sm80::ldmatrix_x4_trans(r, p);
    r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}

// Copy rows [row0, row0+ROWS) of a (len, HD) slice with row stride ld into a padded smem tile; rows >= len are 0.
template <int HD, int ROWS>
__device__ __forceinline__ void load_tile(__nv_bfloat16 *tile, const __nv_bfloat16 *base, int ld, int row0, int len)
{
    constexpr int kChunks = HD / 8, kStride = HD + 8;
#pragma unroll 1
    for (int c = threadIdx.x; c < ROWS * kChunks; c += kWarps * 32) {
        int r = c / kChunks, col = (c % kChunks) * 8;
        bool valid = row0 + r < len;
        const __nv_bfloat16 *src = base + (size_t)(valid ? row0 + r : 0) * ld + col;
        cp_async16(tile + r * kStride + col, src, valid);
    }
}

template <int HD>
__global__ void __launch_bounds__(kWarps * 32, 2)
    flash_fwd_kernel(__nv_bfloat16 *out, int ldo, const __nv_bfloat16 *q, int ldq, const __nv_bfloat16 *k, int ldk,
                     const __nv_bfloat16 *v, int ldv, const int32_t *cu_seqlens, int group, float scale_log2,
                     int window, const float *sinks)
{
    constexpr int MT = flash_shape<HD>::MT, kBlockN = flash_shape<HD>::BN;
    constexpr int kBlockM = flash_shape<HD>::kBlockM, kRowsPerWarp = flash_shape<HD>::kRowsPerWarp;
    constexpr int kStride = HD + 8;
    constexpr int kTile = kBlockN * kStride; // elements of one K or V tile
    constexpr int kNT = kBlockN / 8;         // 8-key n-tiles of S
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __nv_bfloat16 *sq = reinterpret_cast<__nv_bfloat16 *>(smem_raw);
    __nv_bfloat16 *sk = sq + kBlockM * kStride; // 2 stages
    __nv_bfloat16 *sv = sk + 2 * kTile; // 2 stages

    const int head = blockIdx.x, seq = blockIdx.y;
    const int start = cu_seqlens[seq], len = cu_seqlens[seq + 1] - start;
    const int nqb = (len + kBlockM - 1) / kBlockM;
    const int qb = (int)gridDim.z - 1 - (int)blockIdx.z;
    if (qb >= nqb) return;
    const int q0 = qb * kBlockM;
    const int kvh = head / group;
    const __nv_bfloat16 *qbase = q + (size_t)start * ldq + (size_t)head * HD;
    const __nv_bfloat16 *kbase = k + (size_t)start * ldk + (size_t)kvh * HD;
    const __nv_bfloat16 *vbase = v + (size_t)start * ldv + (size_t)kvh * HD;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, tig = lane & 3;
    const int wrow0 = q0 + warp * kRowsPerWarp; // first query row of this warp (local to the sequence)

    // keys needed: [0, min(len, q0 + kBlockM)), from the first window's start
    const int kv_end = min(len, q0 + kBlockM);
    const int nkb = (kv_end + kBlockN - 1) / kBlockN;
    const int jb = window > 0 ? max(0, q0 - window + 1) / kBlockN : 0;

    load_tile<HD, kBlockM>(sq, qbase, ldq, q0, len);
    load_tile<HD, kBlockN>(sk, kbase, ldk, jb * kBlockN, len);
    load_tile<HD, kBlockN>(sv, vbase, ldv, jb * kBlockN, len);
    cp_async_commit();

    float o[MT][HD / 8][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < HD / 8; i++) o[m][i][0] = o[m][i][1] = o[m][i][2] = o[m][i][3] = 0.0f;
    // row r of m-tile m: wrow0 + m*16 + g + 8*r; index m*2 + r. Key 0 is visible to every row (also to the rows past
    // len, whose results are never stored), and every warp takes tile 0, so the running max is finite after it.
    float m_run[2 * MT], l_run[2 * MT];
#pragma unroll
    for (int r = 0; r < 2 * MT; r++) m_run[r] = -INFINITY, l_run[r] = 0.0f;
    const __nv_bfloat16 *sq_w = sq + (warp * kRowsPerWarp + (lane & 15)) * kStride + (lane >> 4) * 8;

    for (int j = jb; j < nkb; j++) {
        const int stage = (j - jb) & 1;
        cp_async_stage_next(j + 1 < nkb, [&] {
            load_tile<HD, kBlockN>(sk + (stage ^ 1) * kTile, kbase, ldk, (j + 1) * kBlockN, len);
            load_tile<HD, kBlockN>(sv + (stage ^ 1) * kTile, vbase, ldv, (j + 1) * kBlockN, len);
        });
        __syncthreads();
        const __nv_bfloat16 *tk = sk + stage * kTile, *tv = sv + stage * kTile;
        const int k0 = j * kBlockN;
        // a tile wholly above this warp's rows (causal), or wholly before their windows, contributes nothing: skip
        // it (warp-uniform; the block-wide barriers below are still reached)
        if (k0 <= wrow0 + kRowsPerWarp - 1 && (window <= 0 || k0 + kBlockN - 1 >= wrow0 - window + 1)) {

        // S = Q Kᵀ : 32 rows (two m-tiles) x 64 keys per warp; each K fragment serves both m-tiles
        float s[MT][kNT][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int t = 0; t < kNT; t++) s[m][t][0] = s[m][t][1] = s[m][t][2] = s[m][t][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t qa[MT][4];
#pragma unroll
            for (int m = 0; m < MT; m++)
                ldmatrix_x4(qa[m][0], qa[m][1], qa[m][2], qa[m][3], sq_w + m * 16 * kStride + kk * 16);
#pragma unroll
            for (int t = 0; t < kNT; t += 2) {
                uint32_t b0, b1, b2, b3;
                const __nv_bfloat16 *p =
                    tk + (t * 8 + (lane & 7) + ((lane >> 4) << 3)) * kStride + kk * 16 + ((lane >> 3) & 1) * 8;
                ldmatrix_x4(b0, b1, b2, b3, p);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    mma_bf16(s[m][t], qa[m], b0, b1);
                    mma_bf16(s[m][t + 1], qa[m], b2, b3);
                }
            }
        }

        // causal mask (only where a key of the tile can pass a row of the warp; keys >= len are then past every
        // stored row too), online softmax in log2 units: p = 2^(s·scale_log2 − m), one FFMA and one EX2 per score
        const bool need_mask = k0 + kBlockN - 1 > wrow0 ||
                               (window > 0 && k0 < wrow0 + kRowsPerWarp - 1 - window + 1);
        float mx[2 * MT];
#pragma unroll
        for (int r = 0; r < 2 * MT; r++) mx[r] = -INFINITY;
#pragma unroll
        for (int m = 0; m < MT; m++) {
#pragma unroll
            for (int t = 0; t < kNT; t++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    if (need_mask) {
                        int key = k0 + t * 8 + tig * 2 + (e & 1);
                        int row = wrow0 + m * 16 + g + (e >> 1) * 8;
                        if (key > row || (window > 0 && key <= row - window)) s[m][t][e] = -INFINITY;
                    }
                    mx[m * 2 + (e >> 1)] = fmaxf(mx[m * 2 + (e >> 1)], s[m][t][e]);
                }
            }
        }
        float corr[2 * MT], neg_m[2 * MT];
#pragma unroll
        for (int r = 0; r < 2 * MT; r++) // m_run finite without a window (see above); a windowed row with no key yet: 0
            online_max(mx[r], m_run[r], scale_log2, corr[r], neg_m[r]);
        uint32_t pf[MT][kBlockN / 16][4];
#pragma unroll
        for (int m = 0; m < MT; m++) {
            float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
            for (int t = 0; t < kNT; t++) {
                float p0 = fast_exp2(fmaf(s[m][t][0], scale_log2, neg_m[m * 2]));
                float p1 = fast_exp2(fmaf(s[m][t][1], scale_log2, neg_m[m * 2]));
                float p2 = fast_exp2(fmaf(s[m][t][2], scale_log2, neg_m[m * 2 + 1]));
                float p3 = fast_exp2(fmaf(s[m][t][3], scale_log2, neg_m[m * 2 + 1]));
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

        // O += P V : P (32 x 64 keys) as A fragments, V (64 keys x HD) through ldmatrix.trans, each V fragment
        // serving both m-tiles
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; kk++) {
#pragma unroll
            for (int n0 = 0; n0 < HD / 8; n0 += 2) {
                uint32_t b0, b1, b2, b3;
                const __nv_bfloat16 *p =
                    tv + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride + n0 * 8 + (lane >> 4) * 8;
                ldmatrix_x4_trans(b0, b1, b2, b3, p);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    mma_bf16(o[m][n0], pf[m][kk], b0, b1);
                    mma_bf16(o[m][n0 + 1], pf[m][kk], b2, b3);
                }
            }
        }
        } // tile not above the warp's rows
        __syncthreads(); // the next iteration's prefetch overwrites this stage
    }

    // the row sums are partial per thread: reduce over the 4 threads of a row
#pragma unroll
    for (int r = 0; r < 2 * MT; r++) {
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    }
    if (sinks) { // the sink's weight joins the denominator: rescale o and l to max(m, sink)
        const float sl = sinks[head] * 1.4426950408889634f;
#pragma unroll
        for (int r = 0; r < 2 * MT; r++) {
            const float m_new = fmaxf(m_run[r], sl), c = fast_exp2(m_run[r] - m_new);
            l_run[r] = l_run[r] * c + fast_exp2(sl - m_new);
#pragma unroll
            for (int i = 0; i < HD / 8; i++) o[r / 2][i][(r & 1) * 2] *= c, o[r / 2][i][(r & 1) * 2 + 1] *= c;
        }
    }
    __nv_bfloat16 *obase = out + (size_t)start * ldo + (size_t)head * HD;
#pragma unroll
    for (int m = 0; m < MT; m++) {
        const int row_a = wrow0 + m * 16 + g, row_b = row_a + 8;
        const float inv_a = 1.0f / l_run[m * 2], inv_b = 1.0f / l_run[m * 2 + 1];
#pragma unroll
        for (int i = 0; i < HD / 8; i++) {
            int col = i * 8 + tig * 2;
            if (row_a < len)
                *reinterpret_cast<uint32_t *>(obase + (size_t)row_a * ldo + col) =
                    pack_bf16(o[m][i][0] * inv_a, o[m][i][1] * inv_a);
            if (row_b < len)
                *reinterpret_cast<uint32_t *>(obase + (size_t)row_b * ldo + col) =
                    pack_bf16(o[m][i][2] * inv_b, o[m][i][3] * inv_b);
        }
    }
}

// Scalar fallback: one warp per (token, head); each lane scores one key of a 32-key chunk, online softmax.
__global__ void attention_scalar_kernel(__nv_bfloat16 *out, int ldo, const __nv_bfloat16 *q, int ldq,
                                        const __nv_bfloat16 *k, int ldk, const __nv_bfloat16 *v, int ldv,
                                        const int32_t *cu_seqlens, int nseq, int T, int nh, int group, int hd,
                                        float scale, int window, const float *sinks)
{
    extern __shared__ float sh[]; // per warp: hd floats of q, hd floats of the accumulator
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wpb = blockDim.x / 32;
    long long item = (long long)blockIdx.x * wpb + warp;
    if (item >= (long long)T * nh) return;
    int t = (int)(item / nh), h = (int)(item % nh);
    int lo = 0, hi = nseq; // sequence of token t: cu_seqlens[s] <= t < cu_seqlens[s+1]
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (cu_seqlens[mid] <= t) lo = mid; else hi = mid;
    }
    const int start = window > 0 ? max(cu_seqlens[lo], t - window + 1) : cu_seqlens[lo];
    float *qs = sh + (size_t)warp * 2 * hd, *acc = qs + hd;
    for (int d = lane; d < hd; d += 32) qs[d] = __bfloat162float(q[(size_t)t * ldq + (size_t)h * hd + d]);
    __syncwarp();
    const int kvh = h / group;
    float m = -INFINITY, l = 0.0f;
    // each lane scores one key of a 32-key chunk; the V sum runs over the chunk with p broadcast by shuffles
    for (int d = lane; d < hd; d += 32) acc[d] = 0.0f;
    __syncwarp();
    for (int base = start; base <= t; base += 32) {
        int key = base + lane;
        float sc = -INFINITY;
        if (key <= t) {
            float dot = 0.0f;
            const __nv_bfloat16 *kr = k + (size_t)key * ldk + (size_t)kvh * hd;
            for (int d = 0; d < hd; d++) dot += qs[d] * __bfloat162float(kr[d]);
            sc = dot * scale;
        }
        float bm = sc;
        for (int o = 16; o > 0; o >>= 1) bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, o));
        float m_new = fmaxf(m, bm);
        float corr = expf(m - m_new);
        float p = key <= t ? expf(sc - m_new) : 0.0f;
        float ps = p;
        for (int o = 16; o > 0; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
        l = l * corr + ps;
        m = m_new;
        const int nk = min(32, t - base + 1); // warp-uniform
        for (int d = lane; d < hd; d += 32) acc[d] *= corr;
        for (int j = 0; j < nk; j++) {
            float pj = __shfl_sync(0xffffffffu, p, j);
            const __nv_bfloat16 *vr = v + (size_t)(base + j) * ldv + (size_t)kvh * hd;
            for (int d = lane; d < hd; d += 32) acc[d] += pj * __bfloat162float(vr[d]);
        }
        __syncwarp();
    }
    if (sinks) {
        const float m_new = fmaxf(m, sinks[h]), c = expf(m - m_new);
        l = l * c + expf(sinks[h] - m_new);
        for (int d = lane; d < hd; d += 32) acc[d] *= c;
    }
    for (int d = lane; d < hd; d += 32)
        out[(size_t)t * ldo + (size_t)h * hd + d] = __float2bfloat16_rn(acc[d] / l);
}

template <int HD>
void launch_flash(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k, int ldk, const uint16_t *v,
                  int ldv, const int32_t *cu_seqlens, int nseq, int max_seqlen, int nh, int group, float scale,
                  int window, const float *sinks, cudaStream_t st)
{
    constexpr int kBlockM = flash_shape<HD>::kBlockM, kBlockN = flash_shape<HD>::BN;
    const size_t smem = (size_t)(kBlockM + 4 * kBlockN) * (HD + 8) * sizeof(__nv_bfloat16);
    static bool attr_set = false; // per template instance; set once per process (device 0 semantics)
    if (!attr_set) {
        CHECK_CUDA(cudaFuncSetAttribute(flash_fwd_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr_set = true;
    }
    dim3 grid((unsigned)nh, (unsigned)nseq, (unsigned)((max_seqlen + kBlockM - 1) / kBlockM));
    flash_fwd_kernel<HD><<<grid, kWarps * 32, smem, st>>>(
        (__nv_bfloat16 *)out, ldo, (const __nv_bfloat16 *)q, ldq, (const __nv_bfloat16 *)k, ldk,
        (const __nv_bfloat16 *)v, ldv, cu_seqlens, group, scale * 1.4426950408889634f, window, sinks);
    CHECK_CUDA_LAUNCH();
}

} // namespace

// DFLASH_ATTENTION=mma_sync: the automatic choice takes the mma.sync kernel everywhere (read once)
static bool mma_sync_forced(void)
{
    static int forced = -1;
    return env_switch(&forced, "DFLASH_ATTENTION", "mma_sync");
}

extern "C" int attention_wgmma_chosen(int hd) { return !mma_sync_forced() && attention_wgmma_supported(hd); }

static void causal_forward(enum attention_cuda_kernel kernel, uint16_t *out, int ldo, const uint16_t *q, int ldq,
                           const uint16_t *k, int ldk, const uint16_t *v, int ldv, const int32_t *cu_seqlens, int nseq,
                           int max_seqlen, int nh, int nkv, int hd, float scale, int window, const float *sinks,
                           const attention_qfold *fold, void *stream);

// Whether the rows are 16-byte aligned (the tensor-core kernels' loads)
static bool rows_aligned(const uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k, int ldk,
                         const uint16_t *v, int ldv)
{
    return ldo % 8 == 0 && ldq % 8 == 0 && ldk % 8 == 0 && ldv % 8 == 0 && (uintptr_t)out % 16 == 0 &&
           (uintptr_t)q % 16 == 0 && (uintptr_t)k % 16 == 0 && (uintptr_t)v % 16 == 0;
}

// The one place the automatic choice is made: wgmma on Hopper where it has the head_dim, the rows are aligned and no
// window or sinks (gpt-oss's options, which the wgmma kernel lacks) are asked for, else mma.sync (or scalar)
static enum attention_cuda_kernel auto_kernel(bool aligned, int hd, int window, const float *sinks)
{
    const bool plain = window <= 0 && sinks == NULL;
    return aligned && plain && attention_wgmma_chosen(hd) ? ATTENTION_CUDA_WGMMA : ATTENTION_CUDA_MMA_SYNC;
}

extern "C" int attention_qfold_applies(const uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k,
                                       int ldk, const uint16_t *v, int ldv, int hd, int window, const float *sinks)
{
    // DFLASH_ATTENTION_QFOLD=1 (or =begin, the fold without the passes ahead: attention_sm90.cu): the fold, opt-in
    // (correct on the H200 but slower there: attention.h)
    static int on = -1, begin = -1;
    return (env_switch(&on, "DFLASH_ATTENTION_QFOLD", "1") || env_switch(&begin, "DFLASH_ATTENTION_QFOLD", "begin")) &&
           auto_kernel(rows_aligned(out, ldo, q, ldq, k, ldk, v, ldv), hd, window, sinks) == ATTENTION_CUDA_WGMMA;
}

extern "C" void attention_causal_qfold_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq,
                                                    const uint16_t *k, int ldk, const uint16_t *v, int ldv,
                                                    const int32_t *cu_seqlens, int nseq, int max_seqlen, int nh,
                                                    int nkv, int hd, float scale, int window, const float *sinks,
                                                    const attention_qfold *fold, void *stream)
{
    causal_forward(ATTENTION_CUDA_AUTO, out, ldo, q, ldq, k, ldk, v, ldv, cu_seqlens, nseq, max_seqlen, nh, nkv, hd,
                   scale, window, sinks, fold, stream);
}

extern "C" void attention_causal_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k,
                                              int ldk, const uint16_t *v, int ldv, const int32_t *cu_seqlens,
                                              int nseq, int max_seqlen, int nh, int nkv, int hd, float scale,
                                              void *stream)
{
    causal_forward(ATTENTION_CUDA_AUTO, out, ldo, q, ldq, k, ldk, v, ldv, cu_seqlens, nseq, max_seqlen, nh, nkv, hd,
                   scale, 0, NULL, NULL, stream);
}

extern "C" void attention_causal_opts_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq,
                                                   const uint16_t *k, int ldk, const uint16_t *v, int ldv,
                                                   const int32_t *cu_seqlens, int nseq, int max_seqlen, int nh,
                                                   int nkv, int hd, float scale, int window, const float *sinks,
                                                   void *stream)
{
    causal_forward(ATTENTION_CUDA_AUTO, out, ldo, q, ldq, k, ldk, v, ldv, cu_seqlens, nseq, max_seqlen, nh, nkv, hd,
                   scale, window, sinks, NULL, stream);
}

extern "C" void attention_causal_forward_cuda_with(enum attention_cuda_kernel kernel, uint16_t *out, int ldo,
                                                   const uint16_t *q, int ldq, const uint16_t *k, int ldk,
                                                   const uint16_t *v, int ldv, const int32_t *cu_seqlens, int nseq,
                                                   int max_seqlen, int nh, int nkv, int hd, float scale, void *stream)
{
    causal_forward(kernel, out, ldo, q, ldq, k, ldk, v, ldv, cu_seqlens, nseq, max_seqlen, nh, nkv, hd, scale, 0, NULL,
                   NULL, stream);
}

// The one body: the kernel chosen (AUTO: auto_kernel), then launched; fold (attention_qfold) only where
// attention_qfold_applies said so.
static void causal_forward(enum attention_cuda_kernel kernel, uint16_t *out, int ldo, const uint16_t *q, int ldq,
                           const uint16_t *k, int ldk, const uint16_t *v, int ldv, const int32_t *cu_seqlens, int nseq,
                           int max_seqlen, int nh, int nkv, int hd, float scale, int window, const float *sinks,
                           const attention_qfold *fold, void *stream)
{
    if (nseq <= 0 || max_seqlen <= 0 || nh <= 0) return;
    if (nkv <= 0 || nh % nkv != 0) {
        fprintf(stderr, "attention_causal_forward_cuda: %d query heads not a multiple of %d kv heads\n", nh, nkv);
        exit(1);
    }
    cudaStream_t st = (cudaStream_t)stream;
    const int group = nh / nkv;
    const bool aligned = rows_aligned(out, ldo, q, ldq, k, ldk, v, ldv);
    const bool plain = window <= 0 && sinks == NULL;
    if (fold && !attention_qfold_applies(out, ldo, q, ldq, k, ldk, v, ldv, hd, window, sinks)) {
        fprintf(stderr, "attention_causal_qfold_forward_cuda: the Q fold asked for where attention_qfold_applies says "
                        "no (head_dim %d, aligned %d, window %d, sinks %s): the caller's qk_norm_rope must do q\n",
                hd, (int)aligned, window, sinks ? "yes" : "no");
        exit(1);
    }
    if (kernel == ATTENTION_CUDA_AUTO) kernel = auto_kernel(aligned, hd, window, sinks);
    if (kernel == ATTENTION_CUDA_WGMMA) {
        if (!aligned || !plain || !attention_wgmma_supported(hd)) {
            fprintf(stderr, "attention_causal_forward_cuda_with: the wgmma kernel takes head_dim 64 or 128 with 16-byte "
                            "aligned rows on an sm_90 device, no window or sinks (head_dim %d, aligned %d, window %d, "
                            "sinks %s)\n", hd, (int)aligned, window, sinks ? "yes" : "no");
            exit(1);
        }
        attention_wgmma_qfold_forward_cuda(out, ldo, q, ldq, k, ldk, v, ldv, cu_seqlens, nseq, max_seqlen, nh, nkv,
                                           hd, scale, 1, fold, stream);
        return;
    }
    if (aligned) {
        switch (hd) {
        case 16: launch_flash<16>(out, ldo, q, ldq, k, ldk, v, ldv, cu_seqlens, nseq, max_seqlen, nh, group, scale, window, sinks, st); return;
        case 32: launch_flash<32>(out, ldo, q, ldq, k, ldk, v, ldv, cu_seqlens, nseq, max_seqlen, nh, group, scale, window, sinks, st); return;
        case 64: launch_flash<64>(out, ldo, q, ldq, k, ldk, v, ldv, cu_seqlens, nseq, max_seqlen, nh, group, scale, window, sinks, st); return;
        case 128: launch_flash<128>(out, ldo, q, ldq, k, ldk, v, ldv, cu_seqlens, nseq, max_seqlen, nh, group, scale, window, sinks, st); return;
        case 256: launch_flash<256>(out, ldo, q, ldq, k, ldk, v, ldv, cu_seqlens, nseq, max_seqlen, nh, group, scale, window, sinks, st); return;
        default: break;
        }
    }
    // the scalar path needs T: the caller's cu_seqlens is on the device, so read its last entry
    int32_t T = 0;
    CHECK_CUDA(cudaMemcpyAsync(&T, cu_seqlens + nseq, sizeof T, cudaMemcpyDeviceToHost, st));
    CHECK_CUDA(cudaStreamSynchronize(st));
    const int wpb = 4;
    long long items = (long long)T * nh;
    unsigned grid = (unsigned)((items + wpb - 1) / wpb);
    attention_scalar_kernel<<<grid, wpb * 32, (size_t)wpb * 2 * hd * sizeof(float), st>>>(
        (__nv_bfloat16 *)out, ldo, (const __nv_bfloat16 *)q, ldq, (const __nv_bfloat16 *)k, ldk,
        (const __nv_bfloat16 *)v, ldv, cu_seqlens, nseq, T, nh, group, hd, scale, window, sinks);
    CHECK_CUDA_LAUNCH();
}
