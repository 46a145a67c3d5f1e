// gated_delta_rule: CUDA chunked gated delta rule (forward). One block per (sequence, value head, tile of dvt value
// columns): the recurrence is separable over the value columns (column j of the state only ever meets column j of
// v), so a block keeps a (dk, dvt) fp32 slice of the state in shared memory and walks its sequence chunk by chunk.
// dvt is 64 where the shared memory allows (dk <= 128: the chunk's k·k and q·k products, which every column tile of a
// head recomputes, are shared by twice the columns of the 32-column tile taken at larger dk). The chunk's gates are
// loaded by all threads before one thread sums them; the triangular solve gives each value column 4 lanes of a warp
// (strided partial sums over u, combined by shuffles: the columns never meet, so no block barrier per row).
// With S0 the state at a chunk start and G_t = Σ_{u<=t} g_u (cumulative log-decay inside the chunk, G <= 0):
//   δ_t = β_t (v_t − e^{G_t} S0ᵀk_t − Σ_{u<t} e^{G_t−G_u} (k_t·k_u) δ_u)    (a unit lower-triangular solve)
//   o_t = e^{G_t} S0ᵀq_t + Σ_{u<=t} e^{G_t−G_u} (q_t·k_u) δ_u
//   S   = e^{G_{L−1}} S0 + Σ_u e^{G_{L−1}−G_u} k_u ⊗ δ_u
// Every exponent is <= 0 (u <= t), so nothing overflows however long the sequence or strong the decay; the state
// crosses chunks in fp32. Same algebra as transformers' torch_chunk_gated_delta_rule. Decoding (the _state entry)
// runs from a carried state (a slot of a state array per sequence, or zeros) and stores the state after the
// sequence's last row into another slot: steps of at most GDR_SHORT rows a sequence (one token, a verified block) by
// the plain recurrence below with the state in registers, longer ones by this kernel.
#include <cuda_bf16.h>
#include <cstdint>

#include "cuda_check.h"
#include "gated_delta_rule.h"

#define GDR_CHUNK 64
#define GDR_THREADS 256
#define GDR_SOLVE_LANES 4 /* lanes per value column in the triangular solve: 256 threads cover 64 columns */

static __global__ void gdr_chunk_kernel(__nv_bfloat16 *out, int ldo, const __nv_bfloat16 *q, int ldq,
                                        const __nv_bfloat16 *k, int ldk, const __nv_bfloat16 *v, int ldv,
                                        const float *g, int ldg, const float *beta, int ldb,
                                        const int32_t *cu_seqlens, int rep, int dk, int dv, int dvt, int C,
                                        float *state, const int32_t *st_in, const int32_t *st_out)
{
    extern __shared__ float sm[];
    const int s = blockIdx.x, h = blockIdx.y, j0 = blockIdx.z * dvt, kh = h / rep;
    const int nj = min(dvt, dv - j0), tid = threadIdx.x;
    const int ks = dk + 1;                // odd row stride: threads reading k_u for consecutive u hit distinct banks
    float *S = sm;                        // (dk, dvt)
    float *Kc = S + dk * dvt;             // (C, ks)
    float *Qc = Kc + C * ks;              // (C, ks)
    const int ldd = dvt + 1;              // odd: the solve's 4 lanes of a column read 4 rows on distinct banks
    float *D = Qc + C * ks;               // (C, ldd): the right-hand side, then δ
    float *A = D + C * ldd;               // (C, C): strictly lower β_t e^{G_t−G_u} k_t·k_u
    float *QK = A + C * C;                // (C, C): lower e^{G_t−G_u} q_t·k_u
    float *G = QK + C * C;                // (C)
    float *B = G + C;                     // (C)
    float *EG = B + C;                    // (C): e^{G_t}
    float *EL = EG + C;                   // (C): e^{G_{L-1} - G_u}
    const int t0 = cu_seqlens[s], t1 = cu_seqlens[s + 1];
    // the carried state's (dk, nj) slice of this head, or zeros at a sequence start
    const size_t hoff = (size_t)h * dk * dv + (size_t)j0;
    const float *s0 = state && st_in[s] >= 0 ? state + (size_t)st_in[s] * (size_t)gridDim.y * dk * dv + hoff : NULL;
    for (int i = tid; i < dk * dvt; i += blockDim.x) {
        int d = i / dvt, j = i - d * dvt;
        S[i] = s0 && j < nj ? s0[(size_t)d * dv + j] : 0.0f;
    }
    for (int c0 = t0; c0 < t1; c0 += C) {
        const int L = min(C, t1 - c0);
        __syncthreads(); // S written by the previous chunk
        for (int i = tid; i < L * dk; i += blockDim.x) {
            int t = i / dk, d = i - t * dk;
            Kc[t * ks + d] = __bfloat162float(k[(size_t)(c0 + t) * ldk + (size_t)kh * dk + d]);
            Qc[t * ks + d] = __bfloat162float(q[(size_t)(c0 + t) * ldq + (size_t)kh * dk + d]);
        }
        for (int t = tid; t < L; t += blockDim.x) {
            G[t] = g[(size_t)(c0 + t) * ldg + h];
            B[t] = beta[(size_t)(c0 + t) * ldb + h];
        }
        __syncthreads();
        if (tid == 0) // the in-chunk cumulative log-decay: at most 64 terms, from shared memory
            for (int t = 1; t < L; t++) G[t] += G[t - 1];
        __syncthreads();
        for (int t = tid; t < L; t += blockDim.x) {
            EG[t] = __expf(G[t]);
            EL[t] = __expf(G[L - 1] - G[t]);
        }
        for (int i = tid; i < L * L; i += blockDim.x) {
            int t = i / L, u = i - t * L;
            float a = 0.0f, qk = 0.0f;
            if (u <= t) {
                float kk = 0.0f, qq = 0.0f;
                for (int d = 0; d < dk; d++) {
                    float ku = Kc[u * ks + d];
                    kk += Kc[t * ks + d] * ku;
                    qq += Qc[t * ks + d] * ku;
                }
                float decay = __expf(G[t] - G[u]); // G[t] - G[u] <= 0
                if (u < t) a = B[t] * decay * kk;
                qk = decay * qq;
            }
            A[t * C + u] = a;
            QK[t * C + u] = qk;
        }
        __syncthreads(); // EG, EL
        for (int i = tid; i < L * nj; i += blockDim.x) { // rhs: β_t (v_t − e^{G_t} S0ᵀ k_t)
            int t = i / nj, j = i - t * nj;
            float sk = 0.0f;
            for (int d = 0; d < dk; d++) sk += S[d * dvt + j] * Kc[t * ks + d];
            float vt = __bfloat162float(v[(size_t)(c0 + t) * ldv + (size_t)h * dv + j0 + j]);
            D[t * ldd + j] = B[t] * (vt - EG[t] * sk);
        }
        __syncthreads();
        { // forward substitution: column j = tid / 4, its 4 lanes sum u ≡ r (mod 4) and combine by shuffles
            const int j = tid / GDR_SOLVE_LANES, r = tid % GDR_SOLVE_LANES;
            for (int j1 = j; j1 < dvt; j1 += blockDim.x / GDR_SOLVE_LANES) { // warp-uniform: 8 columns a warp
                for (int t = 1; t < L; t++) {
                    float acc = 0.0f;
                    for (int u = r; u < t; u += GDR_SOLVE_LANES) acc += A[t * C + u] * D[u * ldd + j1];
                    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
                    acc += __shfl_xor_sync(0xffffffffu, acc, 2);
                    if (r == 0 && j1 < nj) D[t * ldd + j1] -= acc;
                    __syncwarp(); // row t of the column is read by its 4 lanes for row t + 1
                }
            }
        }
        __syncthreads();
        for (int i = tid; i < L * nj; i += blockDim.x) { // outputs, from S0 and the chunk's δ
            int t = i / nj, j = i - t * nj;
            float sq = 0.0f, intra = 0.0f;
            for (int d = 0; d < dk; d++) sq += S[d * dvt + j] * Qc[t * ks + d];
            for (int u = 0; u <= t; u++) intra += QK[t * C + u] * D[u * ldd + j];
            out[(size_t)(c0 + t) * ldo + (size_t)h * dv + j0 + j] = __float2bfloat16_rn(EG[t] * sq + intra);
        }
        __syncthreads(); // every output read S0
        for (int i = tid; i < dk * nj; i += blockDim.x) {
            int d = i / nj, j = i - d * nj;
            float acc = EG[L - 1] * S[d * dvt + j];
            for (int u = 0; u < L; u++) acc += EL[u] * Kc[u * ks + d] * D[u * ldd + j];
            S[d * dvt + j] = acc;
        }
    }
    if (!state) return;
    __syncthreads(); // the last chunk's state (or the loaded one, for a sequence without new rows)
    float *s1 = state + (size_t)st_out[s] * (size_t)gridDim.y * dk * dv + hoff;
    for (int i = tid; i < dk * nj; i += blockDim.x) {
        int d = i / nj, j = i - d * nj;
        s1[(size_t)d * dv + j] = S[d * dvt + j];
    }
}

// Decoding steps of a few rows a sequence (the _state entry, at most GDR_SHORT rows): the plain recurrence, one
// block per (sequence, value head, 32 value columns), 8 warps down the key rows: lane j holds column j of its warp's
// dk/8 rows of the state in registers (loaded and stored as coalesced 128-byte rows), so the state crosses the
// memory once each way and nothing else is kept; per row the partial sums Sᵀk and Sᵀq over a warp's rows meet in
// shared memory (fixed order: deterministic).
#define GDR_SHORT 16
#define GDR_RW 8 /* warps of the recurrent kernel */
template <int R> /* state rows a warp holds: dk / GDR_RW */
static __global__ void __launch_bounds__(32 * GDR_RW)
    gdr_recurrent_kernel(__nv_bfloat16 *out, int ldo, const __nv_bfloat16 *q, int ldq, const __nv_bfloat16 *k,
                         int ldk, const __nv_bfloat16 *v, int ldv, const float *g, int ldg, const float *beta, int ldb,
                         const int32_t *cu_seqlens, int rep, int dv, float *state, const int32_t *st_in,
                         const int32_t *st_out)
{
    constexpr int DK = R * GDR_RW;
    __shared__ float kq[2][DK], red[2][GDR_RW][32];
    const int s = blockIdx.x, h = blockIdx.y, j0 = blockIdx.z * 32, kh = h / rep;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, j = j0 + lane, r0 = w * R;
    const bool col = j < dv;
    const size_t hoff = (size_t)h * DK * dv, sstride = (size_t)gridDim.y * DK * dv;
    const float *s0 = st_in[s] >= 0 ? state + (size_t)st_in[s] * sstride + hoff : nullptr;
    float *s1 = state + (size_t)st_out[s] * sstride + hoff;
    float S[R];
#pragma unroll
    for (int r = 0; r < R; r++) S[r] = s0 && col ? s0[(size_t)(r0 + r) * dv + j] : 0.0f;
    const int t0 = cu_seqlens[s], t1 = cu_seqlens[s + 1];
    for (int t = t0; t < t1; t++) {
        __syncthreads(); // the previous row's k, q and sums read
        for (int i = tid; i < DK; i += blockDim.x) {
            kq[0][i] = __bfloat162float(k[(size_t)t * ldk + (size_t)kh * DK + i]);
            kq[1][i] = __bfloat162float(q[(size_t)t * ldq + (size_t)kh * DK + i]);
        }
        const float decay = __expf(g[(size_t)t * ldg + h]), b = beta[(size_t)t * ldb + h];
        const float vt = col ? __bfloat162float(v[(size_t)t * ldv + (size_t)h * dv + j]) : 0.0f;
        __syncthreads();
        float part = 0.0f;
#pragma unroll
        for (int r = 0; r < R; r++) {
            S[r] *= decay;
            part += S[r] * kq[0][r0 + r];
        }
        red[0][w][lane] = part;
        __syncthreads();
        float sk = 0.0f;
#pragma unroll
        for (int i = 0; i < GDR_RW; i++) sk += red[0][i][lane];
        const float delta = b * (vt - sk);
        float po = 0.0f;
#pragma unroll
        for (int r = 0; r < R; r++) {
            S[r] += kq[0][r0 + r] * delta;
            po += S[r] * kq[1][r0 + r];
        }
        red[1][w][lane] = po;
        __syncthreads();
        if (w == 0 && col) {
            float o = 0.0f;
#pragma unroll
            for (int i = 0; i < GDR_RW; i++) o += red[1][i][lane];
            out[(size_t)t * ldo + (size_t)h * dv + j] = __float2bfloat16_rn(o);
        }
    }
    if (col)
#pragma unroll
        for (int r = 0; r < R; r++) s1[(size_t)(r0 + r) * dv + j] = S[r];
}

/* the kernel's shared memory: S (dk, dvt), Kc and Qc (C, dk + 1), D (C, dvt + 1), A and QK (C, C), G B EG EL (C) */
static size_t gdr_smem_bytes(int dk, int dvt, int chunk)
{
    const size_t C = (size_t)chunk;
    return sizeof(float) * ((size_t)dk * dvt + 2 * C * (dk + 1) + C * (dvt + 1) + 2 * C * C + 4 * C);
}

/* One launch: chunks of `chunk` tokens (<= GDR_CHUNK), the state carried through state/st_in/st_out when state is
 * not NULL. */
static void gdr_launch(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k, int ldk,
                       const uint16_t *v, int ldv, const float *g, int ldg, const float *beta, int ldb,
                       const int32_t *cu_seqlens, int nseq, int hk, int hv, int dk, int dv, int chunk, float *state,
                       const int32_t *st_in, const int32_t *st_out, void *stream, const char *who)
{
    if (nseq <= 0 || hv <= 0 || dv <= 0) return;
    if (hk <= 0 || hv % hk || dk <= 0 || dk > 256) {
        fprintf(stderr, "%s: hk %d / hv %d / dk %d unsupported\n", who, hk, hv, dk);
        exit(1);
    }
    /* 64 value columns a block where the shared memory allows and the heads are that wide, else 32 */
    const int dvt = dv > 32 && gdr_smem_bytes(dk, 64, chunk) <= 160 * 1024 ? 64 : 32;
    const size_t smem = gdr_smem_bytes(dk, dvt, chunk);
    CHECK_CUDA(cudaFuncSetAttribute(gdr_chunk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)nseq, (unsigned)hv, (unsigned)((dv + dvt - 1) / dvt));
    gdr_chunk_kernel<<<grid, GDR_THREADS, smem, (cudaStream_t)stream>>>(
        (__nv_bfloat16 *)out, ldo, (const __nv_bfloat16 *)q, ldq, (const __nv_bfloat16 *)k, ldk,
        (const __nv_bfloat16 *)v, ldv, g, ldg, beta, ldb, cu_seqlens, hv / hk, dk, dv, dvt, chunk, state, st_in,
        st_out);
    CHECK_CUDA_LAUNCH();
}

extern "C" void gated_delta_rule_forward_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq, const uint16_t *k,
                                              int ldk, const uint16_t *v, int ldv, const float *g, int ldg,
                                              const float *beta, int ldb, const int32_t *cu_seqlens, int nseq, int hk,
                                              int hv, int dk, int dv, void *stream)
{
    gdr_launch(out, ldo, q, ldq, k, ldk, v, ldv, g, ldg, beta, ldb, cu_seqlens, nseq, hk, hv, dk, dv, GDR_CHUNK, NULL,
               NULL, NULL, stream, "gated_delta_rule_forward_cuda");
}

extern "C" void gated_delta_rule_forward_state_cuda(uint16_t *out, int ldo, const uint16_t *q, int ldq,
                                                    const uint16_t *k, int ldk, const uint16_t *v, int ldv,
                                                    const float *g, int ldg, const float *beta, int ldb,
                                                    const int32_t *cu_seqlens, int nseq, int max_seqlen, int hk,
                                                    int hv, int dk, int dv, float *state, const int32_t *state_in,
                                                    const int32_t *state_out, void *stream)
{
    if (max_seqlen <= GDR_SHORT && (dk == 64 || dk == 128 || dk == 256) && nseq > 0 && hv > 0 && dv > 0 && hk > 0 &&
        hv % hk == 0) { /* the plain recurrence, the state in registers */
        dim3 grid((unsigned)nseq, (unsigned)hv, (unsigned)((dv + 31) / 32));
        const __nv_bfloat16 *qb = (const __nv_bfloat16 *)q, *kb = (const __nv_bfloat16 *)k,
                            *vb = (const __nv_bfloat16 *)v;
        __nv_bfloat16 *ob = (__nv_bfloat16 *)out;
        cudaStream_t st = (cudaStream_t)stream;
        if (dk == 64)
            gdr_recurrent_kernel<8><<<grid, 32 * GDR_RW, 0, st>>>(ob, ldo, qb, ldq, kb, ldk, vb, ldv, g, ldg, beta, ldb,
                                                                  cu_seqlens, hv / hk, dv, state, state_in, state_out);
        else if (dk == 128)
            gdr_recurrent_kernel<16><<<grid, 32 * GDR_RW, 0, st>>>(ob, ldo, qb, ldq, kb, ldk, vb, ldv, g, ldg, beta,
                                                                   ldb, cu_seqlens, hv / hk, dv, state, state_in,
                                                                   state_out);
        else
            gdr_recurrent_kernel<32><<<grid, 32 * GDR_RW, 0, st>>>(ob, ldo, qb, ldq, kb, ldk, vb, ldv, g, ldg, beta,
                                                                   ldb, cu_seqlens, hv / hk, dv, state, state_in,
                                                                   state_out);
        CHECK_CUDA_LAUNCH();
        return;
    }
    /* longer steps (a prefill), other key dims: the chunked kernel from the carried state, with a chunk as short as
     * the step's longest sequence where that is shorter than 64 (less shared memory: more blocks an SM) */
    int chunk = 16;
    while (chunk < max_seqlen && chunk < GDR_CHUNK) chunk *= 2;
    gdr_launch(out, ldo, q, ldq, k, ldk, v, ldv, g, ldg, beta, ldb, cu_seqlens, nseq, hk, hv, dk, dv, chunk, state,
               state_in, state_out, stream, "gated_delta_rule_forward_state_cuda");
}
