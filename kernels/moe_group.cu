// moe_group: CUDA, three kernels and no host synchronisation. The T*K picks are cut into chunks of MG_CHUNK; one
// warp per chunk walks it 32 picks at a time in pick order (count: a per-chunk histogram; place: each pick's rank
// among the equal ids of its round by __match_any_sync, after the ranks of every earlier round), so the order
// within an expert is the pick order whatever the scheduling. Between the two, one block turns the per-chunk
// histograms into each chunk's base per expert, the group offsets and the tile schedule.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "cuda_check.h"
#include "moe_group.h"

#define MG_CHUNK 1024
#define MG_SCAN_THREADS 1024

static __device__ __forceinline__ int mg_expert(const int32_t *sel, int i, int E)
{
    const int e = sel[i];
    return e >= 0 && e < E ? e : 0;
}

static __global__ void moe_group_count_kernel(const int32_t *sel, int TK, int E, int32_t *counts)
{
    __shared__ int32_t hist[MG_SCAN_THREADS];
    const int lane = threadIdx.x, b = blockIdx.x;
    for (int e = lane; e < E; e += 32) hist[e] = 0;
    __syncwarp();
    const int end = min(TK, (b + 1) * MG_CHUNK);
    for (int i0 = b * MG_CHUNK; i0 < end; i0 += 32) {
        const int i = i0 + lane;
        const int e = i < end ? mg_expert(sel, i, E) : -1 - lane; // a distinct id per idle lane
        const unsigned same = __match_any_sync(0xffffffffu, e);
        if (e >= 0 && lane == __ffs(same) - 1) hist[e] += __popc(same);
        __syncwarp();
    }
    for (int e = lane; e < E; e += 32) counts[(size_t)b * E + e] = hist[e];
}

// exclusive prefix sum of s[0, n) in place (n <= blockDim.x); returns the total. Every thread calls it.
static __device__ int mg_block_scan(int32_t *s, int n)
{
    const int t = threadIdx.x;
    int v = t < n ? s[t] : 0;
    const int own = v;
    for (int o = 1; o < n; o <<= 1) {
        __syncthreads();
        const int a = t >= o && t < n ? s[t - o] : 0;
        __syncthreads();
        if (t < n) s[t] = v += a;
    }
    __syncthreads();
    const int total = s[n - 1];
    __syncthreads();
    if (t < n) s[t] = v - own;
    __syncthreads();
    return total;
}

static __global__ void moe_group_scan_kernel(int32_t *counts, int nb, int TK, int E, int shared_rows, int bm,
                                             int32_t *off, int32_t *row_token, int32_t *tiles, int32_t *ntiles)
{
    __shared__ int32_t n[MG_SCAN_THREADS], tc[MG_SCAN_THREADS];
    const int t = threadIdx.x, G = E + (shared_rows > 0);
    if (t < E) { // each chunk's base within expert t (counts becomes the bases), 8 loads in flight
        int run = 0;
        for (int b0 = 0; b0 < nb; b0 += 8) {
            int c[8];
#pragma unroll
            for (int i = 0; i < 8; i++) c[i] = b0 + i < nb ? counts[(size_t)(b0 + i) * E + t] : 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                if (b0 + i < nb) counts[(size_t)(b0 + i) * E + t] = run;
                run += c[i];
            }
        }
        n[t] = run;
    } else if (t == E) {
        n[t] = shared_rows;
    }
    if (t < G) tc[t] = (n[t] + bm - 1) / bm;
    __syncthreads();
    const int cnt = t < G ? n[t] : 0;
    const int rows = mg_block_scan(n, G);
    const int total = mg_block_scan(tc, G);
    if (t < G) off[t] = n[t];
    if (t == 0) {
        off[G] = rows;
        if (G == E) off[E + 1] = rows;
        *ntiles = total;
    }
    for (int j = 0, r = t < G ? n[t] : 0; t < G && j * bm < cnt; j++) {
        int32_t *p = tiles + 3 * (size_t)(tc[t] + j);
        p[0] = t, p[1] = r + j * bm, p[2] = min(r + cnt, r + (j + 1) * bm);
    }
    for (int i = t; i < shared_rows; i += blockDim.x) row_token[TK + i] = i;
}

static __global__ void moe_group_place_kernel(const int32_t *sel, int TK, int K, int E, const int32_t *base,
                                              const int32_t *off, int32_t *row_token, int32_t *slot_row)
{
    __shared__ int32_t cur[MG_SCAN_THREADS];
    const int lane = threadIdx.x, b = blockIdx.x;
    for (int e = lane; e < E; e += 32) cur[e] = off[e] + base[(size_t)b * E + e];
    __syncwarp();
    const int end = min(TK, (b + 1) * MG_CHUNK);
    for (int i0 = b * MG_CHUNK; i0 < end; i0 += 32) {
        const int i = i0 + lane;
        const int e = i < end ? mg_expert(sel, i, E) : -1 - lane;
        const unsigned same = __match_any_sync(0xffffffffu, e);
        if (e >= 0) {
            const int r = cur[e] + __popc(same & ((1u << lane) - 1u));
            row_token[r] = i / K;
            slot_row[i] = r;
        }
        __syncwarp();
        if (e >= 0 && lane == __ffs(same) - 1) cur[e] += __popc(same);
        __syncwarp();
    }
}

extern "C" size_t moe_group_cuda_workspace(int TK, int E)
{
    const size_t nb = (size_t)(TK + MG_CHUNK - 1) / MG_CHUNK;
    return sizeof(int32_t) * (nb > 0 ? nb : 1) * (size_t)E;
}

extern "C" void moe_group_cuda(const int32_t *sel, int T, int K, int E, int shared_rows, int bm, int32_t *off,
                               int32_t *row_token, int32_t *slot_row, int32_t *tiles, int32_t *ntiles, void *work,
                               void *stream)
{
    if (E <= 0 || E >= MG_SCAN_THREADS || K <= 0 || bm <= 0 || T < 0 || (shared_rows != 0 && shared_rows != T)) {
        fprintf(stderr, "moe_group_cuda: %d experts, top %d, %d shared rows for %d tokens, tiles of %d unsupported\n",
                E, K, shared_rows, T, bm);
        exit(1);
    }
    cudaStream_t st = (cudaStream_t)stream;
    const int TK = T * K, nb = (TK + MG_CHUNK - 1) / MG_CHUNK;
    int32_t *counts = (int32_t *)work;
    if (nb > 0) {
        moe_group_count_kernel<<<nb, 32, 0, st>>>(sel, TK, E, counts);
        CHECK_CUDA_LAUNCH();
    }
    moe_group_scan_kernel<<<1, MG_SCAN_THREADS, 0, st>>>(counts, nb, TK, E, shared_rows, bm, off, row_token, tiles,
                                                         ntiles);
    CHECK_CUDA_LAUNCH();
    if (nb > 0) {
        moe_group_place_kernel<<<nb, 32, 0, st>>>(sel, TK, K, E, counts, off, row_token, slot_row);
        CHECK_CUDA_LAUNCH();
    }
}
