// kv_attention: decoding attention against a bf16 KV cache (flash-decoding). Pass 1: a CTA per (key chunk of
// kChunk keys, kv head, query row) stages the chunk's keys and values in shared memory, scores them for the group's
// nh/nkv query heads, takes the chunk's max and exp-sum per head, and writes its unnormalised partial output
// (m, l, acc[hd]) in fp32; chunks past the row's position write l = 0 (partial_kernel says how). Pass 2: a CTA per
// (query head, row) rescales the partials by exp(m - M) and divides by the total; where pass 1's CTAs take several
// chunks (a grid of two waves or more: batch 64) and T * nkv <= kCounters, pass 2 is done by pass 1's last CTA of
// each (row, kv head) instead, found by a counter in the workspace (the order in which the CTAs count changes
// nothing: the combine sums the chunks in their order, the same bits as the kernel). At batch 1 the tensor cores
// and that last-CTA combine together made the Qwen3-8B step slower (4.87 against 4.72 ms as graphs on the H200, the
// FMA loops and the combine kernel; not measured apart): the tensor cores stay (choosing the loops by T would make a
// row's bits depend on its batch), the few-row steps keep the combine kernel (the fence, count and reads of the last
// CTA lengthen the one wave's tail, where a launch in a graph costs little). Each K/V row of a chunk is read once per group. Both passes are programmatic
// dependent launches (pdl.cuh). Pass 1 computes on the tensor cores where head_dim is a multiple of 16 and the group
// at most 8 heads (kModeMma: at batch 64 the FMA loops, 2 FMAs a byte of the cache, bound the kernel at ~1.8 TB/s;
// bench/RESULTS.md, issue 23), else on FMA loops.
// gpt-oss's options (kv_attention_opts_forward_cuda): a window (keys pos-window+1 .. pos: the chunks before it write
// empty partials and are not combined) and a sink logit per head, one more term of the total (fp32, device).
#include <cuda_bf16.h>
#include <cstdint>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_attention.h"
#include "cuda_check.h"
#include "env_switch.h"
#include "mma_sm80.cuh"
#include "pdl.cuh"

namespace {

constexpr int kChunk = 64, kThreads = 128, kMaxHd = 256, kMaxGroup = 16;
// The combine in pass 1's last CTA of a (row, kv head) (one launch a layer, for the grids of several chunks a CTA):
// a counter a pair at the workspace's start, kCounters of them (16 KiB), zero when the workspace is new and left
// zero by every call; launches of more pairs than that (long prefills) take the combine kernel.
constexpr int kCounters = 4096;
// pass 1's ways: element by element, 16-byte cp.async with the FMA loops, and the same with the tensor cores
enum { kModeScalar, kModeVec, kModeMma };
constexpr size_t kWave = 132 * 5; // the CTAs of pass 1 the H200 holds at once (head_dim 128, a group of 4)
static_assert(kChunk == 64, "pass 1's softmax takes a chunk's scores as two per lane");

__global__ void append_kernel(__nv_bfloat16 *kc, __nv_bfloat16 *vc, size_t seq_stride, const __nv_bfloat16 *k,
                              int ldk, const __nv_bfloat16 *v, int ldv, const int32_t *seq, const int32_t *pos,
                              int kd)
{
    const int t = blockIdx.x;
    const size_t at = (size_t)seq[t] * seq_stride + (size_t)pos[t] * kd;
    for (int i = threadIdx.x; i < kd; i += blockDim.x) {
        kc[at + i] = k[(size_t)t * ldk + i];
        vc[at + i] = v[(size_t)t * ldv + i];
    }
}

// Shared memory of pass 1: the chunk's key and value rows (hd rounded up to 8 values, zeros past hd, plus 8 values of
// padding, so that the 16-byte reads of a warp's 32 keys at one offset fall in distinct banks), the group's q rows
// in fp32 (zeros past hd), the chunk's scores per head, its probabilities per key (the group's heads side by side,
// padded to 4), and the partial sums of the threads that split a sum (256 per head).
__device__ __forceinline__ void bf16x8_to_float(uint4 u, float (&f)[8])
{
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const float2 x = __bfloat1622float2(h[e]);
        f[2 * e] = x.x, f[2 * e + 1] = x.y;
    }
}

__host__ __device__ constexpr int kv_row(int hd) { return (hd + 7) / 8 * 8 + 8; }
__host__ __device__ constexpr int group4(int group) { return (group + 3) / 4 * 4; }
__host__ __device__ constexpr size_t partial_smem(int hd, int group)
{
    return sizeof(__nv_bfloat16) * 2 * kChunk * kv_row(hd) +
           sizeof(float) * ((size_t)group * (kv_row(hd) + kChunk + 256) + (size_t)kChunk * group4(group));
}

// Pass 2's arithmetic for output (row t, head h, value d < hd): the partials of chunks [first, used) rescaled to their
// common max (and the sink's term), divided by the total. CG: the partials come from other CTAs of the same launch
// (read at L2, past this SM's L1).
template <bool CG>
__device__ __forceinline__ float combine_value(const float *ws_acc, const float *ws_ml, int t, int h, int d, int nh,
                                               int hd, int nchunks, int first, int used, const float *sinks)
{
    auto ld = [](const float *p) { return CG ? __ldcg(p) : *p; };
    const float *ml = ws_ml + ((size_t)t * nh + h) * nchunks * 2;
    float M = sinks ? sinks[h] : -INFINITY;
    for (int c = first; c < used; c++) M = fmaxf(M, ld(ml + 2 * c));
    float L = sinks ? expf(sinks[h] - M) : 0.0f, a = 0.0f;
    const float *acc = ws_acc + ((size_t)t * nh + h) * nchunks * hd;
    for (int c = first; c < used; c++) {
        float w = expf(ld(ml + 2 * c) - M);
        L += ld(ml + 2 * c + 1) * w;
        if (d < hd) a += ld(acc + (size_t)c * hd + d) * w;
    }
    return a / L;
}

__device__ __forceinline__ int chunks_used(int p) { return p / kChunk + 1; }
__device__ __forceinline__ int first_chunk(int p, int window) { return window > 0 ? max(0, p - window + 1) / kChunk : 0; }

// The end of a pass-1 CTA when counters is set: it counts its mine chunks done for its (row, kv head); the CTA that
// brings the count to nchunks resets the counter and combines the group's heads (the combine kernel's arithmetic,
// its bits). Called by every thread of the CTA.
__device__ __forceinline__ void combine_if_last(unsigned *counters, int mine, __nv_bfloat16 *out, int ldo,
                                                const float *ws_acc, const float *ws_ml, int t, int kvh, int nh,
                                                int nkv, int hd, int nchunks, int p, int window, const float *sinks)
{
    __shared__ unsigned last;
    __threadfence(); // this CTA's partial is visible to the device before it counts
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned *cnt = counters + (size_t)t * nkv + kvh;
        last = atomicAdd(cnt, (unsigned)mine) + (unsigned)mine == (unsigned)nchunks;
        if (last) *cnt = 0; // no other CTA of this launch touches it again
    }
    __syncthreads();
    if (!last) return;
    __threadfence(); // the other CTAs' partials, counted before ours
    const int group = nh / nkv, used = chunks_used(p), first = first_chunk(p, window);
    for (int i = threadIdx.x; i < group * hd; i += kThreads) {
        const int g = i / hd, d = i - g * hd, h = kvh * group + g;
        out[(size_t)t * ldo + (size_t)h * hd + d] = __float2bfloat16(
            combine_value<true>(ws_acc, ws_ml, t, h, d, nh, hd, nchunks, first, used, sinks));
    }
}

// Pass 1. The chunk's keys and values are staged in shared memory first, all at once (16-byte cp.async when the
// cache rows are 16-byte aligned, else element by element): one memory round trip a chunk with every byte in
// flight, each K/V row read once for the whole GQA group. Then the scores (each warp a quarter of head_dim for two
// keys a lane and every head: a q read serves two keys), a warp per head for the chunk's max and exp-sum (shuffles
// in a fixed order), and the probabilities times the values (a thread per two values of head_dim and class of keys,
// every head: a value read serves the group). Shared memory's reads, not the FMAs, bound these loops; the layout
// keeps them few and conflict-free. Deterministic: every sum has one order, whatever the launch (the chunk count,
// set by max_pos, only adds empty chunks).
// A CTA takes cpb consecutive chunks of its (row, kv head) (cpb > 1 where the grid has CTAs to spare: batch 64),
// one after the other with the next chunk's loads in flight while this one computes: the keys of chunk c + 1 are
// issued once the scores of c are done with the key buffer, its values once c's values are summed (one buffer each,
// cp.async groups K(c), V(c), K(c + 1), V(c + 1), ...). Each chunk's partial is the one a CTA of its own writes.
__global__ void __launch_bounds__(kThreads)
    partial_kernel(float *ws_acc, float *ws_ml, const __nv_bfloat16 *q, int ldq, const __nv_bfloat16 *kc,
                   const __nv_bfloat16 *vc, size_t seq_stride, const int32_t *seq, const int32_t *pos, int nh,
                   int nkv, int hd, float scale, int nchunks, int window, int mode, int cpb, unsigned *counters,
                   __nv_bfloat16 *out, int ldo, const float *sinks)
{
    extern __shared__ __align__(16) unsigned char kv_smem[];
    pdl::launch_dependents(); // a programmatic dependent launch (pdl.cuh), as the combine after it
    pdl::wait();
    const int kvh = blockIdx.y, t = blockIdx.z, group = nh / nkv, R = kv_row(hd), hd8 = R - 8;
    const int cfirst = blockIdx.x * cpb, cend = min(cfirst + cpb, nchunks);
    __nv_bfloat16 *ks = reinterpret_cast<__nv_bfloat16 *>(kv_smem), *vs = ks + kChunk * R;
    float *qs = reinterpret_cast<float *>(vs + kChunk * R), *sc = qs + group * R, *pt = sc + group * kChunk;
    float *red = pt + kChunk * group4(group);
    __shared__ float mx[kMaxGroup], sm[kMaxGroup];
    const int p = pos[t];
    const size_t kd = (size_t)nkv * hd, sbase = (size_t)seq[t] * seq_stride + (size_t)kvh * hd;
    float *ml = ws_ml + ((size_t)t * nh + (size_t)kvh * group) * nchunks * 2;
    const bool vec = mode >= kModeVec, mma = mode == kModeMma;
    auto keys_of = [&](int c, int &j0) { // chunk c's first key and key count (<= 0: past the causal end or before
        const int j1 = min(c * kChunk + kChunk, p + 1); // the window)
        j0 = window > 0 ? max(c * kChunk, p - window + 1) : c * kChunk;
        return j1 - j0;
    };
    // chunk c's keys (or values) into buf, asynchronously where vec (one cp.async group, empty when c is not
    // this CTA's or has no keys; the tensor cores take the whole chunk, its rows past nk zeros), else element by
    // element; the values past hd: zeros
    auto load = [&](__nv_bfloat16 *buf, const __nv_bfloat16 *src, int c) {
        int j0 = 0;
        const int nk = c < cend ? keys_of(c, j0) : 0;
        if (nk > 0) {
            const size_t base = sbase + (size_t)j0 * kd;
            if (vec) {
                const int P = hd / 8, rows = mma ? kChunk : nk;
                for (int i = threadIdx.x; i < rows * P; i += kThreads) {
                    const int j = i / P, o = (i - j * P) * 8;
                    mma_sm80::cp_async16(buf + j * R + o, src + base + (size_t)(j < nk ? j : 0) * kd + o, j < nk);
                }
            } else {
                for (int i = threadIdx.x; i < nk * hd; i += kThreads) {
                    const int j = i / hd, o = i - j * hd;
                    buf[j * R + o] = src[base + (size_t)j * kd + o];
                }
            }
            const __nv_bfloat16 zero = __float2bfloat16(0.0f);
            for (int i = threadIdx.x; i < nk * (hd8 - hd); i += kThreads) {
                const int j = i / (hd8 - hd), o = hd + i - j * (hd8 - hd);
                buf[j * R + o] = zero;
            }
        }
        if (vec) mma_sm80::cp_async_commit();
    };
    load(ks, kc, cfirst); // K(first), V(first): the keys first, so that the scores need not wait for the values
    load(vs, vc, cfirst);
    for (int i = threadIdx.x; i < group * hd8; i += kThreads) {
        const int g = i / hd8, d = i - g * hd8;
        qs[g * R + d] = d < hd ? __bfloat162float(q[(size_t)t * ldq + (size_t)(kvh * group + g) * hd + d]) : 0.0f;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g8 = lane / 4, t4 = lane % 4, mi = lane / 8;
    const int half = hd8 / 2, KQ = kThreads / half, G4 = group4(group);
    for (int c = cfirst; c < cend; c++) {
        int j0;
        const int nk = keys_of(c, j0);
        if (vec) mma_sm80::cp_async_wait<1>(); // K(c) (V(c) may still be in flight)
        __syncthreads();
        if (nk > 0 && mma) { // scores on the tensor cores: warp w the keys 16w .. 16w + 15 (A: K from shared
            // memory), the group's heads as the 8 columns of B (q, rounded to bf16: exact, q is bf16), all of
            // head_dim in one accumulator
            const int k0 = warp * 16;
            float sacc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int d0 = 0; d0 < hd; d0 += 16) {
                uint32_t a[4];
                mma_sm80::ldmatrix_x4(a, ks + (k0 + lane % 8 + (mi % 2) * 8) * R + d0 + (mi / 2) * 8);
                uint32_t b0 = 0, b1 = 0;
                if (g8 < group) {
                    const float *qg = qs + g8 * R + d0 + 2 * t4;
                    b0 = mma_sm80::pack_bf16(qg[0], qg[1]), b1 = mma_sm80::pack_bf16(qg[8], qg[9]);
                }
                mma_sm80::mma_bf16(sacc, a, b0, b1);
            }
            // sacc: (key k0 + g8, heads 2t4 and 2t4 + 1), then the same for key k0 + g8 + 8
            const int h0 = 2 * t4, j = k0 + g8;
            if (h0 < group) sc[h0 * kChunk + j] = sacc[0] * scale, sc[h0 * kChunk + j + 8] = sacc[2] * scale;
            if (h0 + 1 < group)
                sc[(h0 + 1) * kChunk + j] = sacc[1] * scale, sc[(h0 + 1) * kChunk + j + 8] = sacc[3] * scale;
        } else if (nk > 0) { // scores: warp w takes the 8-value pieces w, w+4, ... of head_dim for keys lane and
            // lane + 32 and every head of the group (q read once for two keys), its partial dots go to red, then
            // summed in warp order
            float s0[kMaxGroup], s1[kMaxGroup];
#pragma unroll
            for (int g = 0; g < kMaxGroup; g++) s0[g] = s1[g] = 0.0f;
            for (int o = warp * 8; o < hd8; o += 32) {
                float k0[8], k1[8];
                bf16x8_to_float(*reinterpret_cast<const uint4 *>(ks + lane * R + o), k0);
                bf16x8_to_float(*reinterpret_cast<const uint4 *>(ks + (lane + 32) * R + o), k1);
#pragma unroll
                for (int g = 0; g < kMaxGroup; g++) {
                    if (g >= group) break;
                    const float4 qa = *reinterpret_cast<const float4 *>(qs + g * R + o);
                    const float4 qb = *reinterpret_cast<const float4 *>(qs + g * R + o + 4);
                    const float q[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
                    for (int e = 0; e < 8; e++) s0[g] = fmaf(q[e], k0[e], s0[g]), s1[g] = fmaf(q[e], k1[e], s1[g]);
                }
            }
#pragma unroll
            for (int g = 0; g < kMaxGroup; g++) {
                if (g >= group) break;
                red[(warp * group + g) * kChunk + lane] = s0[g], red[(warp * group + g) * kChunk + lane + 32] = s1[g];
            }
            __syncthreads();
            for (int i = threadIdx.x; i < group * kChunk; i += kThreads) {
                const int g = i / kChunk, j = i - g * kChunk;
                float d = red[g * kChunk + j];
                for (int w = 1; w < kThreads / 32; w++) d += red[(w * group + g) * kChunk + j];
                sc[g * kChunk + j] = d * scale;
            }
        }
        __syncthreads(); // the keys' buffer is free: K(c + 1)
        load(ks, kc, c + 1);
        for (int g = warp; nk > 0 && g < group; g += kThreads / 32) { // the chunk's max and exp-sum per head: a
            float *s = sc + g * kChunk;                                // warp per head
            const float a = lane < nk ? s[lane] : -INFINITY, b = lane + 32 < nk ? s[lane + 32] : -INFINITY;
            float m = fmaxf(a, b);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            const float ea = lane < nk ? expf(a - m) : 0.0f, eb = lane + 32 < nk ? expf(b - m) : 0.0f;
            pt[lane * G4 + g] = ea, pt[(lane + 32) * G4 + g] = eb;
            float l = ea + eb;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
            if (lane == 0) mx[g] = m, sm[g] = l;
        }
        if (vec) mma_sm80::cp_async_wait<1>(); // V(c) (K(c + 1) may still be in flight)
        __syncthreads();
        if (nk > 0 && mma) { // on the tensor cores, transposed: out^T (head_dim x heads) = V^T (A: ldmatrix.trans
            // of V) · P^T (B: the probabilities rounded to bf16, the group's heads as its 8 columns); warp w the
            // 16-value pieces w, w + 4, ... of head_dim over the chunk's 64 keys (the rows past nk: p = 0, v = 0),
            // stored as they come
            for (int d0 = warp * 16; d0 < hd; d0 += 64) {
                float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int k0 = 0; k0 < kChunk; k0 += 16) {
                    uint32_t a[4];
                    mma_sm80::ldmatrix_x4_trans(a, vs + (k0 + lane % 8 + (mi / 2) * 8) * R + d0 + (mi % 2) * 8);
                    uint32_t b0 = 0, b1 = 0;
                    if (g8 < group) {
                        const float *pg = pt + (k0 + 2 * t4) * G4 + g8;
                        b0 = mma_sm80::pack_bf16(pg[0], pg[G4]), b1 = mma_sm80::pack_bf16(pg[8 * G4], pg[9 * G4]);
                    }
                    mma_sm80::mma_bf16(o, a, b0, b1);
                }
                // o: (value d0 + g8, heads 2t4 and 2t4 + 1), then the same for value d0 + g8 + 8
                float *acc = ws_acc + (((size_t)t * nh + (size_t)kvh * group) * nchunks + c) * hd + d0 + g8;
                const size_t hs = (size_t)nchunks * hd; // from one head to the next
                const int h0 = 2 * t4;
                if (h0 < group) acc[h0 * hs] = o[0], acc[h0 * hs + 8] = o[2];
                if (h0 + 1 < group) acc[(h0 + 1) * hs] = o[1], acc[(h0 + 1) * hs + 8] = o[3];
            }
        } else if (nk > 0) {
            // probabilities times values: thread (two values d of head_dim, key class kq) sums keys kq, kq + KQ, ...
            // for every head of the group (a value read once for the group, the group's probabilities of a key in
            // one 16-byte read), the KQ partial sums go to red, then summed in kq order
            if (threadIdx.x < half * KQ) {
                const int kq = threadIdx.x / half, d = 2 * (threadIdx.x - kq * half);
                float a0[kMaxGroup], a1[kMaxGroup];
#pragma unroll
                for (int g = 0; g < kMaxGroup; g++) a0[g] = a1[g] = 0.0f;
                for (int j = kq; j < nk; j += KQ) {
                    const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(vs + j * R + d));
#pragma unroll
                    for (int g = 0; g < kMaxGroup; g += 4) {
                        if (g >= group) break;
                        const float4 p4 = *reinterpret_cast<const float4 *>(pt + j * G4 + g);
                        a0[g] = fmaf(p4.x, v.x, a0[g]), a1[g] = fmaf(p4.x, v.y, a1[g]);
                        a0[g + 1] = fmaf(p4.y, v.x, a0[g + 1]), a1[g + 1] = fmaf(p4.y, v.y, a1[g + 1]);
                        a0[g + 2] = fmaf(p4.z, v.x, a0[g + 2]), a1[g + 2] = fmaf(p4.z, v.y, a1[g + 2]);
                        a0[g + 3] = fmaf(p4.w, v.x, a0[g + 3]), a1[g + 3] = fmaf(p4.w, v.y, a1[g + 3]);
                    }
                }
#pragma unroll
                for (int g = 0; g < kMaxGroup; g++) {
                    if (g >= group) break;
                    red[(kq * group + g) * hd8 + d] = a0[g], red[(kq * group + g) * hd8 + d + 1] = a1[g];
                }
            }
            __syncthreads();
            for (int i = threadIdx.x; i < group * hd; i += kThreads) {
                const int g = i / hd, d = i - g * hd;
                float a = red[g * hd8 + d];
                for (int kq = 1; kq < KQ; kq++) a += red[(kq * group + g) * hd8 + d];
                ws_acc[(((size_t)t * nh + (size_t)kvh * group + g) * nchunks + c) * hd + d] = a;
            }
        }
        if (threadIdx.x < group) { // the chunk's max and exp-sum per head; an empty chunk: -inf and 0
            ml[((size_t)threadIdx.x * nchunks + c) * 2] = nk > 0 ? mx[threadIdx.x] : -INFINITY;
            ml[((size_t)threadIdx.x * nchunks + c) * 2 + 1] = nk > 0 ? sm[threadIdx.x] : 0.0f;
        }
        __syncthreads(); // the values' buffer (and sc, pt, red, mx, sm) is free: V(c + 1)
        load(vs, vc, c + 1);
    }
    if (vec) mma_sm80::cp_async_wait<0>(); // the last two groups (empty)
    if (counters)
        combine_if_last(counters, cend - cfirst, out, ldo, ws_acc, ws_ml, t, kvh, nh, nkv, hd, nchunks, p, window,
                        sinks);
}

__global__ void combine_kernel(__nv_bfloat16 *out, int ldo, const float *ws_acc, const float *ws_ml,
                               const int32_t *pos, int nh, int hd, int nchunks, int window, const float *sinks)
{
    // the next kernel (the o_proj GEMV, a programmatic dependent launch: pdl.cuh) may start loading its weights
    pdl::launch_dependents();
    pdl::wait();
    const int h = blockIdx.x, t = blockIdx.y, d = threadIdx.x;
    const float v = combine_value<false>(ws_acc, ws_ml, t, h, d, nh, hd, nchunks, first_chunk(pos[t], window),
                                         chunks_used(pos[t]), sinks);
    if (d < hd) out[(size_t)t * ldo + (size_t)h * hd + d] = __float2bfloat16(v);
}

// DFLASH_KV_OLD=1 in the environment (read once): the kernels before the tensor cores, the chunks a CTA and the last
// CTA's combine (pass 1 on the FMA loops, a chunk a CTA, the combine a kernel of its own: two launches a layer;
// bench_decode's A/B).
bool kv_old()
{
    static int old = -1;
    return env_switch(&old, "DFLASH_KV_OLD", "1");
}

} // namespace

extern "C" void kv_cache_append_cuda(uint16_t *kc, uint16_t *vc, size_t seq_stride, const uint16_t *k, int ldk,
                                     const uint16_t *v, int ldv, const int32_t *seq, const int32_t *pos, int T,
                                     int kd, void *stream)
{
    if (T <= 0) return;
    append_kernel<<<T, 256, 0, (cudaStream_t)stream>>>((__nv_bfloat16 *)kc, (__nv_bfloat16 *)vc, seq_stride,
                                                       (const __nv_bfloat16 *)k, ldk, (const __nv_bfloat16 *)v, ldv,
                                                       seq, pos, kd);
    CHECK_CUDA_LAUNCH();
}

extern "C" size_t kv_attention_workspace_bytes(int T, int nh, int hd, int max_pos)
{
    size_t nchunks = (size_t)max_pos / kChunk + 1;
    return sizeof(unsigned) * kCounters + sizeof(float) * (size_t)T * (size_t)nh * nchunks * ((size_t)hd + 2);
}

extern "C" void kv_attention_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *kc,
                                              const uint16_t *vc, size_t seq_stride, const int32_t *seq,
                                              const int32_t *pos, int T, int max_pos, int nh, int nkv, int hd,
                                              float scale, float *workspace, void *stream)
{
    kv_attention_opts_forward_cuda(out, ldo, q, ldq, kc, vc, seq_stride, seq, pos, T, max_pos, nh, nkv, hd, scale, 0,
                                   NULL, workspace, stream);
}

extern "C" void kv_attention_opts_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *kc,
                                               const uint16_t *vc, size_t seq_stride, const int32_t *seq,
                                               const int32_t *pos, int T, int max_pos, int nh, int nkv, int hd,
                                               float scale, int window, const float *sinks, float *workspace,
                                               void *stream)
{
    if (T <= 0) return;
    if (hd > kMaxHd || nh % nkv || nh / nkv > kMaxGroup) {
        fprintf(stderr, "kv_attention_forward_cuda: head_dim %d (max %d), heads %d / kv heads %d (group max %d)\n",
                hd, kMaxHd, nh, nkv, kMaxGroup);
        abort();
    }
    const int nchunks = max_pos / kChunk + 1;
    unsigned *counters = reinterpret_cast<unsigned *>(workspace);
    float *ws_acc = workspace + kCounters, *ws_ml = ws_acc + (size_t)T * nh * nchunks * hd;
    cudaStream_t st = (cudaStream_t)stream;
    static unsigned long long raised = 0; // the devices that allow the most shared memory a launch takes (hd 256, a
    int dev = 0;                          // group of 16), each once
    CHECK_CUDA(cudaGetDevice(&dev));
    if (dev >= 64 || !(raised >> dev & 1)) {
        CHECK_CUDA(cudaFuncSetAttribute(partial_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)partial_smem(kMaxHd, kMaxGroup)));
        if (dev < 64) raised |= 1ull << dev;
    }
    const int vec = hd % 8 == 0 && seq_stride % 8 == 0 && (nkv * hd) % 8 == 0 && (uintptr_t)kc % 16 == 0 &&
                    (uintptr_t)vc % 16 == 0;
    const int mode = !vec ? kModeScalar : hd % 16 == 0 && nh / nkv <= 8 && !kv_old() ? kModeMma : kModeVec;
    // chunks a CTA: more than one while the grid keeps two waves of CTAs (132 SMs x 5 of 128 threads at head_dim
    // 128): at batch 64 and 512-token prompts, 4 (3 CTAs a row and kv head, of 4, 4 and 1 chunks)
    int cpb = 1;
    while (vec && !kv_old() && cpb < 8 && (size_t)(nchunks + 2 * cpb - 1) / (2 * cpb) * nkv * T >= 2 * kWave) cpb *= 2;
    const bool one = cpb > 1 && (size_t)T * nkv <= (size_t)kCounters; // the combine in pass 1's last CTAs
    pdl::launch(partial_kernel, dim3((nchunks + cpb - 1) / cpb, nkv, T), dim3(kThreads), partial_smem(hd, nh / nkv),
                st, ws_acc, ws_ml, (const __nv_bfloat16 *)q, ldq, (const __nv_bfloat16 *)kc, (const __nv_bfloat16 *)vc,
                seq_stride, seq, pos, nh, nkv, hd, scale, nchunks, window, mode, cpb, one ? counters : nullptr,
                (__nv_bfloat16 *)out, ldo, sinks);
    if (!one)
        pdl::launch(combine_kernel, dim3(nh, T), dim3((hd + 31) / 32 * 32), 0, st, (__nv_bfloat16 *)out, ldo,
                    (const float *)ws_acc, (const float *)ws_ml, pos, nh, hd, nchunks, window, sinks);
}
