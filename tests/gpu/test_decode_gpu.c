/* Decoding on the GPU against the CPU. (1) kv_attention and argmax kernels against their CPU references on random
 * data (several sequences, positions across many key chunks, ties). (2) target_decode_cuda on the golden targets
 * ($DFLASH_GOLDENS/{tiny,tiny-bf16}/target, default tests/goldens; and the qwen3_moe goldens qwen3moe-tiny(-bf16)
 * with every expert routed, moe_all_experts.h): three sequences of one text decoded three ways
 * (a prefill then one token a step; a prefill, a verified block cropped to a shorter prefix, then the rest; a
 * prefill then blocks of 3 run in the same steps as the first sequence) give, row for row, the taps and logits of
 * the CPU forward over the whole text (target_model_forward), within the bf16 tolerances of test_target_gpu.
 * Prints "ok <case> ..." / "FAIL <case> ..."; exit status 0 only when every case passed. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#define GPU_TEST_SEED 0x2545f4914f6cdd1dull
#include "argmax.h"
#include "cuda_check.h"
#include "gpu_test.h"
#include "kv_attention.h"
#include "moe_all_experts.h"
#include "target_decode_cuda.h"
#include "target_model.h"
#include "target_model_cuda.h"
#include "util.h"

#define TOL_NORM_REL 3e-2
#define TOL_MAX_REL 6e-2

static void compare(const char *name, const uint16_t *got, const float *ref, size_t n, double tol_norm)
{
    compare_bf16(name, got, ref, n, tol_norm, TOL_MAX_REL);
}

#define upload dev_upload

/* (1a) kv_attention: 3 sequences of a cache of 300 positions, 7 query rows at positions from 0 to 299. */
static void check_kv_attention(void)
{
    const int nseq = 3, max_len = 300, nh = 8, nkv = 2, hd = 128, kd = nkv * hd, T = 7;
    const int32_t seq[7] = {0, 0, 1, 2, 2, 2, 1}, pos[7] = {0, 64, 299, 5, 6, 130, 63};
    const size_t stride = (size_t)max_len * kd, ncache = (size_t)nseq * stride;
    float *kc = xmalloc(ncache * 4), *vc = xmalloc(ncache * 4), *q = xmalloc((size_t)T * nh * hd * 4);
    uint16_t *hk = xmalloc(ncache * 2), *hv = xmalloc(ncache * 2), *hq = xmalloc((size_t)T * nh * hd * 2);
    for (size_t i = 0; i < ncache; i++) {
        hk[i] = f32_to_bf16((float)(2.0 * rnd_uniform())), kc[i] = bf16_to_f32(hk[i]);
        hv[i] = f32_to_bf16((float)rnd_uniform()), vc[i] = bf16_to_f32(hv[i]);
    }
    for (size_t i = 0; i < (size_t)T * nh * hd; i++) hq[i] = f32_to_bf16((float)rnd_uniform()), q[i] = bf16_to_f32(hq[i]);
    float *ref = xmalloc((size_t)T * nh * hd * 4);
    const float scale = 1.0f / sqrtf((float)hd);
    kv_attention_forward_cpu(ref, nh * hd, q, nh * hd, kc, vc, stride, seq, pos, T, nh, nkv, hd, scale);
    uint16_t *d_k = upload(hk, ncache * 2), *d_v = upload(hv, ncache * 2), *d_q = upload(hq, (size_t)T * nh * hd * 2);
    int32_t *d_seq = upload(seq, sizeof seq), *d_pos = upload(pos, sizeof pos);
    uint16_t *d_out = NULL;
    CHECK_CUDA(cudaMalloc((void **)&d_out, (size_t)T * nh * hd * 2));
    float *ws = NULL;
    CHECK_CUDA(cudaMalloc((void **)&ws, kv_attention_workspace_bytes(T, nh, hd, 299)));
    kv_attention_forward_cuda(d_out, nh * hd, d_q, nh * hd, d_k, d_v, stride, d_seq, d_pos, T, 299, nh, nkv, hd, scale,
                              ws, NULL);
    uint16_t *got = xmalloc((size_t)T * nh * hd * 2);
    CHECK_CUDA(cudaMemcpy(got, d_out, (size_t)T * nh * hd * 2, cudaMemcpyDeviceToHost));
    compare("kv_attention T=7 positions 0..299 (5 chunks) nh=8 nkv=2 hd=128", got, ref, (size_t)T * nh * hd, 1e-2);

    /* append: the new rows land at (seq, pos) and nowhere else */
    uint16_t *rows = xmalloc((size_t)T * kd * 2);
    for (size_t i = 0; i < (size_t)T * kd; i++) rows[i] = f32_to_bf16((float)rnd_uniform());
    uint16_t *d_rows = upload(rows, (size_t)T * kd * 2);
    kv_cache_append_cuda(d_k, d_v, stride, d_rows, kd, d_rows, kd, d_seq, d_pos, T, kd, NULL);
    CHECK_CUDA(cudaMemcpy(got = realloc(got, ncache * 2), d_k, ncache * 2, cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (int t = 0; t < T; t++) memcpy(hk + (size_t)seq[t] * stride + (size_t)pos[t] * kd, rows + (size_t)t * kd, (size_t)kd * 2);
    for (size_t i = 0; i < ncache; i++) wrong += got[i] != hk[i];
    printf("%s kv_cache_append: %zu of %zu cache values differ from the expected\n", wrong ? "FAIL" : "ok", wrong,
           ncache);
    if (wrong) failures++;
    void *dev[] = {d_k, d_v, d_q, d_seq, d_pos, d_out, ws, d_rows};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CHECK_CUDA(cudaFree(dev[i]));
    free(kc), free(vc), free(q), free(hk), free(hv), free(hq), free(ref), free(got), free(rows);
}

/* (1b) argmax: rows with a unique maximum, ties (the lowest index wins) and an all-equal row. */
static void check_argmax(void)
{
    const int n = 6, V = 151936;
    uint16_t *h = xmalloc((size_t)n * V * 2);
    float *f = xmalloc((size_t)n * V * 4);
    for (size_t i = 0; i < (size_t)n * V; i++) h[i] = f32_to_bf16((float)rnd_uniform());
    for (int i = 0; i < V; i++) h[(size_t)5 * V + i] = f32_to_bf16(0.5f);
    h[(size_t)1 * V + 77777] = h[(size_t)1 * V + 1234] = f32_to_bf16(9.0f); /* tie: 1234 */
    h[(size_t)2 * V + V - 1] = f32_to_bf16(9.0f);
    for (size_t i = 0; i < (size_t)n * V; i++) f[i] = bf16_to_f32(h[i]);
    int32_t ref[6], got[6];
    argmax_rows_cpu(ref, f, V, n, V);
    uint16_t *d = upload(h, (size_t)n * V * 2);
    int32_t *d_out = NULL;
    CHECK_CUDA(cudaMalloc((void **)&d_out, sizeof got));
    argmax_rows_cuda(d_out, d, V, n, V, NULL);
    CHECK_CUDA(cudaMemcpy(got, d_out, sizeof got, cudaMemcpyDeviceToHost));
    int ok = !memcmp(got, ref, sizeof got) && ref[1] == 1234 && ref[2] == V - 1 && ref[5] == 0;
    printf("%s argmax 6 rows of %d (ties to the lowest index): gpu %d %d %d %d %d %d cpu %d %d %d %d %d %d\n",
           ok ? "ok" : "FAIL", V, got[0], got[1], got[2], got[3], got[4], got[5], ref[0], ref[1], ref[2], ref[3],
           ref[4], ref[5]);
    if (!ok) failures++;
    CHECK_CUDA(cudaFree(d));
    CHECK_CUDA(cudaFree(d_out));
    free(h), free(f);
}

/* Copy n rows of a device (rows, width) bf16 array to host rows [row0, row0+n) of dst (width). */
static void take_rows(uint16_t *dst, int row0, const uint16_t *d_src, int n, int width)
{
    CHECK_CUDA(cudaMemcpy(dst + (size_t)row0 * width, d_src, (size_t)n * width * 2, cudaMemcpyDeviceToHost));
}

/* (2) one golden target, three decoding schedules of one text against the CPU forward over the whole text. */
static void check_decode(const char *label, const char *dir)
{
    errbuf err = {{0}};
    target_model *cpu = NULL;
    target_cuda *gpu = NULL;
    target_cuda_cache *cache = NULL;
    enum { L = 150, P = 20, NSEQ = 3 };
    if (target_model_load(&cpu, dir, -1, &err) || target_cuda_load(&gpu, dir, -1, 256, 8, NULL, &err) ||
        target_cuda_cache_create(&cache, gpu, NSEQ, 160, 64, &err)) {
        printf("FAIL %s load: %s\n", label, err.msg);
        failures++;
        target_model_destroy(&cpu);
        target_cuda_destroy(&gpu);
        return;
    }
    const hf_config *c = target_model_config(cpu);
    const int H = c->hidden_size, V = c->vocab_size, nl = c->num_layers;
    int taps[3] = {0, nl / 2, nl - 1};
    const int W = 3 * H;
    int32_t ids[L], pos[L], cu[2] = {0, L};
    for (int t = 0; t < L; t++) ids[t] = (int32_t)((rnd_uniform() + 1.0) * 0.5 * V) % V, pos[t] = t;
    target_batch b = {.ntok = L, .nseq = 1, .input_ids = ids, .positions = pos, .cu_seqlens = cu};
    float *aux = xmalloc((size_t)L * W * 4), *logits = xmalloc((size_t)L * V * 4);
    if (target_model_forward(cpu, &b, taps, 3, aux, NULL, logits, &err)) {
        printf("FAIL %s cpu forward: %s\n", label, err.msg);
        failures++;
        goto out;
    }
    uint16_t *d_aux = NULL, *d_logits = NULL;
    CHECK_CUDA(cudaMalloc((void **)&d_aux, (size_t)64 * W * 2));
    CHECK_CUDA(cudaMalloc((void **)&d_logits, (size_t)64 * V * 2));
    uint16_t *got_aux[NSEQ], *got_logits[NSEQ];
    for (int s = 0; s < NSEQ; s++) {
        got_aux[s] = xcalloc((size_t)L * W, 2), got_logits[s] = xcalloc((size_t)L * V, 2);
    }
    cudaStream_t st = (cudaStream_t)target_cuda_stream(gpu);
    int rc = 0;
#define STEP(nrun, seqs, ns, idp)                                                                                   \
    do {                                                                                                            \
        if (!rc) rc = target_cuda_cache_forward(cache, nrun, seqs, ns, idp, taps, 3, d_aux, W, d_logits, 0, &err); \
        if (!rc) CHECK_CUDA(cudaStreamSynchronize(st));                                                             \
    } while (0)
    /* sequences 0 and 2 prefill together (a packed step) */
    {
        int seqs[2] = {0, 2}, ns[2] = {P, P};
        int32_t both[2 * P];
        memcpy(both, ids, P * 4), memcpy(both + P, ids, P * 4);
        STEP(2, seqs, ns, both);
        if (!rc) {
            take_rows(got_aux[0], 0, d_aux, P, W), take_rows(got_logits[0], 0, d_logits, P, V);
            take_rows(got_aux[2], 0, d_aux + (size_t)P * W, P, W), take_rows(got_logits[2], 0, d_logits + (size_t)P * V, P, V);
        }
    }
    /* then: sequence 0 one token a step, sequence 2 a block of 3 in the same steps (a cached step over both) */
    for (int t0 = P, t2 = P; !rc && (t0 < L || t2 < L);) {
        int seqs[2], ns[2], nrun = 0, k = 0;
        int32_t step_ids[4];
        if (t0 < L) seqs[nrun] = 0, ns[nrun++] = 1, step_ids[k++] = ids[t0];
        if (t2 < L) {
            int n = L - t2 < 3 ? L - t2 : 3;
            seqs[nrun] = 2, ns[nrun++] = n;
            memcpy(step_ids + k, ids + t2, (size_t)n * 4);
        }
        STEP(nrun, seqs, ns, step_ids);
        if (rc) break;
        int row = 0;
        for (int i = 0; i < nrun; i++) {
            int s = seqs[i], at = s == 0 ? t0 : t2;
            take_rows(got_aux[s], at, d_aux + (size_t)row * W, ns[i], W);
            take_rows(got_logits[s], at, d_logits + (size_t)row * V, ns[i], V);
            row += ns[i];
            if (s == 0) t0 += ns[i];
            else t2 += ns[i];
        }
    }
    /* sequence 1: prefill, a block of 16 of which 5 are kept (crop), then the rest in blocks of 16 */
    {
        int s1 = 1, n = P;
        STEP(1, &s1, &n, ids);
        if (!rc) take_rows(got_aux[1], 0, d_aux, P, W), take_rows(got_logits[1], 0, d_logits, P, V);
        int32_t wrong[16];
        for (int i = 0; i < 16; i++) wrong[i] = i < 5 ? ids[P + i] : (ids[P + i] + 1) % V; /* a rejected tail */
        n = 16;
        STEP(1, &s1, &n, wrong);
        if (!rc) take_rows(got_aux[1], P, d_aux, 5, W), take_rows(got_logits[1], P, d_logits, 5, V);
        if (!rc) rc = target_cuda_cache_crop(cache, 1, P + 5, &err);
        for (int t = P + 5; !rc && t < L; t += n) {
            n = L - t < 16 ? L - t : 16;
            STEP(1, &s1, &n, ids + t);
            if (!rc) take_rows(got_aux[1], t, d_aux, n, W), take_rows(got_logits[1], t, d_logits, n, V);
        }
    }
#undef STEP
    if (rc) {
        printf("FAIL %s decode: %s\n", label, err.msg);
        failures++;
    } else {
        const char *how[NSEQ] = {"prefill+1/step", "prefill+block16 cropped to 5+blocks", "prefill+blocks of 3 beside seq 0"};
        for (int s = 0; s < NSEQ; s++) {
            char name[256];
            const int from = 0;
            snprintf(name, sizeof name, "%s seq%d %s taps rows %d..%d", label, s, how[s], from, L);
            compare(name, got_aux[s] + (size_t)from * W, aux + (size_t)from * W, (size_t)(L - from) * W, TOL_NORM_REL);
            snprintf(name, sizeof name, "%s seq%d %s logits rows %d..%d", label, s, how[s], from, L);
            compare(name, got_logits[s] + (size_t)from * V, logits + (size_t)from * V, (size_t)(L - from) * V,
                    TOL_NORM_REL);
        }
        int n = 11, s0 = 0;
        int32_t more[11] = {0};
        rc = target_cuda_cache_forward(cache, 1, &s0, &n, more, taps, 3, d_aux, W, d_logits, 0, &err);
        int kept = target_cuda_cache_length(cache, 0);
        printf("%s %s 150 + 11 tokens past the cache's 160 positions refused, nothing changed (rc=%d, length %d: %s)\n",
               rc == -ENOSPC && kept == L ? "ok" : "FAIL", label, rc, kept, err.msg);
        if (rc != -ENOSPC || kept != L) failures++;
    }
    for (int s = 0; s < NSEQ; s++) free(got_aux[s]), free(got_logits[s]);
    CHECK_CUDA(cudaFree(d_aux));
    CHECK_CUDA(cudaFree(d_logits));
out:
    free(aux), free(logits);
    target_cuda_cache_destroy(&cache);
    target_cuda_destroy(&gpu);
    target_model_destroy(&cpu);
}

int main(void)
{
    CHECK_CUDA(cudaSetDevice(0));
    check_kv_attention();
    check_argmax();
    const char *g = getenv("DFLASH_GOLDENS");
    char dir[1024];
    const char *cases[] = {"tiny", "tiny-bf16"};
    for (int i = 0; i < 2; i++) {
        snprintf(dir, sizeof dir, "%s/%s/target", g && *g ? g : "tests/goldens", cases[i]);
        check_decode(cases[i], dir);
    }
    /* the qwen3_moe family (its goldens with every expert routed: a bf16 top-k pick cannot flip) */
    const char *moe_cases[] = {"qwen3moe-tiny", "qwen3moe-tiny-bf16"};
    for (int i = 0; i < 2; i++) {
        char variant[] = "/tmp/dflash_decode_qwen3moe_XXXXXX", label[96];
        snprintf(dir, sizeof dir, "%s/%s/target", g && *g ? g : "tests/goldens", moe_cases[i]);
        if (moe_all_experts_make(dir, variant)) {
            failures++;
            continue;
        }
        snprintf(label, sizeof label, "%s (every expert routed)", moe_cases[i]);
        check_decode(label, variant);
        moe_all_experts_remove(variant);
    }
    printf("%s test_decode_gpu: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}
