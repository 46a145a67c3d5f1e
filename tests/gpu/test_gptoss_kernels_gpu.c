/* gpt-oss's additions to the CUDA kernels against their CPU references on the same bf16-exact inputs: the causal
 * flash attention (head_dim 16 and 64) and its scalar path (head_dim 40) with sink logits and a sliding window
 * (none, 5: shorter than the sequences and than a key tile, 100: longer than some), the KV-cache attention with the
 * same, the grouped MoE GEMMs with expert biases and the clamped SwiGLU in their epilogues (gate pre-activations
 * past the clamp), and bias_add. The GPU output is bf16 (one rounding of an fp32 result): tolerances 1e-2 on the
 * relative norm and the max error. Prints "ok <case> ..." / "FAIL <case> ..."; exit status 0 only when every case
 * passed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "attention.h"
#include "bias_add.h"
#include "cuda_check.h"
#include "gpu_test.h"
#include "kv_attention.h"
#include "moe_gemm.h"
#include "moe_group.h"
#include "swiglu.h"
#include "util.h"

#define TOL 1e-2

static void cmp_dev(const char *name, const uint16_t *d, const float *ref, size_t n)
{
    uint16_t *h = dev_get(d, n * 2);
    compare_bf16(name, h, ref, n, TOL, TOL);
    free(h);
}

/* Packed attention over sequences lens (one of a single token, one past a 128-query block) and, for the same rows
 * placed in a cache, the KV-cache attention; window W, sinks on or off. */
static void check_attention(int hd, int W, int with_sinks)
{
    const int lens[4] = {37, 1, 150, 9}, nseq = 4, nh = 4, nkv = 2, qd = nh * hd, kd = nkv * hd;
    int32_t cu[5] = {0};
    for (int s = 0; s < nseq; s++) cu[s + 1] = cu[s] + lens[s];
    const int T = cu[nseq];
    float *qf = xmalloc(sizeof(float) * T * qd), *kf = xmalloc(sizeof(float) * T * kd);
    float *vf = xmalloc(sizeof(float) * T * kd), *ref = xmalloc(sizeof(float) * T * qd);
    uint16_t *qh = rnd_bf16((size_t)T * qd, 2.0, qf), *kh = rnd_bf16((size_t)T * kd, 2.0, kf);
    uint16_t *vh = rnd_bf16((size_t)T * kd, 1.0, vf);
    const float sinks[4] = {1.5f, -2.0f, 4.0f, 0.0f}, scale = 1.0f / sqrtf((float)hd);
    const attention_opts o = {.window = W, .sinks = with_sinks ? sinks : NULL};
    attention_causal_opts_forward_cpu(ref, qf, kf, vf, cu, nseq, nh, nkv, hd, scale, &o);
    uint16_t *dq = dev_upload(qh, (size_t)T * qd * 2), *dk = dev_upload(kh, (size_t)T * kd * 2);
    uint16_t *dv = dev_upload(vh, (size_t)T * kd * 2), *dout = dev_poisoned((size_t)T * qd);
    int32_t *dcu = dev_upload(cu, sizeof cu);
    float *dsinks = with_sinks ? dev_upload(sinks, sizeof sinks) : NULL;
    attention_causal_opts_forward_cuda(dout, qd, dq, qd, dk, kd, dv, kd, dcu, nseq, 150, nh, nkv, hd, scale, W, dsinks,
                                       stream);
    char name[160];
    snprintf(name, sizeof name, "attention_opts hd=%d window=%d sinks=%d%s", hd, W, with_sinks,
             hd % 16 ? " (scalar path)" : "");
    cmp_dev(name, dout, ref, (size_t)T * qd);
    /* the KV cache: sequence s's rows at positions 0.. of cache sequence s */
    int32_t *seq = xmalloc(sizeof(int32_t) * T), *pos = xmalloc(sizeof(int32_t) * T);
    for (int s = 0; s < nseq; s++)
        for (int t = cu[s]; t < cu[s + 1]; t++) seq[t] = s, pos[t] = t - cu[s];
    const size_t stride = (size_t)160 * kd;
    uint16_t *dkc = dev_upload(NULL, nseq * stride * 2), *dvc = dev_upload(NULL, nseq * stride * 2);
    int32_t *dseq = dev_upload(seq, sizeof(int32_t) * T), *dpos = dev_upload(pos, sizeof(int32_t) * T);
    float *ws = dev_upload(NULL, kv_attention_workspace_bytes(T, nh, hd, 159));
    kv_cache_append_cuda(dkc, dvc, stride, dk, kd, dv, kd, dseq, dpos, T, kd, stream);
    uint16_t *dout2 = dev_poisoned((size_t)T * qd);
    kv_attention_opts_forward_cuda(dout2, qd, dq, qd, dkc, dvc, stride, dseq, dpos, T, 149, nh, nkv, hd, scale, W,
                                   dsinks, ws, stream);
    snprintf(name, sizeof name, "kv_attention_opts hd=%d window=%d sinks=%d", hd, W, with_sinks);
    cmp_dev(name, dout2, ref, (size_t)T * qd);
    void *d[] = {dq, dk, dv, dout, dcu, dkc, dvc, dseq, dpos, ws, dout2};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) CHECK_CUDA(cudaFree(d[i]));
    if (dsinks) CHECK_CUDA(cudaFree(dsinks));
    free(qf), free(kf), free(vf), free(ref), free(qh), free(kh), free(vh), free(seq), free(pos);
}

/* The grouped GEMMs with gpt-oss's options on random picks (no shared expert), against moe_gemm_*_opts_cpu. */
static void check_moe_gemm_opts(int T, int K, int E, int H, int Im)
{
    const int TK = T * K, R = TK, lda = Im + 8, mt = moe_group_max_tiles(TK, E, 0, MOE_GEMM_BM);
    int32_t *sel = xmalloc(sizeof(int32_t) * (size_t)TK);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) sel[t * K + j] = (t * 7 + j * 3) % E; /* distinct per token for K <= E/3 */
    float *xf = xmalloc(sizeof(float) * (size_t)T * H), *wgu = xmalloc(sizeof(float) * (size_t)E * 2 * Im * H);
    float *wd = xmalloc(sizeof(float) * (size_t)E * H * Im);
    float *bgu = xmalloc(sizeof(float) * (size_t)E * 2 * Im), *bd = xmalloc(sizeof(float) * (size_t)E * H);
    uint16_t *xh = rnd_bf16((size_t)T * H, 2.0, xf);
    uint16_t *wguh = rnd_bf16((size_t)E * 2 * Im * H, 8.0 / sqrt((double)H), wgu); /* gate/up past +-7 often */
    uint16_t *wdh = rnd_bf16((size_t)E * H * Im, 1.0 / sqrt((double)Im), wd);
    for (int i = 0; i < E * 2 * Im; i++) bgu[i] = (float)rnd_uniform();
    for (int i = 0; i < E * H; i++) bd[i] = (float)rnd_uniform();
    int32_t *off = xmalloc(sizeof(int32_t) * (size_t)(E + 2)), *rt = xmalloc(sizeof(int32_t) * (size_t)R);
    int32_t *sr = xmalloc(sizeof(int32_t) * (size_t)TK), *tl = xmalloc(sizeof(int32_t) * 3 * (size_t)mt);
    moe_group_cpu(sel, T, K, E, 0, MOE_GEMM_BM, off, rt, sr, tl);
    const moe_gemm_opts ogu = {.bias = bgu, .alpha = 1.702f, .limit = 7.0f}, odn = {.bias = bd};
    float *act = xcalloc((size_t)R * lda, sizeof(float)), *ys = xcalloc((size_t)R * H, sizeof(float));
    moe_gemm_gate_up_opts_cpu(act, lda, xf, H, rt, off, E, H, Im, 0, wgu, NULL, &ogu);
    int clamped = 0;
    for (int e = 0; e < E; e++) /* some gate pre-activation past the limit (the clamp is exercised) */
        for (int r = off[e]; r < off[e + 1]; r++)
            for (int j = 0; j < Im; j++) {
                float g = bgu[e * 2 * Im + j];
                for (int k = 0; k < H; k++) g += xf[(size_t)rt[r] * H + k] * wgu[((size_t)e * 2 * Im + j) * H + k];
                clamped += g > 7.0f;
            }
    int32_t *dsel = dev_upload(sel, sizeof(int32_t) * (size_t)TK), *doff = dev_upload(NULL, sizeof(int32_t) * (size_t)(E + 2));
    int32_t *drt = dev_upload(NULL, sizeof(int32_t) * (size_t)R), *dsr = dev_upload(NULL, sizeof(int32_t) * (size_t)TK);
    int32_t *dtl = dev_upload(NULL, sizeof(int32_t) * 3 * (size_t)mt), *dnt = dev_upload(NULL, sizeof(int32_t));
    void *work = dev_upload(NULL, moe_group_cuda_workspace(TK, E));
    uint16_t *dx = dev_upload(xh, (size_t)T * H * 2), *dwgu = dev_upload(wguh, (size_t)E * 2 * Im * H * 2);
    uint16_t *dwd = dev_upload(wdh, (size_t)E * H * Im * 2);
    float *dbgu = dev_upload(bgu, sizeof(float) * (size_t)E * 2 * Im), *dbd = dev_upload(bd, sizeof(float) * (size_t)E * H);
    uint16_t *dact = dev_poisoned((size_t)R * lda), *dys = dev_poisoned((size_t)R * H);
    moe_group_cuda(dsel, T, K, E, 0, MOE_GEMM_BM, doff, drt, dsr, dtl, dnt, work, stream);
    const moe_gemm_opts dgu = {.bias = dbgu, .alpha = 1.702f, .limit = 7.0f}, ddn = {.bias = dbd};
    moe_gemm_gate_up_opts_cuda(dact, lda, dx, H, drt, dtl, dnt, mt, E, H, Im, 0, dwgu, NULL, &dgu, stream);
    moe_gemm_down_opts_cuda(dys, H, dact, lda, dtl, dnt, mt, E, H, Im, 0, dwd, NULL, &ddn, stream);
    uint16_t *gact = dev_get(dact, (size_t)R * lda * 2), *ga = xmalloc(sizeof(uint16_t) * (size_t)R * Im);
    float *ra = xmalloc(sizeof(float) * (size_t)R * Im), *gaf = xmalloc(sizeof(float) * (size_t)R * lda);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < Im; j++) ga[r * Im + j] = gact[(size_t)r * lda + j], ra[r * Im + j] = act[(size_t)r * lda + j];
    char name[160];
    snprintf(name, sizeof name, "moe_gemm_gate_up bias+clamped swiglu T=%d K=%d E=%d H=%d Im=%d (%d clamped)", T, K,
             E, H, Im, clamped);
    compare_bf16(name, ga, ra, (size_t)R * Im, TOL, TOL);
    if (!clamped) {
        printf("FAIL moe_gemm_gate_up: no gate pre-activation reached the clamp\n");
        failures++;
    }
    for (size_t i = 0; i < (size_t)R * lda; i++) gaf[i] = bf16_to_f32(gact[i]);
    moe_gemm_down_opts_cpu(ys, H, gaf, lda, off, E, H, Im, 0, wd, NULL, &odn);
    snprintf(name, sizeof name, "moe_gemm_down bias T=%d K=%d E=%d H=%d Im=%d", T, K, E, H, Im);
    cmp_dev(name, dys, ys, (size_t)R * H);
    void *d[] = {dsel, doff, drt, dsr, dtl, dnt, work, dx, dwgu, dwd, dbgu, dbd, dact, dys};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) CHECK_CUDA(cudaFree(d[i]));
    free(sel), free(xf), free(wgu), free(wd), free(bgu), free(bd), free(xh), free(wguh), free(wdh), free(off), free(rt);
    free(sr), free(tl), free(act), free(ys), free(gact), free(ga), free(ra), free(gaf);
}

static void check_bias_add(void)
{
    const int rows = 37, n = 72, ld = 80;
    float *xf = xmalloc(sizeof(float) * rows * ld), *b = xmalloc(sizeof(float) * n);
    uint16_t *xh = rnd_bf16((size_t)rows * ld, 2.0, xf);
    for (int i = 0; i < n; i++) b[i] = (float)rnd_uniform();
    uint16_t *dx = dev_upload(xh, (size_t)rows * ld * 2);
    float *db = dev_upload(b, sizeof(float) * n), *dxf = dev_upload(xf, sizeof(float) * rows * ld);
    bias_add_bf16_cuda(dx, ld, rows, n, db, stream);
    bias_add_f32_cuda(dxf, ld, rows, n, db, stream);
    bias_add_cpu(xf, ld, rows, n, b);
    cmp_dev("bias_add_bf16 rows=37 n=72 ld=80", dx, xf, (size_t)rows * ld);
    float *g = dev_get(dxf, sizeof(float) * rows * ld);
    const int same = !memcmp(g, xf, sizeof(float) * rows * ld);
    printf("%s bias_add_f32 rows=37 n=72 ld=80: %s\n", same ? "ok" : "FAIL", same ? "exact" : "differs");
    if (!same) failures++;
    CHECK_CUDA(cudaFree(dx));
    CHECK_CUDA(cudaFree(db));
    CHECK_CUDA(cudaFree(dxf));
    free(xf), free(b), free(xh), free(g);
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        printf("usage: test_gptoss_kernels_gpu\nCompares gpt-oss's CUDA kernel options (attention sinks and sliding "
               "window, MoE biases and clamped SwiGLU, bias_add) with their CPU references on random data.\n");
        return strcmp(argv[1], "--help") && strcmp(argv[1], "-h") ? 2 : 0;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("FAIL test_gptoss_kernels_gpu: no CUDA device\n");
        return 1;
    }
    CHECK_CUDA(cudaStreamCreate(&stream));
    const int hds[3] = {16, 64, 40}, windows[3] = {0, 5, 100};
    for (int h = 0; h < 3; h++)
        for (int w = 0; w < 3; w++)
            for (int s = 0; s < 2; s++) check_attention(hds[h], windows[w], s);
    check_moe_gemm_opts(50, 4, 32, 256, 64);
    check_moe_gemm_opts(300, 2, 8, 96, 32);
    check_bias_add();
    printf("test_gptoss_kernels_gpu: %d case(s) failed\n", failures);
    return failures ? 1 : 0;
}
