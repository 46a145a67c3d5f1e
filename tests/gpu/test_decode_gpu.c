/* Decoding on the GPU against the CPU (the kernels it runs, kv_attention, kv_cache_append and argmax among them, are
 * rows of the kernel case table: tests/kernel_cases.c). (2) target_decode_cuda on the golden targets
 * ($DFLASH_GOLDENS/{tiny,tiny-bf16}/target, default tests/goldens; and the qwen3_moe goldens qwen3moe-tiny(-bf16)
 * with every expert routed, moe_all_experts.h): three sequences of one text decoded three ways
 * (a prefill then one token a step; a prefill, a verified block cropped to a shorter prefix, then the rest; a
 * prefill then blocks of 3 run in the same steps as the first sequence) give, row for row, the taps and logits of
 * the CPU forward over the whole text (target_model_forward), within the bf16 tolerances of test_target_gpu; the
 * hybrid goldens ($DFLASH_GOLDENS/{qwen35-tiny,qwen35moe-tiny}/target: conv histories and delta-rule states carried
 * across steps) and a random hybrid checkpoint with dk = dv = 128 (the tensor-core prefill, the recurrent steps) the
 * same way, held to the bf16 emulation's distance as test_target_gpu does. (3) Crops exactly on
 * the hybrid goldens: steps after a crop give the bits of a fresh sequence that ran the kept tokens
 * (check_crop_exact). (4) CUDA graphs on the dense and qwen3_moe targets: steps replayed from captured graphs give
 * the bits of the same steps launched kernel by kernel (check_graph_exact); the steps of (2) run with graphs on.
 * (1) The fused norm + RoPE + cache append (qk_norm_rope_append_cuda) gives the bits of the two kernels it replaces.
 * Prints "ok <case> ..." / "FAIL <case> ..."; exit status 0 only when every case passed. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#define GPU_TEST_SEED 0x2545f4914f6cdd1dull
#include "cuda_check.h"
#include "gpu_test.h"
#include "kv_attention.h"
#include "gemv.h"
#include "moe_all_experts.h"
#include "qk_norm_rope.h"
#include "rope.h"
#include "target_decode_cuda.h"
#include "target_model.h"
#include "target_model_cuda.h"
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function" /* this test runs hflow_forward and write_hybrid_ckpt only */
#include "tests/gptoss_flow.h"
#include "tests/hybrid_flow.h"
#pragma GCC diagnostic pop
#include "util.h"

#define TOL_NORM_REL 3e-2
#define TOL_MAX_REL 6e-2

/* Hybrid and gpt_oss targets: the bf16 emulation of the CUDA forward (tests/hybrid_flow.h, tests/gptoss_flow.h) of
 * the same text, or NULL. A bf16
 * hybrid forward lands ~0.1 (qwen35-tiny) to ~0.4 (qwen35moe-tiny, routing flips) norm_rel from fp32 after a few
 * layers, and as far under any 1e-6 difference before its roundings (test_target_gpu.c says how this was measured);
 * so a hybrid output is held, as there, to the larger of the plain tolerances and the emulation's own distance from
 * fp32 (x1.5 + 5e-3). What decoding must get exactly right is checked bit for bit by check_crop_exact. */
static const float *bf16_ref;

static void compare(const char *name, const uint16_t *got, const float *ref, size_t n, double tol_norm)
{
    if (!bf16_ref) {
        compare_bf16(name, got, ref, n, tol_norm, TOL_MAX_REL);
        return;
    }
    double se = 0, sr = 0, e = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)bf16_ref[i] - ref[i];
        se += d * d, sr += (double)ref[i] * ref[i];
        e = fmax(e, fabs(d)), mx = fmax(mx, fabs(ref[i]));
    }
    const double en = sr > 0 ? sqrt(se / sr) : sqrt(se), em = e / fmax(1.0, mx);
    char nm[400];
    snprintf(nm, sizeof nm, "%s (bf16 emulation's own error %.3g / %.3g)", name, en, em);
    compare_bf16(nm, got, ref, n, fmax(tol_norm, 1.5 * en + 5e-3), fmax(TOL_MAX_REL, 1.5 * em + 5e-3));
}

#define upload dev_upload

/* (1) qk_norm_rope_append_cuda against qk_norm_rope_cuda then kv_cache_append_cuda: the same q, k rows and cache,
 * bit for bit, on the 4-byte path (a row stride even but not a multiple of 8) and the scalar one (an odd stride).
 * The fused kernel extends the per-row kernels; a stride of a multiple of 8 would send qk_norm_rope_cuda (no cache)
 * to its per-token kernel instead (qk_norm_rope.cu), whose angles (__sincosf) are not bit for bit the rows'. */
static void check_norm_rope_append(void)
{
    const int nseq = 3, max_len = 40, nh = 8, nkv = 2, hd = 64, kd = nkv * hd, T = 5;
    const int32_t seq[5] = {0, 2, 2, 1, 0}, pos[5] = {0, 7, 8, 39, 1};
    const size_t stride = (size_t)max_len * kd, ncache = (size_t)nseq * stride;
    rope_params rp = {.theta = 1e6};
    double inv[32];
    rope_inv_freq(inv, hd, &rp);
    uint16_t *hw = rnd_bf16(2 * (size_t)hd, 1.0, NULL);
    for (int i = 0; i < 2 * hd; i++) hw[i] = f32_to_bf16(1.0f + 0.5f * bf16_to_f32(hw[i]));
    double *d_inv = upload(inv, sizeof inv);
    uint16_t *d_w = upload(hw, 4 * (size_t)hd);
    int32_t *d_seq = upload(seq, sizeof seq), *d_pos = upload(pos, sizeof pos);
    for (int pad = 2; pad >= 1; pad--) {
        const int ld = nh * hd + 2 * kd + pad;
        uint16_t *rows = rnd_bf16((size_t)T * ld, 2.0, NULL), *cache0 = rnd_bf16(2 * ncache, 1.0, NULL);
        uint16_t *d_r[2], *d_c[2];
        for (int i = 0; i < 2; i++) d_r[i] = upload(rows, (size_t)T * ld * 2), d_c[i] = upload(cache0, 4 * ncache);
        qk_norm_rope_cuda(d_r[0], ld, d_r[0] + nh * hd, ld, T, nh, nkv, hd, d_w, d_w + hd, 1e-6f, d_pos, d_inv, NULL);
        kv_cache_append_cuda(d_c[0], d_c[0] + ncache, stride, d_r[0] + nh * hd, ld, d_r[0] + nh * hd + kd, ld, d_seq,
                             d_pos, T, kd, NULL);
        qk_norm_rope_append_cuda(d_r[1], ld, d_r[1] + nh * hd, ld, d_r[1] + nh * hd + kd, ld, T, nh, nkv, hd, d_w,
                                 d_w + hd, 1e-6f, d_pos, d_inv, d_c[1], d_c[1] + ncache, stride, d_seq, NULL);
        uint16_t *r[2], *cc[2];
        for (int i = 0; i < 2; i++) {
            r[i] = xmalloc((size_t)T * ld * 2), cc[i] = xmalloc(4 * ncache);
            CHECK_CUDA(cudaMemcpy(r[i], d_r[i], (size_t)T * ld * 2, cudaMemcpyDeviceToHost));
            CHECK_CUDA(cudaMemcpy(cc[i], d_c[i], 4 * ncache, cudaMemcpyDeviceToHost));
        }
        size_t dr = 0, dc = 0, moved = 0;
        for (size_t i = 0; i < (size_t)T * ld; i++) dr += r[0][i] != r[1][i];
        for (size_t i = 0; i < 2 * ncache; i++) dc += cc[0][i] != cc[1][i], moved += cc[0][i] != cache0[i];
        int ok = !dr && !dc && moved > 0;
        printf("%s qk_norm_rope_append (row stride %d): %zu of %zu q/k/v values and %zu of %zu cache values differ "
               "from norm+rope then append (%zu cache values written)\n", ok ? "ok" : "FAIL", ld, dr, (size_t)T * ld,
               dc, 2 * ncache, moved);
        if (!ok) failures++;
        for (int i = 0; i < 2; i++) {
            CHECK_CUDA(cudaFree(d_r[i]));
            CHECK_CUDA(cudaFree(d_c[i]));
            free(r[i]), free(cc[i]);
        }
        free(rows), free(cache0);
    }
    void *dev[] = {d_inv, d_w, d_seq, d_pos};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CHECK_CUDA(cudaFree(dev[i]));
    free(hw);
}

/* Copy n rows of a device (rows, width) bf16 array to host rows [row0, row0+n) of dst (width). */
static void take_rows(uint16_t *dst, int row0, const uint16_t *d_src, int n, int width)
{
    CHECK_CUDA(cudaMemcpy(dst + (size_t)row0 * width, d_src, (size_t)n * width * 2, cudaMemcpyDeviceToHost));
}

/* (2) one golden target, three decoding schedules of one text against the CPU forward over the whole text. */
static void check_decode(const char *label, const char *dir, int hybrid, int gemv_rows)
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
    target_cuda_set_gemv_rows(gpu, gemv_rows);
    const hf_config *c = target_model_config(cpu);
    const int H = c->hidden_size, V = c->vocab_size, nl = c->num_layers;
    int taps[3] = {0, nl / 2, nl - 1};
    const int W = 3 * H;
    int32_t ids[L], pos[L], cu[2] = {0, L};
    for (int t = 0; t < L; t++) ids[t] = (int32_t)((rnd_uniform() + 1.0) * 0.5 * V) % V, pos[t] = t;
    target_batch b = {.ntok = L, .nseq = 1, .input_ids = ids, .positions = pos, .cu_seqlens = cu};
    float *aux = xmalloc((size_t)L * W * 4), *logits = xmalloc((size_t)L * V * 4), *baux = NULL, *blogits = NULL;
    if (target_model_forward(cpu, &b, taps, 3, aux, NULL, logits, &err)) {
        printf("FAIL %s cpu forward: %s\n", label, err.msg);
        failures++;
        goto out;
    }
    if (hybrid || c->arch == HF_ARCH_GPT_OSS) { /* gpt_oss: its goldens' bf16 flow lands ~2e-2 away (test_target_gpu) */
        baux = xmalloc((size_t)L * W * 4), blogits = xmalloc((size_t)L * V * 4);
        if (hybrid) {
            hflow f = {.bf16 = 1};
            hflow_forward(&f, dir, &b, taps, 3, baux, NULL, blogits);
        } else {
            gflow_forward(1, dir, &b, taps, 3, baux, NULL, blogits);
        }
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
    /* sequence 1: prefill, a block of 16 of which 5 are kept (crop), then the rest in blocks of 20 */
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
            n = L - t < 20 ? L - t : 20; /* steps of more than 16 rows: a dk-128 hybrid's tensor-core delta rule */
            STEP(1, &s1, &n, ids + t);
            if (!rc) take_rows(got_aux[1], t, d_aux, n, W), take_rows(got_logits[1], t, d_logits, n, V);
        }
    }
#undef STEP
    if (rc) {
        printf("FAIL %s decode: %s\n", label, err.msg);
        failures++;
    } else {
        const char *how[NSEQ] = {"prefill+1/step", "prefill+block16 cropped to 5+blocks of 20", "prefill+blocks of 3 beside seq 0"};
        for (int s = 0; s < NSEQ; s++) {
            char name[256];
            const int from = 0;
            snprintf(name, sizeof name, "%s seq%d %s taps rows %d..%d", label, s, how[s], from, L);
            bf16_ref = baux ? baux + (size_t)from * W : NULL;
            compare(name, got_aux[s] + (size_t)from * W, aux + (size_t)from * W, (size_t)(L - from) * W, TOL_NORM_REL);
            snprintf(name, sizeof name, "%s seq%d %s logits rows %d..%d", label, s, how[s], from, L);
            bf16_ref = blogits ? blogits + (size_t)from * V : NULL;
            compare(name, got_logits[s] + (size_t)from * V, logits + (size_t)from * V, (size_t)(L - from) * V,
                    TOL_NORM_REL);
            bf16_ref = NULL;
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
    free(aux), free(logits), free(baux), free(blogits);
    target_cuda_cache_destroy(&cache);
    target_cuda_destroy(&gpu);
    target_model_destroy(&cpu);
}

/* (3) A crop on a hybrid target, exactly: the same steps give the same bits. Sequence 0: prefill P, a verified block of 16 of which 5
 * are kept (crop: on a hybrid target the states go back to before the block and its 5 kept tokens run again), a
 * block cropped to its start (nothing kept: the states before it, no re-run), then a block of 8. Sequence 1, fresh:
 * prefill P, the 5 tokens as one step, then the same block of 8. The block's logits and taps must be identical bit
 * for bit (same kernels on the same shapes from the same states), and so must a block re-run after the crop to its
 * start be to its first run (the dense family keeps the block's key rows as they were computed, in a step of
 * another shape, so there only the tolerances of (2) apply). A crop before the last step's start is refused
 * (nothing changed). */
static void check_crop_exact(const char *label, const char *dir)
{
    errbuf err = {{0}};
    target_cuda *gpu = NULL;
    target_cuda_cache *cache = NULL;
    enum { P = 23, NB = 8 };
    if (target_cuda_load(&gpu, dir, -1, 64, 4, NULL, &err) || target_cuda_cache_create(&cache, gpu, 2, 96, 32, &err)) {
        printf("FAIL %s crop_exact load: %s\n", label, err.msg);
        failures++;
        target_cuda_destroy(&gpu);
        return;
    }
    const hf_config *c = target_cuda_config(gpu);
    const int H = c->hidden_size, V = c->vocab_size, nl = c->num_layers, W = 2 * H;
    int taps[2] = {0, nl - 1};
    int32_t ids[P + 16 + NB], wrong[16];
    for (int t = 0; t < P + 16 + NB; t++) ids[t] = (int32_t)((rnd_uniform() + 1.0) * 0.5 * V) % V;
    for (int i = 0; i < 16; i++) wrong[i] = i < 5 ? ids[P + i] : (ids[P + i] + 7) % V;
    uint16_t *d_aux = NULL, *d_logits = NULL;
    CHECK_CUDA(cudaMalloc((void **)&d_aux, (size_t)32 * W * 2));
    CHECK_CUDA(cudaMalloc((void **)&d_logits, (size_t)32 * V * 2));
    const size_t na = (size_t)NB * W, nlg = (size_t)NB * V;
    uint16_t *a0 = xmalloc(na * 2), *l0 = xmalloc(nlg * 2), *a1 = xmalloc(na * 2), *l1 = xmalloc(nlg * 2);
    uint16_t *r0 = xmalloc((size_t)16 * V * 2), *r1 = xmalloc((size_t)16 * V * 2);
    cudaStream_t st = (cudaStream_t)target_cuda_stream(gpu);
    int rc = 0, s0 = 0, s1 = 1, n;
#define RUN(seq, cnt, idp)                                                                                          \
    do {                                                                                                            \
        n = (cnt);                                                                                                  \
        if (!rc) rc = target_cuda_cache_forward(cache, 1, &(seq), &n, idp, taps, 2, d_aux, W, d_logits, 0, &err);  \
        if (!rc) CHECK_CUDA(cudaStreamSynchronize(st));                                                             \
    } while (0)
    RUN(s0, P, ids);
    RUN(s0, 16, wrong);
    if (!rc) rc = target_cuda_cache_crop(cache, 0, P + 5, &err);
    RUN(s0, 16, wrong + 5); /* a block rejected whole: cropped to its start */
    if (!rc) CHECK_CUDA(cudaMemcpy(r0, d_logits, (size_t)16 * V * 2, cudaMemcpyDeviceToHost));
    if (!rc) rc = target_cuda_cache_crop(cache, 0, P + 5, &err);
    RUN(s0, 16, wrong + 5); /* the same block again from the same states: the same bits */
    if (!rc) CHECK_CUDA(cudaMemcpy(r1, d_logits, (size_t)16 * V * 2, cudaMemcpyDeviceToHost));
    if (!rc) rc = target_cuda_cache_crop(cache, 0, P + 5, &err);
    RUN(s0, NB, ids + P + 5);
    if (!rc) take_rows(a0, 0, d_aux, NB, W), take_rows(l0, 0, d_logits, NB, V);
    RUN(s1, P, ids);
    n = 5; /* as the crop's re-run: no taps, no logits */
    if (!rc) rc = target_cuda_cache_forward(cache, 1, &s1, &n, ids + P, NULL, 0, NULL, 0, NULL, 0, &err);
    RUN(s1, NB, ids + P + 5);
    if (!rc) take_rows(a1, 0, d_aux, NB, W), take_rows(l1, 0, d_logits, NB, V);
#undef RUN
    if (rc) {
        printf("FAIL %s crop_exact: %s\n", label, err.msg);
        failures++;
    } else {
        size_t da = 0, dl = 0, dr = 0;
        for (size_t i = 0; i < na; i++) da += a0[i] != a1[i];
        for (size_t i = 0; i < nlg; i++) dl += l0[i] != l1[i];
        for (size_t i = 0; i < (size_t)16 * V; i++) dr += r0[i] != r1[i];
        int ok = !da && !dl && !dr;
        printf("%s %s crop_exact: after a block cropped to 5 kept and one cropped to its start, a block of %d gives "
               "the taps and logits of a fresh sequence bit for bit (%zu of %zu taps, %zu of %zu logits differ); "
               "a block re-run after a crop to its start: %zu of %d logits differ\n", ok ? "ok" : "FAIL", label, NB,
               da, na, dl, nlg, dr, 16 * V);
        if (!ok) failures++;
        { /* sequence 0 holds P+5+NB, its last step started at P+5: back to P+4 is refused */
            int before = target_cuda_cache_length(cache, 0);
            int r = target_cuda_cache_crop(cache, 0, P + 4, &err);
            int kept = target_cuda_cache_length(cache, 0);
            int ok2 = r == -EINVAL && kept == before && strstr(err.msg, "last step");
            printf("%s %s crop before the last step's start refused, nothing changed (rc=%d, length %d: %s)\n",
                   ok2 ? "ok" : "FAIL", label, r, kept, err.msg);
            if (!ok2) failures++;
        }
    }
    CHECK_CUDA(cudaFree(d_aux));
    CHECK_CUDA(cudaFree(d_logits));
    free(a0), free(l0), free(a1), free(l1), free(r0), free(r1);
    target_cuda_cache_destroy(&cache);
    target_cuda_destroy(&gpu);
}

/* (4) CUDA graphs, exactly: two caches of one model run the same steps, one kernel by kernel (graphs off), one as
 * captured graphs (the default; a shape is captured the second time it is seen). Steps of several shapes: three
 * sequences one token each with taps and every row's logits, a block of 4 of one sequence, two sequences with their
 * last rows' logits only and no taps, and single tokens after a crop. Every step's taps and logits must be the same
 * bits on both, and the graph cache must have replayed steps (a family whose row allows it). */
static void check_graph_exact(const char *label, const char *dir, int gemv_rows)
{
    errbuf err = {{0}};
    target_cuda *gpu = NULL;
    target_cuda_cache *ce = NULL, *cg = NULL;
    enum { P = 10, NSEQ = 3 };
    if (target_cuda_load(&gpu, dir, -1, 64, 4, NULL, &err) ||
        target_cuda_cache_create(&ce, gpu, NSEQ, 96, 32, &err) || target_cuda_cache_create(&cg, gpu, NSEQ, 96, 32, &err)) {
        printf("FAIL %s graph_exact load: %s\n", label, err.msg);
        failures++;
        target_cuda_cache_destroy(&ce);
        target_cuda_destroy(&gpu);
        return;
    }
    target_cuda_cache_set_graphs(ce, 0);
    target_cuda_set_gemv_rows(gpu, gemv_rows);
    const hf_config *c = target_cuda_config(gpu);
    const int H = c->hidden_size, V = c->vocab_size, nl = c->num_layers, W = 2 * H;
    int taps[2] = {0, nl - 1};
    uint16_t *da[2], *dl[2], *ha[2], *hl[2];
    for (int i = 0; i < 2; i++) {
        CHECK_CUDA(cudaMalloc((void **)&da[i], (size_t)32 * W * 2));
        CHECK_CUDA(cudaMalloc((void **)&dl[i], (size_t)32 * V * 2));
        CHECK_CUDA(cudaMemset(da[i], 0, (size_t)32 * W * 2));
        CHECK_CUDA(cudaMemset(dl[i], 0, (size_t)32 * V * 2));
        ha[i] = xmalloc((size_t)32 * W * 2), hl[i] = xmalloc((size_t)32 * V * 2);
    }
    cudaStream_t st = (cudaStream_t)target_cuda_stream(gpu);
    int32_t ids[64];
    for (int i = 0; i < 64; i++) ids[i] = (int32_t)((rnd_uniform() + 1.0) * 0.5 * V) % V;
    int rc = 0, nsteps = 0;
    size_t diff_a = 0, diff_l = 0;
    /* one step on both caches, outputs compared (rows: how many rows of aux / logits it wrote) */
#define BOTH(nrun, seqs, ns, idp, with_taps, last_only, arows, lrows)                                                \
    do {                                                                                                             \
        target_cuda_cache *cc[2] = {ce, cg};                                                                         \
        for (int i = 0; !rc && i < 2; i++) {                                                                         \
            rc = target_cuda_cache_forward(cc[i], nrun, seqs, ns, idp, (with_taps) ? taps : NULL, (with_taps) ? 2 : 0, \
                                           (with_taps) ? da[i] : NULL, W, dl[i], last_only, &err);                   \
            if (!rc) CHECK_CUDA(cudaStreamSynchronize(st));                                                          \
            if (!rc) CHECK_CUDA(cudaMemcpy(ha[i], da[i], (size_t)(arows) * W * 2, cudaMemcpyDeviceToHost));          \
            if (!rc) CHECK_CUDA(cudaMemcpy(hl[i], dl[i], (size_t)(lrows) * V * 2, cudaMemcpyDeviceToHost));          \
        }                                                                                                            \
        if (!rc && (with_taps))                                                                                      \
            for (size_t j = 0; j < (size_t)(arows) * W; j++) diff_a += ha[0][j] != ha[1][j];                         \
        if (!rc)                                                                                                     \
            for (size_t j = 0; j < (size_t)(lrows) * V; j++) diff_l += hl[0][j] != hl[1][j];                         \
        nsteps++;                                                                                                    \
    } while (0)
    int all[NSEQ] = {0, 1, 2}, nP[NSEQ] = {P, P, P}, one[NSEQ] = {1, 1, 1}, four = 4, s0 = 0;
    int32_t pre[NSEQ * P];
    for (int i = 0; i < NSEQ * P; i++) pre[i] = ids[i % 40];
    BOTH(NSEQ, all, nP, pre, 1, 0, NSEQ * P, NSEQ * P); /* packed prefill: never captured */
    for (int t = 0; t < 6; t++) BOTH(NSEQ, all, one, ids + 3 * t, 1, 0, NSEQ, NSEQ);
    for (int t = 0; t < 5; t++) BOTH(1, &s0, &four, ids + 20 + 4 * t, 1, 0, 4, 4);
    for (int t = 0; t < 4; t++) BOTH(2, all + 1, one, ids + 40 + 2 * t, 0, 1, 0, 2);
    if (!rc) rc = target_cuda_cache_crop(ce, 0, target_cuda_cache_length(ce, 0) - 6, &err);
    if (!rc) rc = target_cuda_cache_crop(cg, 0, target_cuda_cache_length(cg, 0) - 6, &err);
    for (int t = 0; t < 4; t++) BOTH(1, &s0, one, ids + 50 + t, 1, 0, 1, 1);
#undef BOTH
    int captured = 0, eager_captured = 0;
    long long replayed = 0, eager_replayed = 0;
    target_cuda_cache_graph_stats(cg, &captured, &replayed);
    target_cuda_cache_graph_stats(ce, &eager_captured, &eager_replayed);
    if (rc) {
        printf("FAIL %s graph_exact: %s\n", label, err.msg);
        failures++;
    } else {
        int ok = !diff_a && !diff_l && captured == 4 && replayed == 15 && !eager_captured && !eager_replayed;
        printf("%s %s graph_exact (%s): %d steps of 5 shapes, graphs off against on: %zu taps and %zu logits "
               "differ; %d graphs captured (4 expected), %lld steps replayed (15 expected; graphs off: %d, %lld)\n",
               ok ? "ok" : "FAIL", label, gemv_rows ? "GEMV for <= 16 rows" : "cuBLASLt", nsteps, diff_a, diff_l,
               captured, replayed, eager_captured, eager_replayed);
        if (!ok) failures++;
    }
    for (int i = 0; i < 2; i++) {
        CHECK_CUDA(cudaFree(da[i]));
        CHECK_CUDA(cudaFree(dl[i]));
        free(ha[i]), free(hl[i]);
    }
    target_cuda_cache_destroy(&ce);
    target_cuda_cache_destroy(&cg);
    target_cuda_destroy(&gpu);
}

int main(void)
{
    CHECK_CUDA(cudaSetDevice(0));
    check_norm_rope_append();
    const char *g = getenv("DFLASH_GOLDENS");
    char dir[1024];
    const char *cases[] = {"tiny", "tiny-bf16", "qwen35-tiny", "qwen35moe-tiny"};
    for (int i = 0; i < 4; i++) {
        snprintf(dir, sizeof dir, "%s/%s/target", g && *g ? g : "tests/goldens", cases[i]);
        check_decode(cases[i], dir, i >= 2, 0);
        if (i >= 2) {
            check_crop_exact(cases[i], dir);
        } else { /* and with the GEMV kernels for the steps' few rows (target_cuda_set_gemv_rows) */
            char label[96];
            snprintf(label, sizeof label, "%s (GEMV)", cases[i]);
            check_decode(label, dir, 0, GEMV_MAX_M);
            check_graph_exact(cases[i], dir, 0);
            check_graph_exact(cases[i], dir, GEMV_MAX_M);
        }
    }
    /* a random hybrid checkpoint with the Qwen3.5 linear-attention heads (dk = dv = 128): its prefills run the
     * tensor-core delta rule from carried states, its steps the recurrent kernel (the goldens' dk 16 runs neither) */
    char tmp[] = "/tmp/dflash_decode_hybrid_XXXXXX";
    const hybrid_spec sp = {.kinds = "lfl", .H = 256, .nh = 4, .nkv = 2, .hd = 64, .HK = 2, .HV = 4, .Dk = 128,
                            .Dv = 128, .Kc = 4, .I = 512, .V = 1024};
    if (!mkdtemp(tmp) || write_hybrid_ckpt(tmp, &sp)) {
        printf("FAIL hybrid-dk128 checkpoint in %s\n", tmp);
        failures++;
    } else {
        check_decode("hybrid-dk128(3 layers)", tmp, 1, 0);
        check_crop_exact("hybrid-dk128(3 layers)", tmp);
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", tmp);
    unlink(path);
    rmdir(tmp);
    /* the qwen3_moe and gpt_oss families (their goldens with every expert routed: a bf16 top-k pick cannot flip;
     * gpt_oss's sliding layers read a window of 6 cached positions) */
    const char *moe_cases[] = {"qwen3moe-tiny", "qwen3moe-tiny-bf16", "gptoss-tiny", "gptoss-mxfp4"};
    for (int i = 0; i < 4; i++) {
        char variant[] = "/tmp/dflash_decode_qwen3moe_XXXXXX", label[96];
        snprintf(dir, sizeof dir, "%s/%s/target", g && *g ? g : "tests/goldens", moe_cases[i]);
        if (moe_all_experts_make(dir, variant)) {
            failures++;
            continue;
        }
        snprintf(label, sizeof label, "%s (every expert routed)", moe_cases[i]);
        check_decode(label, variant, 0, 0);
        check_graph_exact(label, variant, GEMV_MAX_M);
        moe_all_experts_remove(variant);
    }
    printf("%s test_decode_gpu: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}
