// moe_gemm: CUDA, one kernel per GEMM over every group: a block takes one tile of the schedule (blockIdx.y: at most
// MOE_GEMM_BM rows of one group; blocks past the device's tile count leave at once) and one block of output columns
// (blockIdx.x, the fastest: the blocks of one tile, then of the next tile of the same expert, run together and share
// the expert's weights in L2). 8 warps (2 x 4), bf16 m16n8k16 mma.sync with fp32 accumulators, a multi-stage
// cp.async pipeline; shared rows 8 elements past a multiple of 32 bytes, so that the 8 rows of an ldmatrix fall on
// distinct banks. Tiles: 128 x 128 x 32, 4 stages, two blocks per SM (the default: on the H200, Qwen3.5-35B-A3B's
// layer, 264 TFLOP/s gate|up, 231 down, against 223 / 207 for 128 x 256 with one block per SM); 128 x 256 x 32
// selectable for comparison (moe_gemm_cuda_set_bn). The gate|up kernel gathers its A rows through row_token, and
// loads its B tile interleaved (tile column 2j: gate row j, 2j+1: up row j) so that each thread's accumulator pair is
// (gate, up) of one act column: SwiGLU is its epilogue and the (R, 2 I) intermediate never exists. The epilogues
// also add gpt-oss's expert biases and take its clamped SwiGLU (moe_gemm_opts).
#include <cuda_bf16.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "cuda_check.h"
#include "mma_sm80.cuh"
#include "moe_gemm.h"

using namespace mma_sm80;
typedef __nv_bfloat16 bf16;

#define MGM_BM MOE_GEMM_BM
#define MGM_THREADS 256
// shared memory of one block: STAGES x (BM + BN) rows of BK + 8 elements
#define MGM_SMEM(BN, BK, ST) ((size_t)(ST) * (MGM_BM + (BN)) * ((BK) + 8) * 2)

static int mgm_bn = 128; // moe_gemm_cuda_set_bn

struct mgm_params {
    bf16 *out;
    int ldo;
    const bf16 *a;
    int lda;
    const int32_t *row_token, *tiles, *ntiles;
    const bf16 *w, *ws;
    int E, H, Im, Is;
    const float *bias;   // moe_gemm_opts (routed groups only)
    float alpha, limit;
};

// BN 256: warp tiles 64 x 64, one block per SM; BN 128: 64 x 32, two blocks per SM. (BK, STAGES) = (32, 4): rows
// of 80 bytes.
template <bool GU, int MGM_BN, int MGM_BK, int MGM_STAGES>
static __global__ void __launch_bounds__(MGM_THREADS, MGM_BN == 128 ? 2 : 1) moe_gemm_kernel(mgm_params p)
{
    constexpr int MGM_WN = MGM_BN / 4, MGM_NI = MGM_WN / 8; // warp tile columns, n8 tiles per warp
    constexpr int MGM_LDS = MGM_BK + 8;
    const int tile = blockIdx.y;
    if (tile >= *p.ntiles) return;
    const int g = p.tiles[3 * tile], r0 = p.tiles[3 * tile + 1], r1 = p.tiles[3 * tile + 2];
    const bool sh = g == p.E;
    const int I = sh ? p.Is : p.Im;
    // GU: act columns [c0, c0 + BN/2), K = H; down: y columns [c0, c0 + BN), K = I
    const int c0 = blockIdx.x * (GU ? MGM_BN / 2 : MGM_BN);
    if (c0 >= (GU ? I : p.H)) return;
    const int K = GU ? p.H : I;
    const bf16 *W = sh ? p.ws : p.w + (size_t)g * (GU ? 2 * (size_t)p.Im * p.H : (size_t)p.H * p.Im);

    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *As = reinterpret_cast<bf16 *>(smem), *Bs = As + (size_t)MGM_STAGES * MGM_BM * MGM_LDS;

    // this thread's A rows lr + RP i (i < NA), B rows lr + RP i (i < NB), 16-byte chunk lc of each k-step
    constexpr int CPR = MGM_BK / 8, RP = MGM_THREADS / CPR, NA = MGM_BM / RP, NB = MGM_BN / RP;
    const int tid = threadIdx.x, lr = tid / CPR, lc = (tid % CPR) * 8;
    const bf16 *ap[NA], *bp[NB];
    bool av[NA], bv[NB];
#pragma unroll
    for (int i = 0; i < NA; i++) {
        const int r = r0 + lr + RP * i;
        av[i] = r < r1;
        ap[i] = p.a + (size_t)(av[i] ? (GU ? p.row_token[r] : r) : 0) * p.lda;
    }
#pragma unroll
    for (int i = 0; i < NB; i++) {
        const int c = lr + RP * i;
        int wrow;
        if (GU) {
            const int j = c0 + (c >> 1);
            bv[i] = j < I;
            wrow = (c & 1 ? I : 0) + j;
        } else {
            wrow = c0 + c;
            bv[i] = wrow < p.H;
        }
        bp[i] = W + (size_t)(bv[i] ? wrow : 0) * K;
    }
    const int nk = (K + MGM_BK - 1) / MGM_BK;
    auto load = [&](int stage, int kt) {
        const int k = kt * MGM_BK + lc;
        const bool kin = k < K; // K is a multiple of 8: a chunk is wholly in or out
        bf16 *as = As + (size_t)stage * MGM_BM * MGM_LDS, *bs = Bs + (size_t)stage * MGM_BN * MGM_LDS;
#pragma unroll
        for (int i = 0; i < NA; i++) cp_async16(as + (lr + RP * i) * MGM_LDS + lc, ap[i] + (kin ? k : 0), av[i] && kin);
#pragma unroll
        for (int i = 0; i < NB; i++) cp_async16(bs + (lr + RP * i) * MGM_LDS + lc, bp[i] + (kin ? k : 0), bv[i] && kin);
    };

    const int lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
    float acc[4][MGM_NI][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < MGM_NI; j++)
#pragma unroll
            for (int v = 0; v < 4; v++) acc[i][j][v] = 0.0f;

#pragma unroll
    for (int s = 0; s < MGM_STAGES - 1; s++) {
        if (s < nk) load(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<MGM_STAGES - 2>();
        __syncthreads(); // stage kt landed for every thread; stage kt-1 is free for everyone
        if (kt + MGM_STAGES - 1 < nk) load((kt + MGM_STAGES - 1) % MGM_STAGES, kt + MGM_STAGES - 1);
        cp_async_commit();
        const bf16 *as = As + (size_t)(kt % MGM_STAGES) * MGM_BM * MGM_LDS;
        const bf16 *bs = Bs + (size_t)(kt % MGM_STAGES) * MGM_BN * MGM_LDS;
#pragma unroll
        for (int kk = 0; kk < MGM_BK; kk += 16) {
            uint32_t af[4][4], bfr[MGM_NI][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
                ldmatrix_x4(af[mi], as + (wm * 64 + mi * 16 + (lane & 15)) * MGM_LDS + kk + (lane >> 4) * 8);
#pragma unroll
            for (int nj = 0; nj < MGM_NI / 2; nj++) {
                uint32_t r[4];
                ldmatrix_x4(r, bs + (wn * MGM_WN + nj * 16 + (lane & 7) + ((lane >> 4) << 3)) * MGM_LDS + kk +
                                   ((lane >> 3) & 1) * 8);
                bfr[2 * nj][0] = r[0], bfr[2 * nj][1] = r[1], bfr[2 * nj + 1][0] = r[2], bfr[2 * nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < MGM_NI; ni++) mma_bf16(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
        }
    }
    cp_async_wait<0>();

    // epilogue: accumulator (mi, ni, v): row wm*64 + mi*16 + lane/4 (+8 for v >= 2), tile column wn*WN + ni*8 +
    // 2*(lane%4) (+1 for odd v)
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = r0 + wm * 64 + mi * 16 + (lane >> 2) + 8 * h;
            if (r >= r1) continue;
            bf16 *o = p.out + (size_t)r * p.ldo;
#pragma unroll
            for (int ni = 0; ni < MGM_NI; ni++) {
                const int col = wn * MGM_WN + ni * 8 + 2 * (lane & 3);
                const float x0 = acc[mi][ni][2 * h], x1 = acc[mi][ni][2 * h + 1];
                if (GU) {
                    const int j = c0 + (col >> 1);
                    if (j >= I) continue;
                    float a = x0, b = x1;
                    if (p.bias && !sh) a += p.bias[(size_t)g * 2 * p.Im + j], b += p.bias[(size_t)g * 2 * p.Im + p.Im + j];
                    if (p.limit > 0.0f) {
                        a = fminf(a, p.limit), b = fmaxf(fminf(b, p.limit), -p.limit);
                        o[j] = __float2bfloat16_rn((b + 1.0f) * (a / (1.0f + __expf(-p.alpha * a))));
                    } else {
                        o[j] = __float2bfloat16_rn(a / (1.0f + __expf(-a)) * b);
                    }
                } else {
                    const int n = c0 + col;
                    if (n >= p.H) continue;
                    float a = x0, b = x1;
                    if (p.bias && !sh) a += p.bias[(size_t)g * p.H + n], b += p.bias[(size_t)g * p.H + n + 1];
                    *reinterpret_cast<__nv_bfloat162 *>(o + n) = __floats2bfloat162_rn(a, b);
                }
            }
        }
}

template <bool GU, int BN, int BK, int ST>
static void mgm_launch_cfg(const mgm_params &p, int max_tiles, int ncols, cudaStream_t st)
{
    static bool attr_set = false; // per instantiation; the attribute is per device and function (one device)
    if (!attr_set) {
        CHECK_CUDA(cudaFuncSetAttribute(moe_gemm_kernel<GU, BN, BK, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)MGM_SMEM(BN, BK, ST)));
        attr_set = true;
    }
    const int per = GU ? BN / 2 : BN;
    dim3 grid((unsigned)((ncols + per - 1) / per), (unsigned)max_tiles);
    moe_gemm_kernel<GU, BN, BK, ST><<<grid, MGM_THREADS, MGM_SMEM(BN, BK, ST), st>>>(p);
    CHECK_CUDA_LAUNCH();
}

template <bool GU> static void mgm_launch(const mgm_params &p, int max_tiles, int ncols, cudaStream_t st)
{
    if (mgm_bn == 256) mgm_launch_cfg<GU, 256, 32, 4>(p, max_tiles, ncols, st);
    else mgm_launch_cfg<GU, 128, 32, 4>(p, max_tiles, ncols, st);
}

extern "C" void moe_gemm_cuda_set_bn(int bn)
{
    if (bn != 128 && bn != 256) {
        fprintf(stderr, "moe_gemm_cuda_set_bn: %d: expected 128 (the default) or 256\n", bn);
        exit(1);
    }
    mgm_bn = bn;
}

static void mgm_check(const char *what, int ldo, int lda, int H, int Im, int Is, int max_tiles)
{
    if (H <= 0 || Im <= 0 || Is < 0 || H % 8 || Im % 8 || Is % 8 || ldo % 8 || lda % 8 || max_tiles > 65535) {
        fprintf(stderr, "%s: H %d, Im %d, Is %d, row strides %d / %d, %d tiles unsupported (multiples of 8, at most "
                "65535 tiles)\n", what, H, Im, Is, ldo, lda, max_tiles);
        exit(1);
    }
}

extern "C" void moe_gemm_gate_up_cuda(uint16_t *act, int ldact, const uint16_t *x, int ldx, const int32_t *row_token,
                                      const int32_t *tiles, const int32_t *ntiles, int max_tiles, int E, int H, int Im,
                                      int Is, const uint16_t *w_gu, const uint16_t *ws_gu, void *stream)
{
    moe_gemm_gate_up_opts_cuda(act, ldact, x, ldx, row_token, tiles, ntiles, max_tiles, E, H, Im, Is, w_gu, ws_gu,
                               NULL, stream);
}

extern "C" void moe_gemm_gate_up_opts_cuda(uint16_t *act, int ldact, const uint16_t *x, int ldx,
                                           const int32_t *row_token, const int32_t *tiles, const int32_t *ntiles,
                                           int max_tiles, int E, int H, int Im, int Is, const uint16_t *w_gu,
                                           const uint16_t *ws_gu, const moe_gemm_opts *o, void *stream)
{
    if (max_tiles <= 0) return;
    mgm_check("moe_gemm_gate_up_cuda", ldact, ldx, H, Im, Is, max_tiles);
    mgm_params p = {(bf16 *)act, ldact, (const bf16 *)x, ldx, row_token, tiles, ntiles, (const bf16 *)w_gu,
                    (const bf16 *)ws_gu, E, H, Im, Is, o ? o->bias : NULL, o ? o->alpha : 0.0f,
                    o ? o->limit : 0.0f};
    mgm_launch<true>(p, max_tiles, Im > Is ? Im : Is, (cudaStream_t)stream);
}

extern "C" void moe_gemm_down_cuda(uint16_t *y, int ldy, const uint16_t *act, int ldact, const int32_t *tiles,
                                   const int32_t *ntiles, int max_tiles, int E, int H, int Im, int Is,
                                   const uint16_t *w_down, const uint16_t *ws_down, void *stream)
{
    moe_gemm_down_opts_cuda(y, ldy, act, ldact, tiles, ntiles, max_tiles, E, H, Im, Is, w_down, ws_down, NULL, stream);
}

extern "C" void moe_gemm_down_opts_cuda(uint16_t *y, int ldy, const uint16_t *act, int ldact, const int32_t *tiles,
                                        const int32_t *ntiles, int max_tiles, int E, int H, int Im, int Is,
                                        const uint16_t *w_down, const uint16_t *ws_down, const moe_gemm_opts *o,
                                        void *stream)
{
    if (max_tiles <= 0) return;
    mgm_check("moe_gemm_down_cuda", ldy, ldact, H, Im, Is, max_tiles);
    mgm_params p = {(bf16 *)y, ldy, (const bf16 *)act, ldact, NULL, tiles, ntiles, (const bf16 *)w_down,
                    (const bf16 *)ws_down, E, H, Im, Is, o ? o->bias : NULL, 0.0f, 0.0f};
    mgm_launch<false>(p, max_tiles, H, (cudaStream_t)stream);
}
